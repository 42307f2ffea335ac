"""Batch transform end to end: the local runner against the real server in batch mode.

The server is the real entrypoint (container/serve -> gunicorn -> gevent worker ->
model on the CPU) with SAGEMAKER_BATCH=true, serving build/model (`make model`). The
runner is driven through its command line, as a user runs it. The data is the example
model's own held-out split, so the accuracy the model build reported is the bar.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.server import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "build" / "model"
RUNNER = ROOT / "local_test" / "batch_transform.py"
SERVER_PAYLOAD_MB = 1  # small, so a 413 is cheap to provoke


@pytest.fixture(scope="module")
def server(example_model_dir, tmp_path_factory):
    env = {
        "SAGEMAKER_BATCH": "true",
        "SAGEMAKER_BATCH_STRATEGY": "MULTI_RECORD",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": str(SERVER_PAYLOAD_MB),
        "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "4",
    }
    # Stopped with SIGTERM, as SageMaker stops it.
    with ServerProcess(example_model_dir, env, log_path=tmp_path_factory.mktemp("server") / "server.log") as process:
        yield process.url


@pytest.fixture(scope="module")
def digits():
    metrics = json.loads((MODEL_DIR / "metrics.json").read_text())
    from model.train import load_split  # here: every process that collects would import sklearn

    _, x_test, _, y_test = load_split(metrics["seed"])
    assert len(y_test) == metrics["test_records"]
    return x_test, y_test, metrics["held_out_accuracy"]


def csv_line(row) -> str:
    return ",".join("%g" % v for v in row)


def run(url: str, source: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(RUNNER), str(source), str(out), "--url", url, "--no-progress", *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )


def probabilities(lines: list[str]) -> np.ndarray:
    return np.array([[float(v) for v in line.split(",")] for line in lines])


def write_split_csv(folder: Path, x: np.ndarray, parts: int) -> list[Path]:
    """The split as `parts` CSV files, so the job has several files and mini-batches."""
    folder.mkdir(parents=True)
    paths = []
    for index, chunk in enumerate(np.array_split(x, parts)):
        path = folder / f"part-{index}.csv"
        path.write_text("".join(csv_line(row) + "\n" for row in chunk))
        paths.append(path)
    return paths


def read_outputs(out: Path, sources: list[Path]) -> list[str]:
    lines = []
    for source in sources:
        lines += (out / (source.name + ".out")).read_text().splitlines()
    return lines


def test_the_test_split_through_the_runner_reaches_the_reported_accuracy(server, digits, tmp_path):
    x, y, reported = digits
    sources = write_split_csv(tmp_path / "in", x, parts=3)
    done = run(server, tmp_path / "in", tmp_path / "out", "--content-type", "text/csv", "--accept", "text/csv")
    assert done.returncode == 0, done.stderr
    # The job took the server's execution parameters.
    assert "MULTI_RECORD" in done.stderr and f"MaxPayloadInMB {SERVER_PAYLOAD_MB}" in done.stderr
    assert f"records: {len(y)} " in done.stdout and "failed mini-batches: 0" in done.stdout

    for source in sources:
        inputs = source.read_text().splitlines()
        assert len((tmp_path / "out" / (source.name + ".out")).read_text().splitlines()) == len(inputs)
    probs = probabilities(read_outputs(tmp_path / "out", sources))
    assert probs.shape == (len(y), 10)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-4)
    accuracy = float((probs.argmax(axis=1) == y).mean())
    # Batching may move a float's last bits; at most one near-tie may flip.
    assert accuracy >= reported - 1 / len(y), (accuracy, reported)


def test_single_record_gives_the_same_answers_in_the_same_order(server, digits, tmp_path):
    x, y, _ = digits
    x, y = x[:120], y[:120]
    sources = write_split_csv(tmp_path / "in", x, parts=1)
    multi = run(server, tmp_path / "in", tmp_path / "multi")
    single = run(
        server, tmp_path / "in", tmp_path / "single",
        "--batch-strategy", "SINGLE_RECORD", "--max-concurrent-transforms", "4",
    )
    assert multi.returncode == 0, multi.stderr
    assert single.returncode == 0, single.stderr
    assert "requests: 120 " in single.stdout and "requests: 1 " in multi.stdout
    p_multi = probabilities(read_outputs(tmp_path / "multi", sources))
    p_single = probabilities(read_outputs(tmp_path / "single", sources))
    # Four requests in flight at a time finish in any order; the file keeps input order.
    np.testing.assert_allclose(p_single, p_multi, rtol=1e-4, atol=1e-6)


def test_join_source_input_for_csv(server, digits, tmp_path):
    x, y, reported = digits
    sources = write_split_csv(tmp_path / "in", x, parts=2)
    done = run(server, tmp_path / "in", tmp_path / "out", "--join-source", "Input")
    assert done.returncode == 0, done.stderr
    joined = read_outputs(tmp_path / "out", sources)
    inputs = [line for s in sources for line in s.read_text().splitlines()]
    assert len(joined) == len(inputs) == len(y)
    for line, source_line in zip(joined, inputs):
        columns = line.split(",")
        assert len(columns) == 64 + 10
        assert ",".join(columns[:64]) == source_line  # the input row, untouched
    probs = probabilities([",".join(line.split(",")[64:]) for line in joined])
    assert float((probs.argmax(axis=1) == y).mean()) >= reported - 1 / len(y)


def test_join_source_input_for_json_lines(server, digits, tmp_path):
    x, y, _ = digits
    x, y = x[:60], y[:60]
    lines = []
    for i, row in enumerate(x):
        features = [float(v) for v in row]
        # Objects keep their keys and gain SageMakerOutput; arrays get wrapped.
        lines.append(json.dumps({"id": f"digit-{i}", "features": features} if i % 2 == 0 else features))
    source = tmp_path / "digits.jsonl"
    source.write_text("\n".join(lines) + "\n")
    done = run(
        server, source, tmp_path / "out",
        "--content-type", "application/jsonlines", "--accept", "application/jsonlines",
        "--join-source", "Input",
    )
    assert done.returncode == 0, done.stderr
    out = (tmp_path / "out" / "digits.jsonl.out").read_text().splitlines()
    assert len(out) == len(lines)
    for i, line in enumerate(out):
        record = json.loads(line)
        if i % 2 == 0:
            assert set(record) == {"id", "features", "SageMakerOutput"}
            assert record["id"] == f"digit-{i}" and record["features"] == [float(v) for v in x[i]]
        else:
            assert set(record) == {"SageMakerInput", "SageMakerOutput"}
            assert record["SageMakerInput"] == [float(v) for v in x[i]]
        assert len(record["SageMakerOutput"]) == 10
    predicted = np.array([np.argmax(json.loads(line)["SageMakerOutput"]) for line in out])
    assert (predicted == y).mean() > 0.9


def test_a_bad_record_fails_its_batch_without_retry_and_the_exit_status_says_so(server, digits, tmp_path):
    x, _, _ = digits
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "good.csv").write_text("".join(csv_line(r) + "\n" for r in x[:10]))
    rows = [csv_line(r) for r in x[10:20]]
    rows[4] = rows[4].replace(",", ",oops,", 1)  # a cell that is not a number, and 65 columns
    (folder / "bad.csv").write_text("\n".join(rows) + "\n")
    done = run(server, folder, tmp_path / "out")
    assert done.returncode == 1
    assert "HTTP 400" in done.stderr and "line 5" in done.stderr
    assert "failed mini-batches: 1 (10 records)" in done.stdout
    assert (tmp_path / "out" / "good.csv.out").exists()
    assert not (tmp_path / "out" / "bad.csv.out").exists()


def test_a_payload_over_the_servers_limit_is_refused(server, digits, tmp_path):
    x, _, _ = digits
    rows = "".join(csv_line(r) + "\n" for r in x)
    source = tmp_path / "big.csv"
    copies = SERVER_PAYLOAD_MB * 1024 * 1024 // len(rows) + 2
    source.write_text(rows * copies)  # over the server's 1 MB
    done = run(server, source, tmp_path / "out", "--max-payload-mb", str(SERVER_PAYLOAD_MB + 1))
    assert done.returncode == 1
    assert "413" in done.stderr, done.stderr

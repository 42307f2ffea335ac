"""local_test's clients on a model that is not the example: predict.sh --v2-binary reads
the inputs from GET /v2/models/NAME, and the batch runner's --input-name feeds a CSV's
columns to named inputs. The model has two inputs of two datatypes and three outputs,
one of them FP16 (which only binary can carry); a real gunicorn serves it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.server import ROOT, ServerProcess

PREDICT = ROOT / "local_test" / "predict.sh"
BIG = 2**40 + 1  # an INT64 past FP32's 24 bits of mantissa: lost if it travelled as FP32


class Pair(torch.nn.Module):
    def forward(self, tokens: torch.Tensor, scale: torch.Tensor):
        total = tokens.sum(dim=1, keepdim=True).to(torch.float32) * scale
        return total, tokens * 2, scale.to(torch.float16)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("pair") / "model"
    directory.mkdir()
    torch.jit.save(torch.jit.script(Pair()), str(directory / "model.pt"))
    (directory / "metadata.json").write_text(json.dumps({
        "name": "pair", "max_batch_size": 8,
        "inputs": [{"name": "tokens", "datatype": "INT64", "shape": [4]},
                   {"name": "scale", "datatype": "FP32", "shape": [1]}],
        "outputs": [{"name": "total", "datatype": "FP32", "shape": [1]},
                    {"name": "doubled", "datatype": "INT64", "shape": [4]},
                    {"name": "half", "datatype": "FP16", "shape": [1]}],
    }))
    return directory


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("pair-server") / "server.log"
    with ServerProcess(model_dir, {"SAGEMAKER_BATCH": "true"}, log_path=log) as process:
        yield process


def predict(server, *args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("MODEL_NAME", "MODEL_DIR")}
    return subprocess.run([str(PREDICT), "--v2-binary", *args], env={**environment, "PORT": str(server.port), **env},
                          capture_output=True, text=True, timeout=60)


def write(path: Path, rows) -> Path:
    path.write_text("".join(",".join(str(v) for v in row) + "\n" for row in rows))
    return path


def test_predict_v2_binary_sends_each_input_in_its_own_datatype(server, model_dir, tmp_path):
    tokens = write(tmp_path / "tokens.csv", [[1, 2, 3, 4], [BIG, 0, 0, 0]])
    scale = write(tmp_path / "scale.csv", [[0.5], [2]])
    # The name comes from the served model's metadata.json, as after `make serve MODEL_DIR=...`.
    done = predict(server, f"tokens={tokens}", f"scale={scale}", MODEL_DIR=str(model_dir))
    assert done.returncode == 0, done.stderr
    outputs = {o["name"]: o for o in json.loads(done.stdout)["outputs"]}
    assert outputs["doubled"]["datatype"] == "INT64" and outputs["doubled"]["shape"] == [2, 4]
    assert outputs["doubled"]["data"] == [[2, 4, 6, 8], [2 * BIG, 0, 0, 0]]  # every digit: INT64 in and out
    assert outputs["total"]["data"] == [[5.0], [float(np.float32(BIG)) * 2]]
    assert outputs["half"]["datatype"] == "FP16" and outputs["half"]["data"] == [[0.5], [2.0]]


def test_predict_v2_binary_takes_the_name_from_a_flag_and_says_what_it_lacks(server, tmp_path):
    tokens = write(tmp_path / "tokens.csv", [[1, 1, 1, 1]])
    scale = write(tmp_path / "scale.csv", [[3]])
    done = predict(server, "--model", "pair", f"scale={scale}", f"tokens={tokens}", MODEL_DIR=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert {o["name"]: o["data"] for o in json.loads(done.stdout)["outputs"]}["total"] == [[12.0]]

    wrong = predict(server, "--model", "digits", f"tokens={tokens}", f"scale={scale}")
    assert wrong.returncode == 2 and "serves no model named 'digits'" in wrong.stderr

    one = predict(server, "--model", "pair", str(tokens))
    assert one.returncode == 2 and "inputs are tokens, scale: give one NAME=CSV for each" in one.stderr

    bad = write(tmp_path / "bad.csv", [[1, 2.5, 3, 4]])
    refused = predict(server, "--model", "pair", f"tokens={bad}", f"scale={scale}")
    assert refused.returncode == 2 and "'2.5' is not a INT64 value" in refused.stderr

    misshapen = write(tmp_path / "three.csv", [[1, 2, 3]])
    refused = predict(server, "--model", "pair", f"tokens={misshapen}", f"scale={scale}")
    assert refused.returncode == 2 and "1 rows of 3 values do not fit its shape [-1, 4]" in refused.stderr


def test_predict_v2_binary_on_the_example_model_as_the_readme_shows(example_server):
    done = predict(example_server)  # digits.csv, and the name from build/model/metadata.json
    assert done.returncode == 0, done.stderr
    (output,) = json.loads(done.stdout)["outputs"]
    assert output["name"] == "probabilities" and output["shape"] == [3, 10]
    assert np.argmax(output["data"], axis=1).tolist() == [0, 1, 2]  # the payload's labels


def run_job(server, source: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "local_test.batch_transform", str(source), str(out), "--url",
                           server.url, "--no-progress", *flags], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_runner_feeds_a_csvs_columns_to_named_inputs(server, tmp_path):
    rows = [[i, i + 1, BIG if i == 3 else 0, 1, 0.5 * i] for i in range(1, 7)]
    (tmp_path / "in").mkdir()
    source = write(tmp_path / "in" / "pair.csv", rows)
    done = run_job(server, source.parent, tmp_path / "out", "--input-name", "tokens:4", "--input-name", "scale",
                   "--accept", "application/jsonlines", "--join-source", "Input", "--max-concurrent-transforms", "1")
    assert done.returncode == 0, done.stderr
    assert "CSV columns to the inputs tokens (4), scale as JSON Lines" in done.stderr
    lines = (tmp_path / "out" / "pair.csv.out").read_text().splitlines()
    assert len(lines) == len(rows)
    for line, row, written in zip(lines, rows, source.read_text().splitlines()):
        source_part, answer = line.split(",{", 1) if ",{" in line else (line, "")
        assert source_part == written  # JoinSource=Input: the CSV record as read, then the answer
        record = json.loads("{" + answer)
        assert record["doubled"] == [2 * v for v in row[:4]]
        assert record["total"] == pytest.approx([sum(row[:4]) * row[4]], rel=1e-6)


def test_the_runner_says_what_it_sent_when_the_names_are_not_the_models(server, tmp_path):
    source = write(tmp_path / "pair.csv", [[1, 2, 3, 4, 5]])
    done = run_job(server, source, tmp_path / "out", "--input-name", "tokens:4", "--input-name", "weight",
                   "--max-retries", "0")
    assert done.returncode == 1
    assert "HTTP 400" in done.stderr and "'scale'" in done.stderr  # the server's word on what is missing
    assert "JSON Lines objects of the inputs tokens, weight, as --input-name asks" in done.stderr

    plain = run_job(server, source, tmp_path / "plain", "--max-retries", "0")
    assert plain.returncode == 1 and "several inputs" in plain.stderr  # why the flag exists

"""A model that fails on a later forward pass of a many-pass CSV request.

The answer streams pass by pass (the first lines leave before the last pass runs), so
when pass 2 raises, HTTP 200 and pass 1's lines are gone: the server can only end the
chunked answer without its final chunk. The client sees an incomplete transfer, the
model's message is in the server's log, and the local runner says so in one line
instead of retrying a failure that repeats and printing a bare ChunkedEncodingError.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from tests.helpers.server import ROOT, ServerProcess, copy_model, logged

FAILS_ON_NEGATIVES = '''
import torch


def predict_fn(data, model):
    if (data < 0).any():
        raise ValueError("a negative pixel: this model takes 0..16")
    with torch.inference_mode():
        return model(data)
'''
PASS = 4  # records per forward pass


@pytest.fixture(scope="module")
def server(example_model_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("midway")
    model_dir = copy_model(example_model_dir, base / "model", FAILS_ON_NEGATIVES)
    env = {"SAGEMAKER_BATCH": "true", "SMSERVE_MAX_BATCH_SIZE": str(PASS)}
    with ServerProcess(model_dir, env, log_path=base / "server.log") as process:
        yield process


def body(records: int, bad: int) -> bytes:
    """CSV records of 64 pixels; record number `bad` (1-based) has a negative one."""
    return b"".join(b",".join([b"-1" if i + 1 == bad else b"1"] * 64) + b"\n" for i in range(records))


def test_the_client_gets_the_first_passes_lines_then_an_incomplete_transfer(server):
    response = requests.post(server.url + "/invocations", data=body(10, bad=6), stream=True,
                             headers={"Content-Type": "text/csv", "Accept": "text/csv"})
    assert response.status_code == 200  # sent with the first pass's lines
    received = b""
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        for chunk in response.iter_content(None):
            received += chunk
    assert received.count(b"\n") == PASS
    assert logged(server, "predict_fn failed: ValueError: a negative pixel"), server.log()


def test_the_runner_reports_where_the_answer_ended_and_points_to_the_log(server, tmp_path):
    source = tmp_path / "in" / "pixels.csv"
    source.parent.mkdir()
    source.write_bytes(body(10, bad=7))
    result = subprocess.run(
        [sys.executable, str(ROOT / "local_test" / "batch_transform.py"), str(source.parent), str(tmp_path / "out"),
         "--url", server.url, "--no-progress", "--retry-backoff", "0.05"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 1
    assert f"ended early, after {PASS} of 10 lines" in result.stderr
    assert "model failed part-way through" in result.stderr and "server's log" in result.stderr
    assert "(after 2 attempts)" in result.stderr and "ChunkedEncodingError" not in result.stderr
    assert not (tmp_path / "out" / "pixels.csv.out").exists()


def test_a_failure_on_the_first_pass_is_a_500_with_the_models_message(server):
    """The first pass runs before the status line: nothing has been promised yet."""
    response = requests.post(server.url + "/invocations", data=body(10, bad=2),
                             headers={"Content-Type": "text/csv", "Accept": "text/csv"}, timeout=60)
    assert response.status_code == 500
    assert "a negative pixel" in response.json()["error"]
    assert requests.get(server.url + "/ping", timeout=5).status_code == 200

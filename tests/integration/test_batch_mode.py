"""Batch-transform mode (SAGEMAKER_BATCH=true) against a real gunicorn process."""

from __future__ import annotations

import json

import numpy as np
import pytest
import requests

MB = 1024 * 1024


def csv_body(x: np.ndarray, size: int | None = None) -> bytes:
    """CSV records; with size, the first cell is zero-padded to make exactly that many bytes."""
    rows = [",".join(str(int(v)) for v in row) for row in x]
    body = ("\n".join(rows) + "\n").encode()
    if size is not None:
        pad = size - len(body)
        assert pad >= 0
        first = rows[0].split(",")
        first[0] = "0" * pad + first[0]
        rows[0] = ",".join(first)
        body = ("\n".join(rows) + "\n").encode()
        assert len(body) == size
    return body


@pytest.fixture(scope="module")
def batch_server(example_model_dir, tmp_path_factory):
    from tests.helpers.server import ServerProcess

    env = {"SAGEMAKER_BATCH": "true", "SAGEMAKER_MAX_PAYLOAD_IN_MB": "1", "SAGEMAKER_BATCH_STRATEGY": "MULTI_RECORD"}
    server = ServerProcess(example_model_dir, env, log_path=tmp_path_factory.mktemp("batch") / "server.log")
    with server.start():
        yield server


def test_execution_parameters_follow_the_job(batch_server):
    params = requests.get(batch_server.url + "/execution-parameters").json()
    assert params["BatchStrategy"] == "MULTI_RECORD"
    assert params["MaxPayloadInMB"] == 1
    assert 1 <= params["MaxConcurrentTransforms"] <= 100


def test_multi_record_csv_gives_one_line_per_record_in_order(batch_server, digits):
    x, y = digits
    response = requests.post(batch_server.url + "/invocations", data=csv_body(x),
                             headers={"Content-Type": "text/csv", "Accept": "text/csv"})
    assert response.status_code == 200, response.text
    assert response.text.endswith("\n")
    lines = response.text.split("\n")[:-1]
    assert len(lines) == len(x)
    predicted = np.array([np.argmax([float(v) for v in line.split(",")]) for line in lines])
    assert (predicted == y).mean() >= 0.95


def test_multi_record_jsonlines_with_crlf_and_trailing_blank_lines(batch_server, digits):
    x, y = digits
    body = "".join(json.dumps(row) + "\r\n" for row in x[:300].tolist()) + "\r\n\n"
    response = requests.post(batch_server.url + "/invocations", data=body.encode(),
                             headers={"Content-Type": "application/jsonlines", "Accept": "application/jsonlines"})
    assert response.status_code == 200, response.text
    lines = response.text.split("\n")
    assert lines[-1] == "" and len(lines) - 1 == 300
    predicted = np.array([np.argmax(json.loads(line)) for line in lines[:-1]])
    assert (predicted == y[:300]).mean() >= 0.95


def test_a_record_that_does_not_parse_is_400_naming_its_line(batch_server, digits):
    x, _ = digits
    body = csv_body(x[:10]).split(b"\n")
    body[6] = b"1,2,oops"
    response = requests.post(batch_server.url + "/invocations", data=b"\n".join(body), headers={"Content-Type": "text/csv"})
    assert response.status_code == 400
    assert "line 7" in response.json()["error"]


def test_payload_at_the_limit_succeeds_and_one_byte_over_is_413(batch_server, digits):
    x, _ = digits
    records = np.tile(x, (10, 1))[: MB // 200]
    at_limit = csv_body(records, size=MB)
    response = requests.post(batch_server.url + "/invocations", data=at_limit, headers={"Content-Type": "text/csv"})
    assert response.status_code == 200, response.text[:200]
    assert len(response.text.splitlines()) == len(records)

    over = csv_body(records, size=MB + 1)
    response = requests.post(batch_server.url + "/invocations", data=over, headers={"Content-Type": "text/csv"})
    assert response.status_code == 413
    assert "limit" in response.json()["error"]
    # The server is still serving.
    assert requests.get(batch_server.url + "/ping").status_code == 200


def test_single_record_strategy_is_reported(make_server, example_model_dir):
    server = make_server(example_model_dir, {"SAGEMAKER_BATCH": "true", "SAGEMAKER_BATCH_STRATEGY": "single_record",
                                             "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "4"})
    params = requests.get(server.url + "/execution-parameters").json()
    assert params == {"MaxConcurrentTransforms": 4, "BatchStrategy": "SINGLE_RECORD", "MaxPayloadInMB": 6}


@pytest.mark.parametrize("accept", [None, "*/*"])
def test_without_an_accept_batch_answers_in_the_request_line_format(batch_server, digits, accept):
    x, _ = digits
    headers = {"Content-Type": "text/csv"} | ({"Accept": accept} if accept else {})
    response = requests.post(batch_server.url + "/invocations", data=csv_body(x[:5]), headers=headers)
    assert response.headers["Content-Type"] == "text/csv"
    assert len(response.text.split("\n")) == 6
    body = "".join(json.dumps(row) + "\n" for row in x[:5].tolist())
    response = requests.post(batch_server.url + "/invocations", data=body,
                             headers={"Content-Type": "application/jsonlines"})
    assert response.headers["Content-Type"] == "application/jsonlines"
    assert len(response.text.split("\n")) == 6


def test_chunked_body_over_the_limit_is_413_not_truncated(batch_server, digits):
    x, _ = digits
    body = csv_body(np.tile(x, (10, 1))[: MB // 200], size=MB + 1)
    response = requests.post(batch_server.url + "/invocations", data=(body[i:i + 65536] for i in range(0, len(body), 65536)),
                             headers={"Content-Type": "text/csv"})
    assert response.status_code == 413
    exact = csv_body(np.tile(x, (10, 1))[: MB // 200], size=MB)
    response = requests.post(batch_server.url + "/invocations", data=(exact[i:i + 65536] for i in range(0, len(exact), 65536)),
                             headers={"Content-Type": "text/csv"})
    assert response.status_code == 200


def test_execution_parameters_stay_within_sagemakers_100_mb_budget(make_server, example_model_dir):
    server = make_server(example_model_dir, {"SAGEMAKER_BATCH": "true", "SAGEMAKER_MAX_PAYLOAD_IN_MB": "50",
                                             "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "10"})
    params = requests.get(server.url + "/execution-parameters").json()
    assert params["MaxPayloadInMB"] == 50
    assert params["MaxConcurrentTransforms"] * params["MaxPayloadInMB"] <= 100

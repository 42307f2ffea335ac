"""A batch job that sets MaxPayloadInMB=0 and MaxConcurrentTransforms=0.

CreateTransformJob takes both: MaxPayloadInMB=0 is for payloads that "might be
arbitrarily large and [are] transmitted using HTTP chunked encoding", and
MaxConcurrentTransforms=0 is "left unset". SageMaker passes the job's values on as
SAGEMAKER_MAX_PAYLOAD_IN_MB and SAGEMAKER_MAX_CONCURRENT_TRANSFORMS; the server must
start, take bodies past the 6 MB default, and still refuse one past its own limit
(SMSERVE_MAX_REQUEST_MB) with a 413 that names it.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import requests

from tests.helpers.server import ROOT, ServerProcess

MB = 1024 * 1024
OWN_LIMIT_MB = 7  # past SageMaker's 6 MB default, so a body between the two shows which applies


@pytest.fixture(scope="module")
def server(example_model_dir, tmp_path_factory):
    env = {
        "SAGEMAKER_BATCH": "true",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": "0",
        "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "0",
        "SMSERVE_MAX_REQUEST_MB": str(OWN_LIMIT_MB),
    }
    with ServerProcess(example_model_dir, env, log_path=tmp_path_factory.mktemp("nolimit") / "server.log") as process:
        yield process


def csv_of_size(x: np.ndarray, size: int) -> tuple[bytes, int]:
    """Whole CSV records of the digits, repeated to about `size` bytes: (body, records)."""
    line = [",".join(str(int(v)) for v in row).encode() + b"\n" for row in x]
    body, records = bytearray(), 0
    while len(body) + len(line[records % len(line)]) <= size:
        body += line[records % len(line)]
        records += 1
    return bytes(body), records


def test_execution_parameters_report_the_jobs_0_and_a_derived_concurrency(server):
    params = requests.get(server.url + "/execution-parameters").json()
    assert params == {"MaxConcurrentTransforms": 2, "BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": 0}


def test_a_body_past_6_mb_within_the_servers_own_limit_is_answered(server, digits):
    body, records = csv_of_size(digits[0], int(6.5 * MB))
    response = requests.post(server.url + "/invocations", data=body, headers={"Content-Type": "text/csv"})
    assert response.status_code == 200, response.text[:300]
    assert response.text.count("\n") == records


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_past_the_servers_own_limit_is_413_naming_it(server, digits, chunked):
    body, _ = csv_of_size(digits[0], OWN_LIMIT_MB * MB + 1000)
    data = (body[i:i + 65536] for i in range(0, len(body), 65536)) if chunked else body
    response = requests.post(server.url + "/invocations", data=data, headers={"Content-Type": "text/csv"})
    assert response.status_code == 413
    error = response.json()["error"]
    assert f"SMSERVE_MAX_REQUEST_MB={OWN_LIMIT_MB}" in error and "SAGEMAKER_MAX_PAYLOAD_IN_MB=0" in error


def test_the_local_runner_takes_the_0_as_no_limit(server, digits, tmp_path):
    x = digits[0]
    source = tmp_path / "in" / "digits.csv"
    source.parent.mkdir()
    source.write_text("".join(",".join(str(int(v)) for v in row) + "\n" for row in x))
    result = subprocess.run(
        [sys.executable, str(ROOT / "local_test" / "batch_transform.py"), str(source.parent), str(tmp_path / "out"),
         "--url", server.url, "--no-progress"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "MaxPayloadInMB 0" in result.stderr and "requests: 1 " in result.stdout  # the file in one request
    assert len((tmp_path / "out" / "digits.csv.out").read_text().splitlines()) == len(x)

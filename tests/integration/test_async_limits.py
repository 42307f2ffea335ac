"""Asynchronous inference's sizes on the real server: a 200 MB .npy body.

InvokeEndpointAsync takes bodies up to 1 GB and lets a request run up to an hour; the
container then has to allow both. docs/deploy.md names the settings: the body limit
SMSERVE_MAX_REQUEST_MB (default 100) and SAGEMAKER_MODEL_SERVER_TIMEOUT (default 60 s).
This runs the example digits model on 200 MB of pixels (819,200 rows of 64 float32)
with the limits raised, and checks that without them the same body is refused with 413
rather than half-read.
"""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
import requests

from tests.helpers.server import ServerProcess

pytestmark = pytest.mark.slow

ROWS = 200 * 1024 * 1024 // (64 * 4)  # 819,200 rows of 64 FP32 pixels: 200 MiB of data


@pytest.fixture(scope="module")
def body() -> bytes:
    rng = np.random.default_rng(7)
    pixels = rng.integers(0, 17, size=(ROWS, 64)).astype("<f4")
    buffer = io.BytesIO()
    np.save(buffer, pixels, allow_pickle=False)
    return buffer.getvalue()


def test_a_200_mb_npy_request_succeeds_with_the_limits_raised(example_model_dir, tmp_path, body):
    env = {"SMSERVE_MAX_REQUEST_MB": "256", "SAGEMAKER_MODEL_SERVER_TIMEOUT": "3600"}
    with ServerProcess(example_model_dir, env=env, log_path=tmp_path / "server.log") as server:
        started = time.monotonic()
        answer = requests.post(f"{server.url}/invocations", data=body,
                               headers={"Content-Type": "application/x-npy", "Accept": "application/x-npy"}, timeout=900)
        seconds = time.monotonic() - started
        assert answer.status_code == 200, f"{answer.status_code}: {answer.text[:300]}\n{server.log()[-2000:]}"
        assert answer.headers["Content-Type"] == "application/x-npy"
        probabilities = np.load(io.BytesIO(answer.content), allow_pickle=False)
        assert probabilities.shape == (ROWS, 10) and probabilities.dtype == np.float32
        assert np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-4)  # a real forward pass on every row
        print(f"200 MiB npy request ({len(body)} bytes): {seconds:.1f} s")
        # The worker is still healthy afterwards.
        assert requests.get(f"{server.url}/ping", timeout=5).status_code == 200


def test_without_raised_limits_the_same_body_is_413(example_model_dir, tmp_path, body):
    with ServerProcess(example_model_dir, log_path=tmp_path / "server.log") as server:
        answer = requests.post(f"{server.url}/invocations", data=body, headers={"Content-Type": "application/x-npy"}, timeout=300)
        assert answer.status_code == 413, answer.text[:300]
        # The message names the variable that raises the limit.
        assert answer.json() == {"error": f"request body of {len(body)} bytes exceeds the payload limit of "
                                          f"{100 * 1024 * 1024} bytes (SMSERVE_MAX_REQUEST_MB=100)"}

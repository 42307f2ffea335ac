"""SMSERVE_AUTOCAST and SMSERVE_COMPILE through a real server, on the CPU: bf16 and fp16
autocast run on CPUs too, and torch.compile's inductor needs only a C compiler (this
machine has one; the test without one stands in for the slim image, which has none)."""

from __future__ import annotations

import io
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import torch

from tests.helpers.client import npy
from tests.helpers.server import ServerProcess, logged
from smserve.engine.worker import loaded_model as model_module

NPY = "application/x-npy"


@pytest.fixture(scope="module")
def pixels_and_answers(example_model_dir, digits):
    """64 held-out digits and the example model's own fp32 answers."""
    x = digits[0][:64].astype(np.float32)
    exact = model_module.load(str(example_model_dir), torch.device("cpu")).predict({"pixels": x})["probabilities"]
    return x, exact


def ask_npy(server, x: np.ndarray) -> np.ndarray:
    response = requests.post(server.url + "/invocations", data=npy(x),
                             headers={"Content-Type": NPY, "Accept": NPY}, timeout=120)
    assert response.status_code == 200, response.text
    return np.load(io.BytesIO(response.content), allow_pickle=False)


def ask_v2(server, x: np.ndarray) -> dict:
    body = {"inputs": [{"name": "pixels", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    response = requests.post(server.url + "/v2/models/digits/infer", data=json.dumps(body),
                             headers={"Content-Type": "application/json"}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["outputs"][0]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_autocast_answers_fp32_close_to_the_fp32_model(make_server, example_model_dir, pixels_and_answers, precision):
    x, exact = pixels_and_answers
    server = make_server(example_model_dir, {"SMSERVE_AUTOCAST": precision, "SMSERVE_MAX_BATCH_DELAY_MS": "20"})
    answer = ask_npy(server, x)
    assert answer.dtype == np.float32 and answer.shape == exact.shape
    np.testing.assert_allclose(answer, exact, atol=0.02)
    assert not np.array_equal(answer, exact)  # the pass ran in half precision
    assert (answer.argmax(1) == exact.argmax(1)).mean() > 0.95
    v2 = ask_v2(server, x[:3])
    assert v2["datatype"] == "FP32"
    np.testing.assert_allclose(np.array(v2["data"]).reshape(3, 10), exact[:3], atol=0.02)
    # Requests that share a pass (batched) are split back right under autocast too.
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: ask_npy(server, x[i * 8:(i + 1) * 8]), range(8)))
    np.testing.assert_allclose(np.concatenate(answers), exact, atol=0.02)
    assert logged(server, f"autocast {precision}, compile off"), server.log()


@pytest.fixture
def slow_server(tmp_path):
    """A server whose start may include a compile: no deadline short of 10 minutes."""
    started = []

    def make(model_dir, env):
        server = ServerProcess(model_dir, env, log_path=tmp_path / f"server-{len(started)}.log")
        started.append(server)
        return server.start(timeout=600)

    yield make
    for server in started:
        server.terminate()


def test_compile_serves_the_model_compiled(slow_server, example_model_dir, pixels_and_answers, tmp_path):
    """This machine has a C++ compiler and Python's headers (as CI's has), so the model
    compiles: neither "ignored" (a worker where compiling would hang) nor "failed"."""
    x, exact = pixels_and_answers
    server = slow_server(example_model_dir, {"SMSERVE_COMPILE": "default",
                                             "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    # The worker writes its lines from a thread of its own: /ping may say ready first.
    assert logged(server, "autocast off, compile default"), server.log()
    log = server.log()
    assert "uncompiled" not in log, log
    np.testing.assert_allclose(ask_npy(server, x), exact, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ask_npy(server, x[:7]), exact[:7], rtol=1e-4, atol=1e-6)


def test_without_a_c_compiler_the_model_serves_uncompiled(slow_server, example_model_dir, pixels_and_answers, tmp_path):
    x, exact = pixels_and_answers
    server = slow_server(example_model_dir, {"SMSERVE_COMPILE": "max-autotune", "CXX": "/bin/false",
                                             "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert logged(server, "serving the model uncompiled"), server.log()
    log = server.log()
    assert "SMSERVE_COMPILE=max-autotune" in log, log
    assert "compile failed" in log or "compile off" in log
    if "compile failed" in log:
        assert "No working C++ compiler" in log
    assert requests.get(server.url + "/ping", timeout=10).status_code == 200
    np.testing.assert_allclose(ask_npy(server, x), exact, rtol=1e-6)

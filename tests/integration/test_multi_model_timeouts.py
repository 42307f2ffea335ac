"""Multi-model loads and unloads that outlast SAGEMAKER_MODEL_SERVER_TIMEOUT, and an
unload during a load, in a real gunicorn with 2 workers: a timed-out DELETE finishes
when the workers let go and may be retried, a DELETE's 200 means no worker serves the
model (a load under way included), and a load longer than the timeout loads (once per
worker, a retried POST joining it)."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.helpers.server import ServerProcess, wait_until
from tests.helpers.models import STREAMING_HOOKS, model_dir_with

TIMEOUT_S = 5  # SAGEMAKER_MODEL_SERVER_TIMEOUT here: the DELETE's and the invocations' deadline
WORKERS = 2

# model_fn appends its pid to `starts` and `ends` around a sleep of `load_s` (a file in
# the model's folder) seconds: the test sees which loads ran, and when they ended.
SLOW_LOAD = '''
import json
import os
import time

import numpy as np


def _mark(model_dir, name):
    with open(os.path.join(model_dir, name), "a") as f:
        f.write("%d\\n" % os.getpid())


def model_fn(model_dir):
    _mark(model_dir, "starts")
    with open(os.path.join(model_dir, "load_s")) as f:
        time.sleep(float(f.read()))
    _mark(model_dir, "ends")
    return "slow"


def input_fn(body, content_type):
    return json.loads(body)


def predict_fn(data, model):
    return np.asarray(data["x"], dtype=np.float32)
'''


def slow_model(root: Path, name: str, load_s: float) -> Path:
    folder = model_dir_with(root, SLOW_LOAD, name)
    (folder / "load_s").write_text(str(load_s))
    return folder


def marks(folder: Path, name: str) -> int:
    path = folder / name
    return len(path.read_text().split()) if path.exists() else 0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mme-timeouts")
    model_dir_with(root, STREAMING_HOOKS, "stream")
    env = {"SAGEMAKER_MULTI_MODEL": "true", "SAGEMAKER_MODEL_SERVER_WORKERS": str(WORKERS),
           "SMSERVE_MODELS_ROOT": str(root), "SAGEMAKER_MODEL_SERVER_TIMEOUT": str(TIMEOUT_S)}
    process = ServerProcess(root / "none", env, log_path=root / "server.log").start()
    process.root = root
    yield process
    process.terminate()


def load(server, name, folder):
    return requests.post(server.url + "/models", json={"model_name": name, "url": str(folder)}, timeout=120)


def delete(server, name):
    return requests.delete(f"{server.url}/models/{name}", timeout=120)


def invoke(server, name):
    with requests.Session() as s:  # a new connection each time: either worker may take it
        return s.post(f"{server.url}/models/{name}/invoke", json={"x": [1.0]}, timeout=30)


def test_an_unload_that_times_out_finishes_when_the_stream_ends_and_may_be_retried(server):
    folder = server.root / "stream"
    assert load(server, "stream", folder).status_code == 200
    # One stream outlasting the DELETE's deadline: 16 records, 0.5 s apart.
    body = {"n": 16, "pause": 0.5, "id": "long"}
    started = threading.Event()
    records = []

    def stream():
        with requests.post(f"{server.url}/models/stream/invoke", json=body, stream=True, timeout=60) as r:
            for line in r.iter_lines():
                started.set()
                records.append(line)

    reader = threading.Thread(target=stream)
    reader.start()
    try:
        assert started.wait(30)
        first = delete(server, "stream")
        assert first.status_code == 503 and "error" in first.json(), first.text
        # Retried: it waits for the stream, as the first did, and answers once no worker holds the model.
        second = delete(server, "stream")
        assert second.status_code == 200, second.text
    finally:
        reader.join(60)
    assert len(records) == 16
    assert requests.get(server.url + "/models/stream").status_code == 404
    assert delete(server, "stream").status_code == 404
    # The name is free: loaded again, served.
    assert load(server, "stream", folder).status_code == 200
    r = requests.post(f"{server.url}/models/stream/invoke", json={"n": 2}, timeout=30)
    assert r.status_code == 200
    assert delete(server, "stream").status_code == 200


def test_an_unload_during_a_load_leaves_no_worker_serving_it(server):
    folder = slow_model(server.root, "doomed", load_s=3)
    with ThreadPoolExecutor(1) as pool:
        loading = pool.submit(load, server, "doomed", folder)
        assert wait_until(lambda: marks(folder, "starts") >= 1, timeout=60)
        r = delete(server, "doomed")
        assert r.status_code == 200, r.text
        # The 200 came once every load under way had ended, and none took the model into service.
        assert marks(folder, "ends") == marks(folder, "starts") >= 1
        assert "multi-model: 'doomed' loaded" not in server.log()
        # From the 200 on, never served: through the ends of both workers' loads, and after
        # (four callers at once, so that a moment either worker serves it is seen).
        def calls() -> list[int]:
            codes = []
            while marks(folder, "ends") < marks(folder, "starts") or len(codes) < 20:
                codes.append(invoke(server, "doomed").status_code)
            return codes

        with ThreadPoolExecutor(4) as callers:
            seen = [code for codes in callers.map(lambda _: calls(), range(4)) for code in codes]
        assert set(seen) == {404}, sorted(set(seen))
        assert loading.result().status_code == 409
    assert requests.get(server.url + "/models/doomed").status_code == 404


def test_a_load_longer_than_the_timeout_loads_once_per_worker_and_a_retry_joins_it(server):
    folder = slow_model(server.root, "slow", load_s=TIMEOUT_S + 2)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(load, server, "slow", folder)
        assert wait_until(lambda: marks(folder, "starts") >= 1, timeout=60)
        retry = pool.submit(load, server, "slow", folder)
        assert first.result().status_code == 200, first.result().text
        assert retry.result().status_code == 200, retry.result().text
    assert marks(folder, "starts") == WORKERS
    assert [invoke(server, "slow").json() for _ in range(4)] == [[1.0]] * 4
    # Loaded: a POST of it now is the contract's 409.
    assert load(server, "slow", folder).status_code == 409
    assert delete(server, "slow").status_code == 200
    assert json.loads(requests.get(server.url + "/models").text)["models"] == []

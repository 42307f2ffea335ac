"""Logging from hook threads, the inference thread and the event loop at once: gevent's
monkey-patching gives logging gevent locks, which lose wake-ups between OS threads
(a request then never answered). Real gunicorn servers."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.helpers.server import ServerProcess
from tests.helpers.models import model_dir_with

# input_fn logs an INFO line, or raises ImportError (a 500 logged with its traceback,
# on the hook thread); a body that is not JSON is a 400 logged on the loop.
LOGGING_HOOKS = '''
import json
import logging

import numpy as np

log = logging.getLogger("model.script")


def model_fn(model_dir):
    log.info("model loaded")
    return "logging"


def input_fn(body, content_type):
    data = json.loads(body)
    if data.get("fail"):
        raise ImportError("no module named missing_module")
    log.info("input_fn got %d values", len(data["x"]))
    return data


def predict_fn(data, model):
    return np.asarray(data["x"], dtype=np.float32)
'''

BODIES = {"logs": b'{"x": [1.0, 2.0]}', "fails": b'{"x": [1.0], "fail": true}', "malformed": b'{"x": [1.0,'}
STATUS = {"logs": 200, "fails": 500, "malformed": 400}
# The adversary's mix: 3 clients whose input_fn logs, 2 whose input_fn fails, 5 malformed.
CLIENTS = ["logs"] * 3 + ["fails"] * 2 + ["malformed"] * 5
REQUESTS_EACH = 150


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return model_dir_with(tmp_path_factory.mktemp("thread-logging"), LOGGING_HOOKS, "logging")


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_logging_from_threads_and_the_loop_answers_every_request(model, tmp_path, log_format):
    env = {"SAGEMAKER_MODEL_SERVER_WORKERS": "1", "SMSERVE_HOOK_THREADS": "2", "SMSERVE_LOG_FORMAT": log_format}
    server = ServerProcess(model, env, log_path=tmp_path / "log").start()
    stop = threading.Event()
    failures: list[str] = []

    def client(kind: str) -> int:
        answered = 0
        with requests.Session() as session:
            for _ in range(REQUESTS_EACH):
                if stop.is_set():
                    break
                try:
                    answer = session.post(server.url + "/invocations", data=BODIES[kind], timeout=10,
                                          headers={"Content-Type": "application/json"})
                except requests.RequestException as e:
                    failures.append(f"{kind}: {e!r}")
                    stop.set()  # one hung request is the finding: the others need not wait too
                    break
                assert answer.status_code == STATUS[kind], answer.text
                answered += 1
        return answered

    try:
        with ThreadPoolExecutor(len(CLIENTS)) as pool:
            answered = sum(pool.map(client, CLIENTS))
        assert failures == [], f"{failures[:3]}\n{server.log()[-2000:]}"
        assert answered == len(CLIENTS) * REQUESTS_EACH
    finally:
        assert server.terminate(timeout=30) == 0, server.log()[-2000:]
    log = server.log()
    assert log.count("input_fn got 2 values") == 3 * REQUESTS_EACH
    assert log.count("input_fn failed: ImportError") == 2 * REQUESTS_EACH
    assert log.count("raise ImportError(") == 2 * REQUESTS_EACH  # each with its traceback

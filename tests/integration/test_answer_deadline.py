"""The answer's deadline (SAGEMAKER_MODEL_SERVER_TIMEOUT) on a real gunicorn: a request
answered 504 costs no forward pass of its own afterwards, so the requests that follow a
burst are answered at once, and /v2 infer is held to the same deadline as /invocations."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.helpers.server import ServerProcess, passes_and_records, pending_requests, wait_until, worker_pids
from tests.helpers.models import model_dir_with

# Each record's one value is how many seconds its pass sleeps (on the inference thread).
SLEEPING_HOOKS = '''
import time


def model_fn(model_dir):
    return "sleeper"


def predict_fn(data, model):
    time.sleep(float(data[0][0]))
    return data
'''
METADATA = {"name": "sleeper", "max_batch_size": 1,
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}]}
BURST = 8
PASS_S = 0.6  # BURST of them queue far past the 1 s deadline


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    parent = tmp_path_factory.mktemp("deadline")
    folder = model_dir_with(parent, SLEEPING_HOOKS, "sleeper")
    (folder / "metadata.json").write_text(json.dumps(METADATA))
    env = {"SAGEMAKER_MODEL_SERVER_TIMEOUT": "1", "SAGEMAKER_MODEL_SERVER_WORKERS": "1",
           "SMSERVE_MAX_BATCH_SIZE": "1"}
    with ServerProcess(folder, env, log_path=parent / "server.log") as s:
        yield s


def invoke(server, seconds: float) -> requests.Response:
    return requests.post(server.url + "/invocations", json={"instances": [[seconds]]}, timeout=30)


def infer_v2(server, seconds: float) -> requests.Response:
    body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [seconds]}]}
    return requests.post(server.url + "/v2/models/sleeper/infer", json=body, timeout=30)


def test_after_a_burst_past_the_deadline_the_next_request_is_answered_at_once(server):
    pids = worker_pids(server)
    passes_before, _ = passes_and_records(server, "sleeper")
    with ThreadPoolExecutor(BURST) as pool:
        burst = list(pool.map(lambda _: invoke(server, PASS_S), range(BURST)))
    late = [r for r in burst if r.status_code == 504]
    assert len(late) >= BURST // 2, [r.status_code for r in burst]
    assert all("SAGEMAKER_MODEL_SERVER_TIMEOUT" in r.json()["error"] for r in late)
    # Behind the late requests' passes it would wait seconds more than its deadline.
    lone = invoke(server, 0)
    assert lone.status_code == 200 and lone.json() == {"predictions": [[0.0]]}, lone.text
    assert wait_until(lambda: pending_requests(server) == 0)  # the gauge counts what is queued: nothing
    passes, _ = passes_and_records(server, "sleeper")
    # A pass for each answered request and the lone one; of the late, only those whose
    # pass began before their deadline: one when the burst arrives at once, a few more
    # when a loaded machine staggers the client's threads by a pass or more. Had the
    # queued ones run too, every late request would have had a pass.
    late_passes = passes - passes_before - (BURST - len(late)) - 1
    assert late_passes <= len(late) // 2, (late_passes, len(late))
    assert worker_pids(server) == pids


def test_v2_infer_is_answered_504_past_the_deadline_as_invocations_is(server):
    late = infer_v2(server, 1.5)
    assert late.status_code == 504, late.text
    assert "did not answer within 1 s" in late.json()["error"]
    after = infer_v2(server, 0)
    assert after.status_code == 200 and after.json()["outputs"][0]["data"] == [0.0], after.text

"""Scripts written for AWS's PyTorch containers ship no metadata.json; the containers'
SAGEMAKER_TS_BATCH_SIZE and SAGEMAKER_TS_MAX_BATCH_DELAY (100000, as an AWS notebook
sets it: clamped, never refused) batch their requests here, through a real gunicorn:
concurrent requests share passes and each answer equals its unbatched one, for a script
without predict_fn, one whose predict_fn answers a tensor and one that answers a list.
A predict_fn that cannot be batched is found out, said in the log, and answered right;
one that reads the context keeps batching off, and the start log says why."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import torch

from tests.helpers.lazy_servers import LazyServers
from tests.helpers.server import ServerProcess, passes_and_records, logged
from tests.helpers.models import model_dir_with

JSON = "application/json"
DLC = {"SAGEMAKER_TS_BATCH_SIZE": "8", "SAGEMAKER_TS_MAX_BATCH_DELAY": "100000"}

HOOKS = '''
import json

import torch


def model_fn(model_dir):
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3).eval()


def input_fn(body, content_type):
    return torch.tensor(json.loads(body), dtype=torch.float32)


def output_fn(prediction, accept):
    if isinstance(prediction, torch.Tensor):
        prediction = prediction.tolist()
    return json.dumps(prediction), accept
'''
PREDICT_FNS = {
    "no_predict_fn": "",
    "tensor": "def predict_fn(data, model):\n    with torch.no_grad():\n        return model(data)\n",
    "listed": "def predict_fn(data, model):\n    with torch.no_grad():\n        return [row.tolist() for row in model(data)]\n",
    # Normalises over dimension 0 as if it held one request's records only.
    "unbatchable": "def predict_fn(data, model):\n    with torch.no_grad():\n        return torch.softmax(model(data), dim=0)\n",
    "context": "def predict_fn(data, model, context):\n    with torch.no_grad():\n        return model(data)\n",
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """servers[name]: the server of that script, started the first time a test asks for
    it (under xdist a process starts only those its tests use, not all five)."""
    root = tmp_path_factory.mktemp("dlc")
    servers = LazyServers({name: lambda name=name, predict_fn=predict_fn: ServerProcess(
        model_dir_with(root, HOOKS + "\n\n" + predict_fn, name), DLC, log_path=root / f"{name}.log").start()
        for name, predict_fn in PREDICT_FNS.items()})
    yield servers
    servers.stop()


def unbatched(name: str, rows: list) -> list:
    """The script's answer to one request run alone, here in the test's process."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).eval()
    with torch.no_grad():
        out = model(torch.tensor(rows, dtype=torch.float32))
    return torch.softmax(out, dim=0).tolist() if name == "unbatchable" else out.tolist()


def bodies(count: int) -> list[list]:
    rng = np.random.default_rng(7)
    return [rng.standard_normal((1 + i % 3, 4)).round(3).tolist() for i in range(count)]


def together(server: ServerProcess, requests_rows: list[list]) -> list[requests.Response]:
    barrier = threading.Barrier(len(requests_rows))

    def send(rows):
        barrier.wait()
        return requests.post(server.url + "/invocations", data=json.dumps(rows), timeout=60,
                             headers={"Content-Type": JSON, "Accept": JSON})

    with ThreadPoolExecutor(len(requests_rows)) as pool:
        return list(pool.map(send, requests_rows))


def assert_unbatched_answers(name, sent, answers):
    for rows, answer in zip(sent, answers):
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(answer.json(), unbatched(name, rows), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["no_predict_fn", "tensor", "listed"])
def test_concurrent_requests_share_passes_and_get_their_unbatched_answers(servers, name):
    server = servers[name]
    assert logged(server, "batching: on, on trial: up to 8 records a pass (SAGEMAKER_TS_BATCH_SIZE"), server.log()
    assert ("SAGEMAKER_TS_MAX_BATCH_DELAY=100000 sets SMSERVE_MAX_BATCH_DELAY_MS's setting (max_batch_delay_ms): "
            "above 1000: taken as 1000") in server.log()
    sent = bodies(16)
    before = passes_and_records(server, "model")
    answers = together(server, sent)
    after = passes_and_records(server, "model")
    assert_unbatched_answers(name, sent, answers)
    passes, records = after[0] - before[0], after[1] - before[1]
    # The trial pass's last request runs a second time alone: one pass more at most.
    assert records >= sum(len(rows) for rows in sent) and passes < len(sent), (passes, records)
    assert "batching off:" not in server.log()


def test_a_predict_fn_that_cannot_be_batched_is_said_and_answered_as_alone(servers):
    server = servers["unbatchable"]
    sent = bodies(16)
    assert_unbatched_answers("unbatchable", sent, together(server, sent))
    assert logged(server, "batching off: a request's answer in a pass of"), server.log()
    before = passes_and_records(server, "model")
    again = together(server, sent)
    after = passes_and_records(server, "model")
    assert_unbatched_answers("unbatchable", sent, again)
    assert after[0] - before[0] == len(sent)  # each request its own pass from then on


def test_a_predict_fn_that_reads_the_context_keeps_batching_off_and_says_why(servers):
    server = servers["context"]
    assert logged(server, "batching: off: predict_fn takes the request's context"), server.log()
    sent = bodies(8)
    assert_unbatched_answers("context", sent, together(server, sent))

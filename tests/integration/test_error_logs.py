"""What the log says when a request fails, in a real gunicorn: a 400 from input_fn
leaves no traceback, a model's 500 exactly one (the code that raised), never gevent's
"<ThreadPoolWorker> failed with" print, and with SMSERVE_LOG_FORMAT=json every line is
one JSON object, the traceback in its `exception` field. Also what the start says (the
hooks found) and how a model that cannot load ends a local run."""

from __future__ import annotations

import json

import pytest
import requests
import torch

from tests.helpers.server import ServerProcess, log_lines, wait_until

TRACEBACK = "Traceback (most recent call last)"


class Picky(torch.nn.Module):
    """Doubles its input; a negative value fails the forward pass."""

    def forward(self, x):
        if bool((x < 0).any()):
            raise RuntimeError("negative input")
        return x * 2


# input_fn alone: JSON bodies go through the hooks (input_fn, then the built-in
# forward pass); KServe v2 bodies do not use input_fn and go through the batcher.
HOOKS = '''
import json

import torch


def input_fn(body, content_type):
    return torch.tensor(json.loads(body)["x"], dtype=torch.float32)
'''


@pytest.fixture(scope="module")
def picky_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("picky")
    torch.jit.save(torch.jit.script(Picky()), str(folder / "model.pt"))
    (folder / "metadata.json").write_text(json.dumps({
        "name": "picky", "max_batch_size": 4,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [2]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}]}))
    (folder / "code").mkdir()
    (folder / "code" / "inference.py").write_text(HOOKS)
    return folder


def _fail_three_ways(server: ServerProcess) -> None:
    bad_body = requests.post(server.url + "/invocations", data=b"not json",
                             headers={"Content-Type": "application/json"}, timeout=30)
    assert bad_body.status_code == 400, bad_body.text
    through_hooks = requests.post(server.url + "/invocations", json={"x": [[-1.0, 1.0]]}, timeout=30)
    assert through_hooks.status_code == 500 and "negative input" in through_hooks.text
    through_batcher = requests.post(server.url + "/v2/models/picky/infer", timeout=30, json={
        "inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [-1.0, 1.0]}]})
    assert through_batcher.status_code == 500 and "negative input" in through_batcher.text


def _served_and_failed(model_dir, tmp_path, log_format: str) -> str:
    log_path = tmp_path / "server.log"
    server = ServerProcess(model_dir, {"SMSERVE_LOG_FORMAT": log_format}, log_path=log_path).start()
    try:
        _fail_three_ways(server)
        # The access line of the last request is written after its answer has left.
        wait_until(lambda: '"POST /v2/models/picky/infer" 500' in log_path.read_text())
    finally:
        assert server.terminate() == 0
    return log_path.read_text()


def test_text_log_one_traceback_per_500_none_for_the_400_none_of_gevent(picky_model, tmp_path):
    log = _served_and_failed(picky_model, tmp_path, "text")
    assert "ThreadPoolWorker" not in log and "failed with" not in log, log
    # Two 500s, one traceback each, with the model's own error; the 400 none (its
    # reason is in its answer; the traceback is left to debug level).
    assert log.count(TRACEBACK) == 2, log
    assert log.count("RuntimeError: negative input") >= 2
    # The 400's reason, once, in one short line at the default level, naming the hook.
    refused = [line for line in log.splitlines() if "JSONDecodeError" in line]
    assert len(refused) == 1 and log_lines(refused[0], "INFO", "POST /invocations -> 400: input_fn rejected the body: "), log
    # One ERROR line per 500: the failure's own, not a second one from the route.
    assert log.count(" ERROR ") == 2, log
    assert log_lines(log, "INFO", "hooks: input_fn from code/inference.py"), log


def test_json_log_is_one_object_a_line_with_the_traceback_in_a_field(picky_model, tmp_path):
    log = _served_and_failed(picky_model, tmp_path, "json")
    records = []
    for line in log.splitlines():
        if line.strip():
            records.append(json.loads(line))  # every line: one JSON object, no plain-text traceback
    with_traceback = [r for r in records if "exception" in r]
    assert len(with_traceback) == 2, with_traceback
    for record in with_traceback:
        assert record["level"] == "ERROR" and record["logger"].startswith("smserve.engine")
        assert record["exception"].startswith(TRACEBACK) and "negative input" in record["exception"]
        assert "ThreadPoolWorker" not in record["exception"]
    statuses = sorted(r["status"] for r in records if r["logger"] == "smserve.access" and r.get("method") == "POST")
    assert statuses == [400, 500, 500]
    assert any(r["message"] == "hooks: input_fn from code/inference.py" for r in records)


def test_a_model_that_cannot_load_stops_a_local_run(tmp_path):
    """SMSERVE_EXIT_ON_LOAD_ERROR (make serve sets it): the server exits non-zero, with
    the load error as its last word, instead of staying up with /ping at 500."""
    (tmp_path / "empty").mkdir()
    server = ServerProcess(tmp_path / "empty", {"SMSERVE_EXIT_ON_LOAD_ERROR": "true"},
                           log_path=tmp_path / "server.log").start(wait=False)
    try:
        code = server.proc.wait(timeout=120)
    finally:
        server.terminate()
    log = server.log()
    assert code == 3, log
    assert "holds neither model.pt2 (torch.export) nor model.pt (TorchScript)" in log
    assert "stopping: the model in" in log and "SMSERVE_EXIT_ON_LOAD_ERROR" in log
    assert log.count(TRACEBACK) == 0, "the load error names its problem: no traceback"


def test_a_pickled_model_that_cannot_load_says_how_to_save_it(tmp_path):
    (tmp_path / "m").mkdir()
    torch.save(Picky(), str(tmp_path / "m" / "model.pt"))
    server = ServerProcess(tmp_path / "m", {"SMSERVE_EXIT_ON_LOAD_ERROR": "true"},
                           log_path=tmp_path / "server.log").start(wait=False)
    try:
        code = server.proc.wait(timeout=120)
    finally:
        server.terminate()
    log = server.log()
    assert code == 3, log
    assert "is a pickled module" in log and "torch.jit.save(" in log and "torch.export.save(" in log
    assert "PytorchStreamReader" not in log

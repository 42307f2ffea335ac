"""input_fn and output_fn in processes of their own (SMSERVE_HOOK_PROCESSES), on a real
gunicorn: they run outside the worker, their values batch as a thread's do, arrays and
tensors cross through shared memory, the context goes and its custom attributes come
back, failures are named as on a thread, a process that dies is replaced, and a model
that keeps sessions keeps its hooks on threads."""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.helpers.server import ServerProcess, descendants, passes_and_records, shm_held, wait_until, worker_pids
from tests.helpers.models import model_dir_with

PROCESS_HOOKS = '''
import json
import os

import numpy as np
import torch


def model_fn(model_dir):
    return "process-hooks"


class _DiesWhenSent:
    def __reduce__(self):
        os._exit(4)  # the process ends while it sends its answer, its array files written


def input_fn(body, content_type, context):
    data = json.loads(body)
    if data.get("die"):
        os._exit(3)
    if data.get("die_sending"):
        return {"big": np.zeros((4, 100_000)), "dies": _DiesWhenSent()}
    if data.get("fail") == "value":
        raise ValueError("not a number")
    if data.get("fail") == "name":
        return undefined_name
    rows = int(data.get("rows", 1))
    pid = np.full((rows, 1), os.getpid(), dtype=np.float64)
    big = torch.full((rows, int(data.get("width", 4))), float(data.get("x", 1)), dtype=torch.bfloat16)
    return {"pid": pid, "big": big, "attributes": np.full((rows, 1), len(context.custom_attributes or ""))}


def predict_fn(data, model):
    return {"pid": data["pid"], "sum": data["big"].float().sum(1, keepdim=True), "attributes": data["attributes"],
            "worker": np.full_like(data["pid"], os.getpid())}


def output_fn(prediction, accept, context):
    context.response_custom_attributes = f"output-pid={os.getpid()}"
    return json.dumps({k: v.tolist() for k, v in prediction.items()}), "application/json"
'''
METADATA = {"name": "process-hooks", "max_batch_size": 64}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("hook-processes")
    folder = model_dir_with(root, PROCESS_HOOKS, "process-hooks")
    (folder / "metadata.json").write_text(json.dumps(METADATA))
    with ServerProcess(folder, {"SMSERVE_HOOK_PROCESSES": "2", "SMSERVE_MAX_BATCH_DELAY_MS": "20"},
                       log_path=root / "server.log") as s:
        yield s


def invoke(server, **body):
    return requests.post(server.url + "/invocations", data=json.dumps(body), timeout=60,
                         headers={"Content-Type": "application/json", "X-Amzn-SageMaker-Custom-Attributes": "abc"})


def test_the_hooks_run_in_processes_of_their_own_and_their_values_batch(server):
    (worker,) = worker_pids(server)
    passes_before, records_before = passes_and_records(server, "process-hooks")
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: invoke(server, rows=2, width=20_000, x=i), range(16)))
    hook_pids = set()
    for i, answer in enumerate(answers):
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["sum"] == [[20_000.0 * i]] * 2  # bfloat16 through shared memory
        assert body["attributes"] == [[3]] * 2  # the context's custom attributes reached input_fn
        assert body["worker"] == [[float(worker)]] * 2
        hook_pids.add(int(body["pid"][0][0]))
        assert answer.headers["X-Amzn-SageMaker-Custom-Attributes"].startswith("output-pid=")
        assert int(answer.headers["X-Amzn-SageMaker-Custom-Attributes"].split("=")[1]) != worker
    assert worker not in hook_pids and len(hook_pids) <= 2
    passes, records = passes_and_records(server, "process-hooks")
    assert records - records_before == 32 and passes - passes_before < 16  # requests shared passes
    # every value's file let go: none held open or mapped by the worker or its hook processes
    assert wait_until(lambda: not shm_held(descendants(server.proc.pid)), timeout=5), shm_held(descendants(server.proc.pid))


def test_a_lone_requests_files_are_let_go_once_it_is_answered(server):
    """No later request comes to free them: the worker keeps nothing of the request
    mapped while it waits, and the process that wrote input_fn's value (the other one
    may run output_fn) lets its file go without waiting for a call of its own."""
    for _ in range(3):
        assert invoke(server, rows=2, width=20_000).status_code == 200
        assert wait_until(lambda: not shm_held(descendants(server.proc.pid)), timeout=5), \
            shm_held(descendants(server.proc.pid))


def test_failures_are_named_as_on_a_thread(server):
    rejected = invoke(server, fail="value")
    assert rejected.status_code == 400 and rejected.json()["error"] == "input_fn rejected the body: ValueError: " \
                                                                      "not a number"
    broken = invoke(server, fail="name")
    assert broken.status_code == 500 and broken.json()["error"].startswith("input_fn failed: NameError")
    assert wait_until(lambda: "in its hook process" in server.log())  # its traceback, from the process


def test_a_process_that_dies_fails_its_request_and_another_takes_its_place(server):
    (worker,) = worker_pids(server)
    died = invoke(server, die=True)
    assert died.status_code == 500 and "process ended before answering (exit code 3" in died.json()["error"]
    for _ in range(4):  # both processes answer again, the new one among them
        assert invoke(server, rows=1).status_code == 200
    assert worker_pids(server) == {worker}


def test_a_process_that_dies_leaves_no_array_file_behind(server):
    """Its answer's arrays were written to /dev/shm when it died sending it: nothing of
    the server holds them after (RAM, otherwise held until the holder exits)."""
    died = invoke(server, die_sending=True)
    assert died.status_code == 500 and "exit code 4" in died.json()["error"]
    # (Another request's arrays in flight at this moment go within moments; a leak stays.)
    assert wait_until(lambda: not shm_held(descendants(server.proc.pid)), timeout=5), shm_held(descendants(server.proc.pid))


def test_arrays_sent_to_a_process_that_died_are_removed(tmp_path):
    """output_fn's arrays go to a process that has died meanwhile: the send fails, and
    the files written for it are removed, not left for a reader that never comes."""
    import signal

    import numpy as np

    from smserve.engine.hooks.processes import HookProcessDied, HookProcesses

    folder = model_dir_with(tmp_path, PROCESS_HOOKS, "process-hooks")
    processes = HookProcesses(str(folder), 1, timeout_s=60)
    try:
        (pid,) = processes.pids
        os.kill(pid, signal.SIGKILL)
        processes._children[0].proc.wait(timeout=30)
        with pytest.raises(HookProcessDied):
            processes.output_fn({"pid": np.zeros((1000, 100))}, "application/json", None)
        assert not shm_held([os.getpid()])  # the files written for it are let go
    finally:
        processes.close()


def test_a_helper_beside_the_script_named_as_a_standard_module_does_not_replace_it_in_the_processes(
        tmp_path, monkeypatch):
    """The worker's load of the script puts code/ on its sys.path; the processes it
    starts get that path, less code/, which there would come before the standard library
    (here the server's own `import tokenize` would take the helper)."""
    from smserve.engine.hooks.processes import HookProcesses
    from smserve.core.context import RequestContext
    from smserve.engine.hooks.script import load_hooks

    folder = model_dir_with(tmp_path, PROCESS_HOOKS, "stdlib-named-helper")
    (folder / "code" / "tokenize.py").write_text("raise ImportError('the helper, not the standard library')\n")
    monkeypatch.setattr("sys.path", list(sys.path))
    load_hooks(str(folder))  # as the worker does before it starts the processes
    processes = HookProcesses(str(folder), 1, timeout_s=60)
    try:
        value = processes.input_fn(b'{"rows": 2}', "application/json", RequestContext({}))
        assert value["pid"].tolist() == [[float(processes.pids[0])]] * 2
    finally:
        processes.close()


def test_a_model_that_keeps_sessions_runs_its_hooks_on_threads(tmp_path):
    folder = model_dir_with(tmp_path, PROCESS_HOOKS + "\n\ndef open_session(context):\n    return {}\n", "sessions")
    (folder / "metadata.json").write_text(json.dumps(METADATA))
    with ServerProcess(folder, {"SMSERVE_HOOK_PROCESSES": "2"}, log_path=tmp_path / "server.log") as server:
        (worker,) = worker_pids(server)
        answer = invoke(server, rows=1)
        assert answer.status_code == 200 and answer.json()["pid"] == [[float(worker)]]
        assert "SMSERVE_HOOK_PROCESSES=2 not used: this model keeps sessions" in server.log()

"""Hook processes (SMSERVE_HOOK_PROCESSES) that misbehave, on a real gunicorn: a value
that does not fit in /dev/shm, a value that cannot leave its process, a process that
dies with a grandchild holding its pipes, a process that hangs. Each is answered, its
files go, the worker lives on, and no process outlives the server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.helpers.server import ServerProcess, wait_until, worker_pids
from tests.helpers.models import model_dir_with

HOOKS = '''
import json
import os
import threading

import numpy as np


def model_fn(model_dir):
    return "faults"


class _Unpicklable:
    def __reduce__(self):
        raise TypeError("not this one")


class _HangsWhenPickled:
    def __reduce__(self):
        threading.Event().wait()


def _note_pid(data):
    if data.get("pid_file"):
        with open(data["pid_file"], "w") as f:
            f.write(str(os.getpid()))


def input_fn(body, content_type):
    data = json.loads(body)
    _note_pid(data)
    mib = float(data.get("input_mib", 0))
    if data.get("unpicklable"):
        return {"big": np.zeros(1_000_000), "bad": _Unpicklable()}
    if data.get("hang_sending"):
        return {"big": np.zeros(1_000_000), "hangs": _HangsWhenPickled()}
    if data.get("hang"):
        threading.Event().wait()
    if data.get("die_with") == "fork":
        grandchild = os.fork()
        if grandchild == 0:  # it holds every pipe end, close-on-exec or not
            threading.Event().wait(120)
            os._exit(0)
        with open(data["grandchild_file"], "w") as f:
            f.write(str(grandchild))
    elif data.get("die_with") == "shell":
        os.system(f"sleep 120 & echo $! > {data['grandchild_file']}")
    if data.get("die_with"):
        os._exit(3)
    if mib:
        return np.zeros(int(mib * 131072))  # float64: mib MiB
    return np.full(1, float(data.get("output_mib", 0)))


def predict_fn(data, model):
    if data.size == 1:
        return np.zeros(int(data[0] * 131072))
    return data


def output_fn(prediction, accept):
    return json.dumps({"size": int(prediction.size)}), "application/json"
'''


def shm_files(root: str = "/dev/shm") -> set[str]:
    return {n for n in os.listdir(root) if n.startswith("smserve-hook-")}


def invoke(server, timeout: float = 60, **body):
    return requests.post(server.url + "/invocations", data=json.dumps(body), timeout=timeout,
                         headers={"Content-Type": "application/json"})


def alive(pid: int) -> bool:
    """Running, not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def hook_pid(server, tmp_path, name: str) -> int:
    path = tmp_path / name
    assert invoke(server, pid_file=str(path)).status_code == 200
    return int(path.read_text())


def replaced(server, pid: int) -> bool:
    """Whether a new hook process took the place of pid (a start takes seconds)."""
    return bool(wait_until(lambda: f"took the place of {pid}" in server.log(), timeout=60))


def faults_server(root, env: dict[str, str]) -> ServerProcess:
    folder = model_dir_with(root, HOOKS, "faults")
    return ServerProcess(folder, {"SMSERVE_HOOK_PROCESSES": "1", **env}, log_path=root / "server.log")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with faults_server(tmp_path_factory.mktemp("hook-faults"), {"SAGEMAKER_MODEL_SERVER_TIMEOUT": "5"}) as s:
        yield s


def test_a_value_that_cannot_leave_its_process_is_a_500_naming_the_hook_and_leaves_no_file(server):
    (worker,) = worker_pids(server)
    before = shm_files()
    answers = [invoke(server, unpicklable=True) for _ in range(3)]
    for answer in answers:
        assert answer.status_code == 500, answer.text
        assert answer.json()["error"].startswith("input_fn failed"), answer.text
        assert "cannot leave its hook process" in answer.json()["error"]
    assert not shm_files() - before  # (each value held an 8 MB array)
    assert invoke(server).status_code == 200 and worker_pids(server) == {worker}


@pytest.mark.parametrize("grandchild", ["fork", "shell"])
def test_a_process_that_dies_beside_a_grandchild_is_noticed_by_its_death(server, tmp_path, grandchild):
    """The grandchild holds (fork) or would hold (a shell's background job) the pipes'
    ends: the worker notices the process's death itself, not the pipe's end."""
    pid = hook_pid(server, tmp_path, "pid")
    grandchild_file = tmp_path / "grandchild"
    try:
        died = invoke(server, die_with=grandchild, grandchild_file=str(grandchild_file))
        assert died.status_code == 500, died.text  # not the 504 of the deadline
        assert "process ended before answering (exit code 3" in died.json()["error"]
        assert not alive(pid) and wait_until(lambda: not os.path.exists(f"/proc/{pid}"))  # reaped, no zombie
        assert replaced(server, pid) and invoke(server).status_code == 200
    finally:
        if grandchild_file.exists():
            os.kill(int(grandchild_file.read_text()), signal.SIGKILL)


def test_a_hung_process_is_ended_at_the_deadline_and_replaced(server, tmp_path):
    (worker,) = worker_pids(server)
    pid = hook_pid(server, tmp_path, "pid")
    with ThreadPoolExecutor(1) as pool:
        hung = pool.submit(invoke, server, hang=True)
        assert hung.result().status_code == 504
    assert wait_until(lambda: not alive(pid), timeout=30) and replaced(server, pid)
    again = invoke(server)  # the one hook process hung: without a new one, a 504 again
    assert again.status_code == 200, again.text
    assert hook_pid(server, tmp_path, "new-pid") != pid and worker_pids(server) == {worker}
    assert "did not answer within 5 s" in server.log()


def test_a_worker_whose_hook_processes_cannot_start_again_says_so_on_ping(tmp_path):
    marker = tmp_path / "no-more-starts"
    hooks = HOOKS + f"\nif os.path.exists({str(marker)!r}):\n    raise RuntimeError('cannot start')\n"
    folder = model_dir_with(tmp_path, hooks, "no-restart")
    with ServerProcess(folder, {"SMSERVE_HOOK_PROCESSES": "1"}, log_path=tmp_path / "server.log") as server:
        (worker,) = worker_pids(server)
        marker.touch()
        died = invoke(server, die_with="exit")
        assert died.status_code == 500
        assert wait_until(lambda: "could not be started again" in server.log(), timeout=60)
        ping = requests.get(server.url + "/ping", timeout=10)
        assert ping.status_code == 503 and "hook process" in ping.json()["error"], ping.text
        refused = invoke(server, timeout=30)  # at once, not at the deadline
        assert refused.status_code == 503 and "hook process" in refused.json()["error"], refused.text
        assert worker_pids(server) == {worker}


def test_hung_processes_and_their_files_end_with_the_server(tmp_path):
    with faults_server(tmp_path, {"SMSERVE_GRACEFUL_TIMEOUT": "2"}) as server:
        before = shm_files()
        hung_pid = hook_pid(server, tmp_path, "pid")
        started = tmp_path / "hangs"
        with ThreadPoolExecutor(1) as pool:
            # Its 8 MB array written, it hangs while it sends its answer.
            hung = pool.submit(invoke, server, hang_sending=True, pid_file=str(started))
            assert wait_until(started.exists, timeout=30)
            server.proc.send_signal(signal.SIGTERM)
            server.proc.wait(timeout=60)
            hung.exception()  # (cut at the graceful timeout)
        assert wait_until(lambda: not alive(hung_pid), timeout=10)
        assert not shm_files() - before


def _small_shm_possible() -> bool:
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _small_shm_possible(), reason="needs unshare -m and mount (root) for a small /dev/shm")
def test_values_bigger_than_dev_shm_are_refused_and_the_worker_lives(tmp_path):
    """A 16 MiB /dev/shm (Docker's default is 64 MB) in a mount namespace of the server's own."""
    server = faults_server(tmp_path, {})
    server.cmd = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=16m tmpfs /dev/shm && exec "$@"', "sh",
                  *server.cmd]
    with server:
        (worker,) = worker_pids(server)
        for body in ({"output_mib": 32}, {"input_mib": 32}):
            answer = invoke(server, **body)
            assert answer.status_code == 500, answer.text
            error = answer.json()["error"]
            assert "/dev/shm" in error and "16.0 MiB" in error, error
        assert invoke(server, output_mib=4).json() == {"size": 4 * 131072}
        assert worker_pids(server) == {worker}


def test_a_hung_process_ends_with_a_worker_that_is_killed(tmp_path):
    """The worker killed (gunicorn's timeout, the OOM killer) runs no clean-up of its own."""
    with faults_server(tmp_path, {}) as server:
        (worker,) = worker_pids(server)
        hung_pid = hook_pid(server, tmp_path, "pid")
        started = tmp_path / "hangs"
        with ThreadPoolExecutor(1) as pool:
            hung = pool.submit(invoke, server, hang=True, pid_file=str(started))
            assert wait_until(started.exists, timeout=30)
            os.kill(worker, signal.SIGKILL)
            hung.exception()
        assert wait_until(lambda: not alive(hung_pid), timeout=10)

"""The suite's fork server (tests/helpers/fork_server.py) starts a server that behaves as
one started as a new interpreter, as far as a test can see (its answers, its log, its exit
codes and signals), and declines every server whose environment differs in what the fork
server read when it imported torch."""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import subprocess
import sys

import pytest
import requests

from tests.helpers import fork_server
from tests.helpers.models import ECHO_HOOKS, model_dir_with
from tests.helpers.server import SERVE, ServerProcess, descendants, wait_until, worker_pids


def started_as(how: str, server: ServerProcess) -> None:
    assert isinstance(server.proc, fork_server.ForkedProcess) == (how == "forked")


def test_serves_and_ends_as_a_new_interpreter_would(started_how, tmp_path):
    model = model_dir_with(tmp_path, ECHO_HOOKS, "echo")
    server = ServerProcess(model, log_path=tmp_path / "server.log").start()
    started_as(started_how, server)
    answer = requests.post(server.url + "/invocations", json={"x": [1, 2]}, timeout=10)
    assert answer.status_code == 200 and answer.json() == [2, 4]
    (worker,) = worker_pids(server)
    assert server.terminate() == 0
    log = server.log()
    assert f"Worker exiting (pid: {worker})" in log and "shutdown complete" in log
    assert "Traceback" not in log and "Warning" not in log


def test_a_refused_start_exits_2_with_serves_message(started_how, tmp_path):
    server = ServerProcess(tmp_path / "no-such-model", log_path=tmp_path / "server.log")
    server.start(wait=False)
    started_as(started_how, server)
    assert server.proc.wait(30) == 2
    assert "serve: no model directory at" in server.log()


def test_signals_reach_the_master_and_its_end_is_reported(started_how, tmp_path):
    model = model_dir_with(tmp_path, ECHO_HOOKS, "echo")
    server = ServerProcess(model, log_path=tmp_path / "server.log").start()
    started_as(started_how, server)
    with pytest.raises(subprocess.TimeoutExpired):
        server.proc.wait(0.1)
    server.proc.send_signal(signal.SIGKILL)
    assert server.proc.wait(10) == -signal.SIGKILL
    assert server.proc.returncode == -signal.SIGKILL and server.proc.poll() == -signal.SIGKILL
    server.terminate(timeout=5)  # its worker, orphaned, goes with the group


def test_only_servers_whose_environment_differs_in_their_own_settings_are_forked():
    base = {"PATH": "/usr/bin", "OMP_WAIT_POLICY": "PASSIVE", "SM_MODEL_DIR": "/a"}
    forks = fork_server.ForkServer(base)
    argv = [sys.executable, str(SERVE), "serve"]
    assert forks.eligible(argv, base)
    assert forks.eligible(argv, {**base, "SM_MODEL_DIR": "/b", "SMSERVE_MAX_BATCH_SIZE": "8",
                                 "SAGEMAKER_BIND_TO_PORT": "1", "PYTEST_CURRENT_TEST": "t", "TEST_MARKS": "/m"})
    assert not forks.eligible(argv, {**base, "OMP_WAIT_POLICY": "ACTIVE"})  # read as libgomp loads
    assert not forks.eligible(argv, {**base, "OMP_NUM_THREADS": "4"})
    assert not forks.eligible(argv, {k: v for k, v in base.items() if k != "OMP_WAIT_POLICY"})
    assert not forks.eligible(argv, {**base, "PYTHONPATH": "/x"})
    assert not forks.eligible(argv, {**base, "SMSERVE_COMPILE": "default"})  # torch's locks as in production
    assert forks.eligible(argv, {**base, "SMSERVE_COMPILE": "off"})
    assert not forks.eligible([sys.executable, str(SERVE), "train"], base)
    assert not forks.eligible(["/other/python", str(SERVE), "serve"], base)
    assert forks.start(argv, {**base, fork_server.DISABLE: "0"}, None, None) is None


def test_requests_that_fail_or_leave_cost_the_fork_server_nothing(tmp_path):
    """A garbled request, one without its descriptors, one cut off, and clients that leave
    before they learn their server's pid: the fork server answers the next as before,
    and no server outlives a client that could not stop it."""
    forks = fork_server.ForkServer(os.environ)
    try:
        path = forks.started()
        env = {**os.environ, "SM_MODEL_DIR": str(model_dir_with(tmp_path, ECHO_HOOKS, "echo")),
               "SAGEMAKER_BIND_TO_PORT": "0"}
        request = json.dumps({"argv": [sys.executable, str(SERVE), "serve"], "env": env, "cwd": os.getcwd()})
        for payload, fds in [(b"not json\n", 3), (request.encode() + b"\n", 0), (request[:20].encode(), 3),
                             *[(request.encode() + b"\n", 3)] * 3]:
            with socket.socket(socket.AF_UNIX) as client, open(os.devnull, "rb") as null:
                client.connect(path)
                client.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                            array.array("i", [null.fileno()] * fds))] if fds else [])
        server = ServerProcess(env["SM_MODEL_DIR"], log_path=tmp_path / "server.log")
        server.forker = forks.start
        with server:
            assert isinstance(server.proc, fork_server.ForkedProcess)
            assert requests.post(server.url + "/invocations", json={"x": [3]}, timeout=10).json() == [6]
        assert wait_until(lambda: not descendants(forks._proc.pid), timeout=10), "a server nobody can stop"
        assert forks._proc.poll() is None
    finally:
        forks.close()
    assert not os.path.exists(forks._folder)

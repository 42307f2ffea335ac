"""ServerProcess, which tests and benchmarks start servers with, never leaks one: a
server that fails to get ready is stopped, with its workers, before the error reaches
the caller (bench_load once crashed on a ReadTimeout and left gunicorn running)."""

from __future__ import annotations

import os
import signal
import time

import pytest
import requests

from local_test import server_process
from local_test.server_process import ServerProcess

# model_fn never returns, so /ping stays 503 and the server never gets ready.
HANGING_MODEL = "import time\n\ndef model_fn(model_dir):\n    time.sleep(3600)\n"


@pytest.fixture(autouse=True)
def _both_ways(started_how):
    """Each promise holds of a forked server (the suite's) and of a new interpreter."""


@pytest.fixture
def hanging_model(tmp_path):
    (tmp_path / "model" / "code").mkdir(parents=True)
    (tmp_path / "model" / "code" / "inference.py").write_text(HANGING_MODEL)
    return tmp_path / "model"


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def assert_nothing_left(server: ServerProcess) -> None:
    assert server.proc is not None and server.proc.poll() is not None, "the server process is still running"
    deadline = time.monotonic() + 5
    while group_alive(server.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(server.proc.pid), "a process of the server's group (a worker) is still running"


def wait_for_worker(server: ServerProcess) -> None:
    """Until /ping answers (503: the worker is up and loading), so a worker exists to leak."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            requests.get(server.url + "/ping", timeout=2)
            return
        except requests.RequestException:
            time.sleep(0.2)
    pytest.fail("the server never answered /ping")


def test_start_that_times_out_leaves_no_process(hanging_model, tmp_path):
    server = ServerProcess(hanging_model, log_path=tmp_path / "server.log")
    with pytest.raises(TimeoutError, match="not ready"):
        server.start(timeout=8)
    assert_nothing_left(server)


def test_ping_read_timeouts_mean_not_ready_and_leave_no_process(hanging_model, tmp_path, monkeypatch):
    """The crash that leaked: /ping accepted the connection but did not answer in time."""
    server = ServerProcess(hanging_model, log_path=tmp_path / "server.log")
    server.start(wait=False)
    try:
        wait_for_worker(server)
    except BaseException:
        server.terminate()
        raise

    def read_timeout(*args, **kwargs):
        raise requests.exceptions.ReadTimeout("read timed out")

    monkeypatch.setattr(server_process.requests, "get", read_timeout)
    with pytest.raises(TimeoutError):
        with server:  # started already: __enter__ keeps it, __exit__ must stop it
            server.wait_ready(timeout=1)
    assert_nothing_left(server)


def test_interrupt_while_starting_leaves_no_process(hanging_model, tmp_path, monkeypatch):
    server = ServerProcess(hanging_model, log_path=tmp_path / "server.log")
    calls = []

    def interrupted_get(*args, **kwargs):
        calls.append(1)
        if len(calls) > 10:
            raise KeyboardInterrupt
        raise requests.ConnectionError("not yet")

    monkeypatch.setattr(server_process.requests, "get", interrupted_get)
    with pytest.raises(KeyboardInterrupt):
        with server:
            pytest.fail("the server cannot have become ready")
    assert_nothing_left(server)


def test_server_that_exits_is_reported_with_its_log(tmp_path):
    server = ServerProcess(tmp_path / "no-such-model", log_path=tmp_path / "server.log")
    # The server's own message names the folder; the error carries it from the log.
    with pytest.raises(RuntimeError, match="(?s)server exited with [1-9].*no-such-model"):
        server.start(timeout=30)
    assert_nothing_left(server)


def test_terminate_kills_workers_that_ignore_sigterm(hanging_model, tmp_path):
    """SIGTERM that does not stop the tree in time: the group is killed."""
    server = ServerProcess(hanging_model, log_path=tmp_path / "server.log")
    server.start(wait=False)
    try:
        wait_for_worker(server)
        os.kill(server.proc.pid, signal.SIGSTOP)  # the master cannot act on SIGTERM
    finally:
        server.terminate(timeout=1)
    assert_nothing_left(server)

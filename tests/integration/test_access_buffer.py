"""A worker buffers its access lines (logs.AccessLines): each is still written, soon
after its answer while the server idles, and before the worker exits at SIGTERM; and
two workers writing one pipe (a container's stdout, as Docker and SageMaker read it)
never mix parts of their lines. Real gunicorn servers."""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.helpers.server import ServerProcess, wait_until
from tests.helpers.models import model_dir_with
from tests.integration.http_raw import Reader, connect, request_bytes

INFERENCE_ID = "X-Amzn-SageMaker-Inference-Id"


@pytest.fixture(scope="module")
def model(echo_model_dir):
    return echo_model_dir


def invoke(server: ServerProcess, inference_id: str, session: requests.Session | None = None) -> None:
    answer = (session or requests).post(server.url + "/invocations", json={"x": [1.0]}, timeout=30,
                                        headers={INFERENCE_ID: inference_id})
    assert answer.status_code == 200


def test_a_line_is_written_while_the_server_idles(model, tmp_path):
    server = ServerProcess(model, {"SAGEMAKER_MODEL_SERVER_WORKERS": "1"}, log_path=tmp_path / "log").start()
    try:
        invoke(server, "idle-1")
        # Nothing else happens: the line goes out on the buffer's own timer.
        assert wait_until(lambda: "id=idle-1" in server.log(), timeout=5), server.log()[-2000:]
        assert server.proc.poll() is None
    finally:
        server.terminate()


def test_sigterm_writes_every_buffered_line_before_the_worker_exits(model, tmp_path):
    server = ServerProcess(model, {"SAGEMAKER_MODEL_SERVER_WORKERS": "1"}, log_path=tmp_path / "log").start()
    try:
        with requests.Session() as session:
            for i in range(40):
                invoke(server, f"burst-{i}", session)
    finally:
        # At once: the last lines are still in the worker's buffer.
        assert server.terminate() == 0
    log = server.log()
    assert [i for i in range(40) if f"id=burst-{i}\n" not in log] == [], log[-3000:]
    # The worker's own last line comes after them: nothing was written behind its back.
    assert log.rindex("id=burst-39") < log.rindex("Worker exiting")


def test_two_workers_writing_one_pipe_never_mix_their_lines(model, tmp_path):
    fifo = tmp_path / "stdout"
    os.mkfifo(fifo)
    received: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as pipe:
            while chunk := pipe.read1(1 << 16):
                received.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    env = {"SAGEMAKER_MODEL_SERVER_WORKERS": "2", "SMSERVE_LOG_FORMAT": "json"}
    server = ServerProcess(model, env, log_path=fifo).start()
    # Ids near the longest a line carries, so that each write holds few lines and the two
    # workers' writes meet often in the pipe.
    ids = [f"{i:04d}-" + "x" * 200 for i in range(600)]
    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda inference_id: invoke(server, inference_id), ids))
    finally:
        assert server.terminate() == 0
    reader.join(timeout=30)
    lines = b"".join(received).decode().splitlines()
    access = [line for line in lines if '"smserve.access"' in line]
    entries = [json.loads(line) for line in access]  # a line holding part of another does not parse
    assert sorted(e["inference_id"] for e in entries if e["path"] == "/invocations") == ids
    assert len({e["pid"] for e in entries}) == 2, "one worker answered everything: nothing shared the pipe"


FAILS_TO_LOAD = '''
import time


def model_fn(model_dir):
    time.sleep(2)
    raise RuntimeError("this model does not load")
'''


def test_a_worker_stopping_the_server_writes_its_lines_first(tmp_path):
    """SMSERVE_EXIT_ON_LOAD_ERROR: the worker ends the process itself (os._exit); every
    ping it answered (503 while loading) has its line. (The pings rarely meet the last
    0.1 s before the exit, so this guards the lines, not that last flush alone.)"""
    model = model_dir_with(tmp_path, FAILS_TO_LOAD, "fails")
    server = ServerProcess(model, {"SMSERVE_EXIT_ON_LOAD_ERROR": "true", "SAGEMAKER_MODEL_SERVER_WORKERS": "1"},
                           log_path=tmp_path / "log").start(wait=False)
    answered: list[int] = []
    try:
        while server.proc.poll() is None:
            try:
                answered.append(requests.get(server.url + "/ping", timeout=2).status_code)
            except requests.RequestException:
                pass
    finally:
        server.terminate()
    assert server.proc.returncode == 3
    assert 503 in answered, "no ping was answered while the model loaded"
    for status in set(answered):
        assert server.log().count(f'"GET /ping" {status} ') == answered.count(status), server.log()[-3000:]


def test_lines_of_long_escaped_targets_from_two_workers_each_parse(model, tmp_path):
    """A target of a few KB of '"' is a JSON line of tens of KB: cut to fit one atomic
    write, never torn by the other worker's writes."""
    fifo = tmp_path / "stdout"
    os.mkfifo(fifo)
    received: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as pipe:
            while chunk := pipe.read1(1 << 16):
                received.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    server = ServerProcess(model, {"SAGEMAKER_MODEL_SERVER_WORKERS": "2", "SMSERVE_LOG_FORMAT": "json"},
                           log_path=fifo).start()
    targets = [f"/{i:04d}" + '"\\' * 1800 for i in range(300)]

    def ask(target: str) -> None:
        with connect(server.port) as sock:
            sock.sendall(request_bytes("GET", target))
            assert Reader(sock).response().status == 404

    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(ask, targets))
    finally:
        assert server.terminate() == 0
    reader.join(timeout=30)
    access = [line for line in b"".join(received).decode().splitlines() if '"smserve.access"' in line]
    entries = [json.loads(line) for line in access]  # a line holding part of another does not parse
    assert sorted(e["path"][:5] for e in entries if e["status"] == 404) == [t[:5] for t in targets]
    assert len({e["pid"] for e in entries}) == 2, "one worker answered everything: nothing shared the pipe"

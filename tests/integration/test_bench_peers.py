"""bench_peers' peers answer what the model answers, so the ratios it prints compare
servers doing the same work: the ceiling (a raw asyncio handler) and the bare Flask app,
each started as bench_peers starts it, through local_test's HTTPProcess."""

from __future__ import annotations

import io
import socket
import sys

import numpy as np
import pytest
import requests
import torch

from tests.helpers.client import npy
from tests.helpers.server import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import _peer_servers  # noqa: E402
import bench_peers  # noqa: E402


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("peers") / "model"
    return model_dir, bench_peers.build_model(model_dir)


@pytest.fixture(scope="module", params=["ceiling", "flask"])
def peer(request, model, tmp_path_factory):
    model_dir, _ = model
    start = {"ceiling": _peer_servers.start_ceiling, "flask": _peer_servers.start_peer}[request.param]
    process = start(model_dir, tmp_path_factory.mktemp(request.param))
    yield process
    process.terminate()
    assert process.proc.poll() is not None


@pytest.mark.parametrize("batch", [1, 256])
def test_the_peer_answers_the_models_numbers(peer, model, batch):
    _, traced = model
    x = np.random.default_rng(batch).standard_normal((batch, bench_peers.IN_DIM)).astype(np.float32)
    r = requests.post(peer.url + "/invocations", data=npy(x), headers={"Content-Type": "application/x-npy"}, timeout=30)
    assert r.status_code == 200
    with torch.no_grad():
        expected = traced(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.load(io.BytesIO(r.content), allow_pickle=False), expected, rtol=1e-5, atol=1e-6)


def test_requests_that_arrive_together_on_one_connection_each_get_an_answer(peer):
    """hey keeps connections alive; the ceiling must not drop a request that came in the
    same read as the one before it."""
    body = npy(np.zeros((2, bench_peers.IN_DIM), np.float32))
    port = int(peer.url.rsplit(":", 1)[1])
    request = (b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-npy\r\n"
               b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request * 3)
        buffered = bytearray()
        answers = [read_answer(s, buffered) for _ in range(3)]
    for status, answer in answers:
        assert status.startswith(b"HTTP/1.1 200")
        assert np.load(io.BytesIO(answer), allow_pickle=False).shape == (2, bench_peers.OUT_DIM)


def read_answer(s: socket.socket, buffered: bytearray) -> tuple[bytes, bytes]:
    """One HTTP answer off the socket: (status line, body); what came after it stays buffered."""
    while b"\r\n\r\n" not in buffered:
        buffered += s.recv(65536) or pytest.fail("the connection closed before the answer")
    end = buffered.index(b"\r\n\r\n")
    head = bytes(buffered[:end]).split(b"\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head if line.lower().startswith(b"content-length:"))
    while len(buffered) < end + 4 + length:
        buffered += s.recv(65536) or pytest.fail("the connection closed in the body")
    body = bytes(buffered[end + 4:end + 4 + length])
    del buffered[:end + 4 + length]
    return head[0], body

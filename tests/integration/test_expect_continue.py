"""`Expect: 100-continue` on a route of the worker's own table (POST /invocations), seen
byte by byte on a raw socket: the invitation goes out before the client sends its body
(a client such as curl or the AWS SDK otherwise waits a second or more, or forever),
the body is then read straight off the socket (body.py _read_sized), answered with the
model's prediction, and the connection carries the next request. A body that will be
refused is never invited: its 413 is the first thing the client hears."""

from __future__ import annotations

import io
import json
import select
import socket
import time

import numpy as np
import pytest
import requests

from tests.integration.http_raw import Reader, connect, json_request, request_bytes

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
JSON, NPY = "application/json", "application/x-npy"


def _encode(x: np.ndarray, content_type: str) -> bytes:
    if content_type == JSON:
        return json.dumps({"instances": x.tolist()}).encode()
    buffer = io.BytesIO()
    np.save(buffer, x)
    return buffer.getvalue()


def _read_head(sock: socket.socket, timeout: float = 10) -> bytes:
    """The bytes up to the first blank line (one response head), and no byte more."""
    deadline = time.monotonic() + timeout
    got = b""
    while b"\r\n\r\n" not in got:
        left = deadline - time.monotonic()
        assert left > 0, f"no whole response head within {timeout} s; got {got!r}"
        sock.settimeout(left)
        byte = sock.recv(1)
        assert byte, f"the server closed after {got!r}"
        got += byte
    return got


def _nothing_more(sock: socket.socket, wait: float = 0.2) -> bool:
    """No byte waits on the socket (nor comes within `wait`): the server is waiting for us."""
    readable, _, _ = select.select([sock], [], [], wait)
    return not readable


@pytest.mark.parametrize("content_type", [NPY, JSON], ids=["npy", "json"])
def test_expect_100_continue_invites_the_body_then_answers_it_and_the_next_request(example_server, digits,
                                                                                   content_type):
    x, y = digits
    x, y = x[:16], y[:16]
    body = _encode(x, content_type)
    # What the same request gets without the handshake: the prediction to compare with.
    plain = requests.post(example_server.url + "/invocations", data=body, timeout=10,
                          headers={"Content-Type": content_type, "Accept": JSON})
    assert plain.status_code == 200, plain.text
    # {"instances"} in answers {"predictions"}; .npy in, the bare array.
    unwrap = (lambda answer: answer["predictions"]) if content_type == JSON else (lambda answer: answer)
    expected = np.array(unwrap(plain.json()))

    sock = connect(example_server.port, timeout=10)
    try:
        sock.sendall(request_bytes("POST", "/invocations", headers={
            "Content-Type": content_type, "Accept": JSON, "Expect": "100-continue",
            "Content-Length": str(len(body))}))
        # The invitation, alone, before a byte of the body has been sent.
        assert _read_head(sock) == CONTINUE
        assert _nothing_more(sock), "the server answered before the body was sent"
        # The body, and a second request pipelined right behind it in the same send.
        second = json_request({"instances": x[:3].tolist()})
        sock.sendall(body + second)
        sock.settimeout(10)
        reader = Reader(sock)
        first_answer = reader.response()
        assert first_answer.status == 200, first_answer.body[:300]
        probabilities = np.array(unwrap(first_answer.json()))
        assert probabilities.shape == (16, 10)
        np.testing.assert_allclose(probabilities, expected, rtol=1e-5, atol=1e-6)
        assert (probabilities.argmax(axis=1) == y).mean() >= 0.9
        second_answer = reader.response()
        assert second_answer.status == 200, second_answer.body[:300]
        np.testing.assert_allclose(np.array(second_answer.json()["predictions"]), expected[:3], rtol=1e-5,
                                   atol=1e-6)
        # Nothing else came (no stray 100 or answer), and the connection is still open
        # for a third request.
        assert reader.buf == b"" and _nothing_more(sock, 0.05)
        sock.sendall(request_bytes("GET", "/ping"))
        assert reader.response().status == 200
    finally:
        sock.close()


def test_expect_100_continue_over_the_payload_limit_gets_the_413_and_no_invitation(example_server):
    """The default limit is SMSERVE_MAX_REQUEST_MB=100: a declared 200 MB is refused
    from the head alone, without inviting 200 MB the server would only drop."""
    sock = connect(example_server.port, timeout=10)
    try:
        sock.sendall(request_bytes("POST", "/invocations", headers={
            "Content-Type": NPY, "Expect": "100-continue", "Content-Length": str(200 << 20)}))
        head = _read_head(sock)
        assert head.startswith(b"HTTP/1.1 413 "), head
        assert CONTINUE not in head
        reader = Reader(sock)
        reader.buf = head
        answer = reader.response()
        assert answer.status == 413
        assert answer.headers["content-type"] == "application/json"
        assert "payload limit" in answer.json()["error"]
        assert answer.headers.get("connection") == "close"
        # Then the server closes (it reads nothing of a body it never asked for).
        sock.settimeout(10)
        assert sock.recv(1) == b""
    finally:
        sock.close()
    assert requests.get(example_server.url + "/ping", timeout=5).status_code == 200


@pytest.mark.parametrize("expect", ["foo", "100-continue, foo", "200-ok"])
def test_an_expectation_other_than_100_continue_is_417(example_server, expect):
    """RFC 9110 10.1.1: a server that does not meet an expectation answers 417 (it was 400)."""
    with connect(example_server.port, timeout=10) as sock:
        sock.sendall(request_bytes("POST", "/invocations", b"1,2", {"Content-Type": "text/csv", "Expect": expect}))
        answer = Reader(sock).response()
    assert answer.status == 417 and expect in answer.json()["error"], answer

"""Corners of the WebSocket transport: handshakes that must not switch protocols, a
client's Close right behind pipelined messages, and clients that stop reading (their
answers, or the pongs to their pings)."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import threading

import pytest

from tests.helpers.server import wait_until
from tests.integration.ws_raw import CLOSE, PATH, PING, Conn, frame, text

SEND_TIMEOUT_S = 1


@pytest.fixture(scope="module")
def echo_server(shared_server, echo_model_dir):
    """The echo model, whose answers are as big as the messages asked; a short send
    deadline, so that a client that stops reading is cut off soon."""
    return shared_server(echo_model_dir, {"SMSERVE_SEND_TIMEOUT": str(SEND_TIMEOUT_S)})


def key() -> str:
    return base64.b64encode(os.urandom(16)).decode()


def handshake_answer(port: int, extra_headers: bytes, after: bytes = b"", version: bytes = b"1.1") -> bytes:
    """The server's answer to a handshake with extra header lines (and bytes after the
    head): its status line."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        sock.sendall(b"GET " + PATH.encode() + b" HTTP/" + version + b"\r\nHost: x\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n" + extra_headers + b"\r\n" + after)
        conn = Conn(sock)
        return conn.response_head()
    finally:
        sock.close()


@pytest.mark.parametrize("keys", [
    [key(), key()],
    ["not a key", key()],  # the first unchecked, the last valid: no accept token from the first
    ["\u00e9t\u00e9", key()],  # a first key that is not even ASCII
], ids=["two-valid", "invalid-first", "non-ascii-first"])
def test_a_key_sent_twice_is_400(echo_server, keys):
    lines = b"".join(b"Sec-WebSocket-Key: " + k.encode("utf-8") + b"\r\n" for k in keys)
    assert handshake_answer(echo_server.port, lines).startswith(b"HTTP/1.1 400")
    assert "UnicodeEncodeError" not in echo_server.log()


def test_a_handshake_over_http_1_0_is_400(echo_server):
    """RFC 6455 4.1: a handshake is an HTTP/1.1 request (it was answered 101)."""
    key_line = b"Sec-WebSocket-Key: " + key().encode() + b"\r\n"
    assert handshake_answer(echo_server.port, key_line, version=b"1.0").startswith(b"HTTP/1.1 400")
    assert handshake_answer(echo_server.port, key_line).startswith(b"HTTP/1.1 101")


@pytest.mark.parametrize("body_headers, body", [
    (b"Content-Length: 5\r\n", b"hello"),
    (b"Transfer-Encoding: chunked\r\n", b"5\r\nhello\r\n0\r\n\r\n"),
], ids=["content-length", "chunked"])
def test_a_handshake_with_a_body_is_400(echo_server, body_headers, body):
    status = handshake_answer(echo_server.port, b"Sec-WebSocket-Key: " + key().encode() + b"\r\n" + body_headers, body)
    assert status.startswith(b"HTTP/1.1 400"), status


def test_a_handshake_with_an_empty_body_opens(echo_server):
    status = handshake_answer(echo_server.port, b"Sec-WebSocket-Key: " + key().encode() + b"\r\nContent-Length: 0\r\n")
    assert status.startswith(b"HTTP/1.1 101"), status


def test_a_close_right_behind_pipelined_messages_has_them_all_answered_first(echo_server):
    """Every message sent before the client's Close is answered, in order, then the
    Close is answered (1000): no answer in flight is dropped."""
    count = 300
    conn = Conn.open(echo_server.port)
    conn.send(b"".join(text(json.dumps({"x": [i]})) for i in range(count)) + frame(CLOSE, struct.pack("!H", 1000)))
    answers = []
    while True:
        got = conn.message()
        if got[0] == "close":
            break
        answers.append(json.loads(got[1]))
    conn.sock.close()
    assert answers == [[2.0 * i] for i in range(count)]
    assert got[1] == 1000


def _never_read(port: int, payload: bytes) -> socket.socket:
    """A session whose client sends payload and then reads nothing (a small receive
    buffer, so that the server's answers fill it soon)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    conn = Conn(sock)
    sock.sendall(f"GET {PATH} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: {key()}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    assert conn.response_head().startswith(b"HTTP/1.1 101")
    threading.Thread(target=_send_quietly, args=(sock, payload), daemon=True).start()
    return sock


def _send_quietly(sock, payload: bytes) -> None:
    try:
        sock.sendall(payload)
    except OSError:
        pass  # the server reset the connection


def _cut_off_cleanly(server, before: str) -> None:
    """The session ended at the send deadline as a client's doing: one INFO line that
    says so, no ERROR, no traceback, no 1011 blaming the model."""
    assert wait_until(lambda: "cut off" in server.log()[len(before):], timeout=SEND_TIMEOUT_S + 20), \
        server.log()[len(before):]
    log = server.log()[len(before):]
    # An earlier test's session may log its own close after `before` was taken: this
    # session's is the one line that tells a cut-off.
    closing = [line for line in log.splitlines() if "session from" in line and "closed" in line]
    cut = [line for line in closing if "cut off" in line]
    assert len(cut) == 1 and " closed 1006 " in cut[0] and "read nothing" in cut[0], closing
    assert "ERROR" not in log and "Traceback" not in log and "1011" not in log, log
    assert "error serving a connection" not in log, log


def test_a_client_that_stops_reading_its_answers_is_cut_off_quietly(echo_server):
    before = echo_server.log()
    big = json.dumps({"x": [123456.125] * 20000})  # answers of ~300 KB each
    sock = _never_read(echo_server.port, b"".join(text(big) for _ in range(20)))
    try:
        _cut_off_cleanly(echo_server, before)
    finally:
        sock.close()


def test_a_client_that_never_reads_its_pongs_is_cut_off_quietly(echo_server):
    before = echo_server.log()
    pings = frame(PING, b"p" * 125) * 60000  # ~8 MB of pongs owed
    sock = _never_read(echo_server.port, pings)
    try:
        _cut_off_cleanly(echo_server, before)
    finally:
        sock.close()

"""SIGTERM and WebSocket sessions: every message whose bytes reached the server before
the signal is answered, one answer per message, in order, then the session closes with
1001; nothing later is read. Held messages include those read ahead of the model (a
back-pressured session holds 64 and more in wsproto's buffer) and those still waiting
in the socket; a session whose handshake is answered after the signal is drained too."""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time

import pytest

from tests.helpers.models import echo_hooks, model_dir_with
from tests.helpers.server import all_read, listening, outgoing, pending_requests, wait_until
from tests.integration.ws_raw import TEXT, Conn, handshake, text

pytestmark = pytest.mark.slow

# Each message: {"x": [i], "sleep": s, "until": path, "pad": "..."}, answered [i] (input_fn
# read it: bare) after s seconds, or once the file at path exists.
ECHO_HOOKS = echo_hooks(times=1)

# The same model with a stream_fn for its sessions (POST /invocations still echoes).
STREAM_FN_HOOKS = ECHO_HOOKS + '''

def stream_fn(messages, model, context):
    for message in messages:
        data = json.loads(message)
        held(data)
        yield [float(x) for x in data["x"]]
'''

HOOKS = {"default": ECHO_HOOKS, "stream_fn": STREAM_FN_HOOKS}
GRACEFUL_S = 20
# How long the sender may take to fill every buffer (megabytes through a 4 KiB send
# buffer: seconds on a loaded machine) while the first message is held.
FILL_S = 40


@pytest.fixture(params=["default", "stream_fn"])
def server(request, make_server, tmp_path):
    return make_server(model_dir_with(tmp_path, HOOKS[request.param], request.param),
                       {"SMSERVE_GRACEFUL_TIMEOUT": str(GRACEFUL_S)})


def message(i: int, sleep: float = 0.0, pad: int = 0, until: str | None = None) -> bytes:
    return text(json.dumps({"x": [i], "sleep": sleep, "pad": "p" * pad, **({"until": until} if until else {})}))


def answers_until_close(conn: Conn) -> tuple[list[int], tuple]:
    """The ids answered, in the order they came, and the Close."""
    ids = []
    while True:
        got = conn.message()
        if got[0] == "close":
            return ids, got
        assert got[0] == TEXT, got
        ids.append(int(json.loads(got[1])[0]))


def session_log(server) -> tuple[int, int]:
    found = re.findall(r"closed 1001 after (\d+) message\(s\) in, (\d+) out", server.log())
    assert len(found) == 1, server.log()[-3000:]
    return int(found[0][0]), int(found[0][1])


def test_sigterm_answers_every_message_read_ahead_of_the_model(server):
    """100 messages pipelined: the first takes 2 s, so the session stops at 64 in
    hand with the rest already read off the socket. All 100 are held."""
    conn = Conn.open(server.port)
    conn.send(message(0, sleep=2) + b"".join(message(i) for i in range(1, 100)))
    assert wait_until(lambda: all_read(server, conn.sock)), "the server never read the messages off the socket"
    server.proc.send_signal(signal.SIGTERM)
    ids, close = answers_until_close(conn)
    assert ids == list(range(100)), ids
    assert close[1] == 1001
    conn.close()
    assert server.proc.wait(30) == 0
    assert session_log(server) == (100, 100)


# Tells a stalled sender by a pause in its progress: kept out of the parallel part of the
# suite, where a loaded machine can pause a sender that is not stalled.
@pytest.mark.serial
def test_sigterm_answers_the_messages_waiting_in_the_socket(server, tmp_path):
    """A sender that keeps sending until every buffer is full, the first message held
    by the model until the drain has begun: each message whose last byte reached the
    server before the signal is answered (those read ahead and those still in the
    server's socket), and no message after a gap."""
    size = 16 * 1024
    gate = tmp_path / "release"
    conn = Conn.open(server.port, sndbuf=4096)
    accepted = 0  # bytes the client's kernel took
    ends: list[int] = []  # where each message ends, in those bytes
    stop = threading.Event()

    def send():
        nonlocal accepted
        try:
            i = 0
            while not stop.is_set():
                data = memoryview(message(i, pad=size, until=str(gate) if i == 0 else None))
                while data:
                    n = conn.sock.send(data)
                    accepted += n
                    data = data[n:]
                ends.append(accepted)
                i += 1
        except OSError:
            pass

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    last, since = -1, time.monotonic()
    give_up = since + FILL_S
    while time.monotonic() - since < 0.4:  # until the sender has stalled
        assert time.monotonic() < give_up, "the sender never stalled while the first message was held"
        if accepted != last:
            last, since = accepted, time.monotonic()
        time.sleep(0.02)
    stop.set()
    # What the client's kernel still holds never reached the server.
    unsent = outgoing(conn.sock)
    reached = sum(1 for end in list(ends) if end <= accepted - unsent)
    server.proc.send_signal(signal.SIGTERM)
    assert reached > 70, reached  # the session holds 64; the rest waits in buffers
    assert wait_until(lambda: not listening(server.port)), "the worker never began its drain"
    gate.touch()
    ids, close = answers_until_close(conn)
    conn.sock.shutdown(socket.SHUT_RDWR)
    sender.join(10)
    conn.sock.close()
    assert ids == list(range(len(ids))), ids
    assert len(ids) >= reached, (len(ids), reached)
    assert close[1] == 1001
    assert server.proc.wait(30) == 0
    received, answered = session_log(server)
    assert received == answered == len(ids)


def test_a_session_whose_handshake_ends_after_sigterm_answers_what_came_with_it_then_1001(server):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    whole = handshake()
    head_line, rest = whole.split(b"\r\n", 1)
    sock.sendall(head_line + b"\r\n")
    assert wait_until(lambda: all_read(server, sock)), "the worker never read the request line"
    server.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    assert wait_until(lambda: not listening(server.port)), "the worker never began its drain"
    sock.sendall(rest + message(1) + message(2))  # two messages behind the handshake
    conn = Conn(sock)
    assert conn.response_head().startswith(b"HTTP/1.1 101")
    assert conn.message() == (TEXT, b'[1.0]')
    assert conn.message() == (TEXT, b'[2.0]')
    try:
        conn.send(message(3))  # sent after the signal: not read
    except OSError:
        pass
    got = conn.message()
    assert got[:2] == ("close", 1001), got
    conn.close()
    assert server.proc.wait(30) == 0
    assert time.monotonic() - signalled < GRACEFUL_S / 2


def test_a_handshake_waiting_on_a_kept_alive_connection_at_sigterm_is_drained(server):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    post = json.dumps({"x": [0], "sleep": 1}).encode()
    sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(post) + post + handshake() + message(5))
    assert wait_until(lambda: pending_requests(server) == 1), "the POST never reached its pass"
    server.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    conn = Conn(sock)
    status, body = conn.http_response()
    assert status.startswith(b"HTTP/1.1 200") and b"0.0" in body, (status, body)
    assert conn.response_head().startswith(b"HTTP/1.1 101")
    assert conn.message() == (TEXT, b'[5.0]')
    got = conn.message()
    assert got[:2] == ("close", 1001), got
    conn.close()
    assert server.proc.wait(30) == 0
    assert time.monotonic() - signalled < GRACEFUL_S / 2

"""A client that trickles its request a byte at a time: each byte comes long before any
per-read timeout could fire, but the whole head (or body) takes longer than its
deadline, SMSERVE_HEADER_TIMEOUT (SMSERVE_BODY_TIMEOUT). The deadline is the request's,
not each read's: the server answers 408 (or closes) at about that deadline instead of
being held for as long as the client likes, and /ping keeps answering meanwhile."""

from __future__ import annotations

import select
import socket
import threading
import time

import pytest
import requests

from tests.integration.http_raw import Reader, connect, request_bytes

# Small deadlines so that a test takes seconds; a byte every 50 ms is well within them.
HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0
BYTE_EVERY_S = 0.05
# The answer may come a little after the deadline (the loop's turn, a loaded machine:
# these run beside other tests), never much later; and never well before it, which load
# cannot cause (it only delays the server).
LATE_SLACK_S = 3.0
EARLY_SLACK_S = 0.3

CSV_HEAD = (b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: text/csv\r\n")
CSV_ROW = b",".join([b"1"] * 64) + b"\n"


@pytest.fixture(scope="module")
def trickle_server(shared_server, example_model_dir):
    return shared_server(example_model_dir, {"SMSERVE_HEADER_TIMEOUT": str(HEADER_TIMEOUT),
                                             "SMSERVE_BODY_TIMEOUT": str(BODY_TIMEOUT)})


class _Pings:
    """/ping on fresh connections every 50 ms from a thread, while the block runs."""

    def __init__(self, url: str):
        self.url = url
        self.results: list[tuple[object, float]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self._done.is_set():
            started = time.monotonic()
            try:
                status = requests.get(self.url + "/ping", timeout=2).status_code
            except requests.RequestException as e:
                status = type(e).__name__
            self.results.append((status, time.monotonic() - started))
            self._done.wait(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join(10)


def _trickle(sock: socket.socket, data: bytes, give_up_after: float) -> float | None:
    """Send data a byte every BYTE_EVERY_S until the server says anything (or closes);
    the seconds from the first byte to that moment, None if it never did within
    give_up_after (or the data ran out first)."""
    started = time.monotonic()
    for i in range(len(data)):
        readable, _, _ = select.select([sock], [], [], 0 if i == 0 else BYTE_EVERY_S)
        if readable:
            return time.monotonic() - started
        if time.monotonic() - started > give_up_after:
            return None
        try:
            sock.send(data[i:i + 1])
        except OSError:  # reset: the server has ended the connection
            return time.monotonic() - started
    readable, _, _ = select.select([sock], [], [], max(0.0, give_up_after - (time.monotonic() - started)))
    return time.monotonic() - started if readable else None


def _answer_or_close(sock: socket.socket):
    """The server's answer, or None when it closed (or reset) the connection without one."""
    sock.settimeout(5)
    try:
        return Reader(sock).response()
    except (ConnectionError, OSError):
        return None


def _trickled(server, prefix: bytes, trickled: bytes, deadline: float) -> tuple[object, float]:
    """Send prefix at once, then trickle; (the answer or None, seconds to it)."""
    # Far more bytes than the deadline lets through: were the deadline per read,
    # the request would still be arriving long after the test gave up.
    assert len(trickled) * BYTE_EVERY_S > 4 * (deadline + LATE_SLACK_S)
    sock = connect(server.port, timeout=10)
    try:
        with _Pings(server.url) as pings:
            if prefix:
                sock.sendall(prefix)
            elapsed = _trickle(sock, trickled, deadline + LATE_SLACK_S)
            answer = _answer_or_close(sock) if elapsed is not None else None
    finally:
        sock.close()
    assert elapsed is not None, f"still no answer {deadline + LATE_SLACK_S} s into a {deadline} s deadline"
    # /ping on its own connections answered all along.
    assert len(pings.results) >= 5, pings.results
    assert all(status == 200 for status, _ in pings.results), pings.results
    return answer, elapsed


def _assert_408_or_closed(answer, what: str):
    if answer is not None:
        assert answer.status == 408, (answer.status, answer.body[:300])
        assert answer.headers["content-type"] == "application/json"
        error = answer.json()["error"]
        assert isinstance(error, str) and what in error, error
        assert answer.headers.get("connection") == "close"


def test_a_head_trickled_past_the_header_timeout_is_ended_at_the_deadline(trickle_server):
    head = CSV_HEAD + b"X-Padding: " + b"a" * 600 + b"\r\nContent-Length: 1\r\n\r\n1"
    answer, elapsed = _trickled(trickle_server, b"", head, HEADER_TIMEOUT)
    assert HEADER_TIMEOUT - EARLY_SLACK_S <= elapsed <= HEADER_TIMEOUT + LATE_SLACK_S, elapsed
    _assert_408_or_closed(answer, "request head")
    assert requests.get(trickle_server.url + "/ping", timeout=2).status_code == 200


def test_a_second_head_trickled_on_a_kept_alive_connection_is_ended_at_the_deadline(trickle_server):
    """The head deadline holds for every request of a connection, not only its first."""
    sock = connect(trickle_server.port, timeout=10)
    try:
        sock.sendall(request_bytes("GET", "/ping"))
        reader = Reader(sock)
        assert reader.response().status == 200
        head = b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 600 + b"\r\n\r\n"
        with _Pings(trickle_server.url) as pings:
            elapsed = _trickle(sock, head, HEADER_TIMEOUT + LATE_SLACK_S)
            answer = _answer_or_close(sock) if elapsed is not None else None
    finally:
        sock.close()
    assert elapsed is not None, "the trickled second head was never ended"
    assert HEADER_TIMEOUT - EARLY_SLACK_S <= elapsed <= HEADER_TIMEOUT + LATE_SLACK_S, elapsed
    _assert_408_or_closed(answer, "request head")
    assert pings.results and all(status == 200 for status, _ in pings.results), pings.results


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_trickled_past_the_body_timeout_is_ended_at_the_deadline(trickle_server, framing):
    content = CSV_ROW * 8  # 1 KB: ~26 s at one byte per 50 ms
    if framing == "content-length":
        head = CSV_HEAD + b"Content-Length: %d\r\n\r\n" % len(content)
        body = content
    else:
        head = CSV_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
        body = b"".join(b"1\r\n" + content[i:i + 1] + b"\r\n" for i in range(len(content))) + b"0\r\n\r\n"
    answer, elapsed = _trickled(trickle_server, head, body, BODY_TIMEOUT)
    assert BODY_TIMEOUT - EARLY_SLACK_S <= elapsed <= BODY_TIMEOUT + LATE_SLACK_S, elapsed
    _assert_408_or_closed(answer, "request body")
    assert requests.get(trickle_server.url + "/ping", timeout=2).status_code == 200


def test_a_request_trickled_within_its_deadlines_is_served(trickle_server):
    """The control: the same trickle, short enough to end within both deadlines, is
    answered 200 (the deadline ends slow requests, not trickled ones)."""
    content = CSV_ROW  # one record, 128 bytes: well under a second when trickled a byte each 2 ms
    sock = connect(trickle_server.port, timeout=10)
    try:
        head = CSV_HEAD + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(content)
        sock.sendall(head)
        for i in range(len(content)):
            sock.send(content[i:i + 1])
            time.sleep(0.002)
        answer = _answer_or_close(sock)
    finally:
        sock.close()
    assert answer is not None and answer.status == 200, answer
    assert len(answer.json()) == 1  # a CSV request's JSON answer: the bare rows

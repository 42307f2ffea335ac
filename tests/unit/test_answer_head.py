"""The head of a route's answer (http/exchange.answer_head): what gunicorn's writer sent,
without its per-answer cost, and never a head a value could break."""

import email.utils
import json
import socket
import time

import pytest
from gevent import socket as gevent_socket

from smserve.http import connection, exchange


def _fields(head: bytes) -> tuple[str, dict[str, str]]:
    text = head.decode("latin-1")
    assert text.endswith("\r\n\r\n")
    status, *lines = text[:-4].split("\r\n")
    return status, dict(line.split(": ", 1) for line in lines)


def test_a_head_has_the_status_server_date_connection_the_routes_fields_and_the_length():
    head = exchange.answer_head((1, 1), 200, [("Content-Type", "application/x-npy")], 1234, close=False)
    status, fields = _fields(head)
    assert status == "HTTP/1.1 200 OK"
    assert fields["Server"] == "gunicorn"
    assert fields["Connection"] == "keep-alive"
    assert fields["Content-Type"] == "application/x-npy"
    assert fields["Content-Length"] == "1234"
    sent = email.utils.parsedate_to_datetime(fields["Date"]).timestamp()
    assert abs(sent - time.time()) < 5


def test_a_last_answer_says_close_and_a_204_has_no_length():
    status, fields = _fields(exchange.answer_head((1, 1), 204, [], None, close=True))
    assert status == "HTTP/1.1 204 No Content"
    assert fields["Connection"] == "close" and "Content-Length" not in fields


def test_the_date_is_made_once_a_second(monkeypatch):
    made = []
    real = connection.formatdate
    monkeypatch.setattr(connection, "formatdate", lambda *a, **k: made.append(a) or real(*a, **k))
    monkeypatch.setattr(connection, "_date", [0, ""])
    for _ in range(100):
        connection.http_date()
    assert 1 <= len(made) <= 2  # (2 when the second turned over meanwhile)


@pytest.mark.parametrize("value", ["a\r\nSet-Cookie: x=1", "a\nb", "a\rb", "a\0b"])
def test_a_value_that_would_break_the_head_is_refused(value):
    with pytest.raises(ValueError, match="X-Custom"):
        exchange.answer_head((1, 1), 200, [("X-Custom", value)], 0, close=False)


def test_a_value_outside_latin_1_is_refused():
    with pytest.raises(UnicodeEncodeError):
        exchange.answer_head((1, 1), 200, [("X-Custom", "snow\u2603")], 0, close=False)


def test_an_error_answer_has_server_and_date_too():
    ours, theirs = gevent_socket.socketpair()  # (the worker's sockets are gevent's)
    try:
        theirs.shutdown(socket.SHUT_WR)  # nothing more to read: the lingering read ends at once
        connection.send_error(ours, 413, "too big", {"Retry-After": "1"})
        answer = theirs.recv(65536)
    finally:
        ours.close()
        theirs.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status, fields = _fields(head + b"\r\n\r\n")
    assert status.startswith("HTTP/1.1 413 ")
    assert fields["Server"] == "gunicorn" and fields["Connection"] == "close" and fields["Retry-After"] == "1"
    assert abs(email.utils.parsedate_to_datetime(fields["Date"]).timestamp() - time.time()) < 5
    assert json.loads(body) == {"error": "too big"} and fields["Content-Length"] == str(len(body))


@pytest.mark.parametrize("body_size", [0, 1, 70_000, 3_000_000])
def test_head_and_body_leave_whole_and_in_order_through_partial_sends(body_size):
    """send_parts gathers head and body into sendmsg; a reader slower than the socket's
    buffer makes it send a part, a part's piece, or both parts' pieces at a time."""
    import gevent

    ours, theirs = gevent_socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % body_size
    body = bytes(range(256)) * (body_size // 256) + bytes(body_size % 256)
    got = bytearray()

    def read():
        while len(got) < len(head) + body_size:
            got.extend(theirs.recv(1000))

    try:
        reader = gevent.spawn(read)
        exchange.Sender(ours, 10).send_parts(head, memoryview(body))
        reader.join(timeout=30)
    finally:
        ours.close()
        theirs.close()
    assert bytes(got) == head + body

"""Writing answers: every send must make progress within the send deadline; error
answers close the connection after a bounded lingering read, so the client reads them."""

from __future__ import annotations

import re
import socket
import struct
import time
from email.utils import formatdate

import gevent
from gunicorn import SERVER
from gunicorn.http import wsgi
from gevent import socket as gevent_socket

from smserve.errors import json_error_body
from smserve.http.body import READ_SIZE, ClientError, Turn
from smserve.http.connection import Close
from smserve.routes.table import reason

# After an error answer, how long and how much of a request still arriving is read and
# dropped before the connection closes (see linger).
# (As nginx's lingering_timeout and lingering_time: a pause ends it, a steady sender
# gets the total.)
LINGER_IDLE_S = 2.0
LINGER_TOTAL_S = 10.0
LINGER_BYTES = 128 << 20


# What may not appear in a header's value: it would end the field, or the head.
_UNSAFE_VALUE = re.compile(r"[\r\n\0]")
_date = [0, ""]  # the second it was made for, the Date field's value


def http_date() -> str:
    """The Date field's value, made once a second rather than once an answer."""
    now = int(time.time())
    if _date[0] != now:
        _date[0], _date[1] = now, formatdate(now, usegmt=True)
    return _date[1]


def answer_head(version: tuple[int, int], status: int, headers: list[tuple[str, str]], length: int | None,
                close: bool) -> bytes:
    """The head of an answer our routes made, as gunicorn's response writer would send it
    (Server, Date, Connection, then the route's fields, Content-Length last), without
    its per-answer regular expressions and date formatting: the names are our code's,
    and a value is only checked for what would break the head. version: the request's
    (the answer speaks it, as gunicorn's does). length None: no Content-Length (a 204
    or 1xx)."""
    lines = [f"HTTP/{version[0]}.{version[1]} {status} {reason(status)}\r\nServer: {SERVER}\r\nDate: {http_date()}\r\n"
             f"Connection: {'close' if close else 'keep-alive'}\r\n"]
    for name, value in headers:
        if _UNSAFE_VALUE.search(value) is not None:
            raise ValueError(f"the answer's {name} field holds a line break or NUL")
        lines.append(f"{name}: {value}\r\n")
    if length is not None:
        lines.append(f"Content-Length: {length}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


class SendTimeout(Exception):
    """The client stopped reading its answer."""


def reset_on_close(sock) -> None:
    """Make the coming close() reset the connection (SO_LINGER 0), as nginx's
    reset_timedout_connection does for a client cut off at its send deadline: a plain
    close would leave the kernel holding the unsent answer in FIN-WAIT-1, trickling it
    out as the stalled client's window allows, for as long as it likes."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass


class Sender:
    """The connection as the response writer sees it: every send must make progress
    within the send deadline, so a client that stops reading cannot hold the worker's
    connection and the answer's memory for ever. A slow reader that keeps reading is
    served to the end."""

    def __init__(self, sock, timeout: float):
        self._sock = sock
        self._timeout = timeout

    def sendall(self, data) -> None:
        self._send_all([memoryview(data).cast("B")])

    def send_parts(self, head: bytes, body) -> None:
        """head, then body, in one system call where the socket takes them (sendmsg
        gathers them: no third buffer to join them in, a copy of the whole answer)."""
        self._send_all([memoryview(head), memoryview(body).cast("B")])

    def _send_all(self, parts: list[memoryview]) -> None:
        """Every byte of parts, in order, each sendmsg resuming where the last stopped."""
        raw = self._sock._sock  # the non-blocking OS socket under gevent's
        parts = [part for part in parts if part]
        while parts:
            try:
                sent = raw.sendmsg(parts)
            except (BlockingIOError, InterruptedError):
                gevent_socket.wait_write(raw.fileno(), timeout=self._timeout, timeout_exc=SendTimeout(
                    f"the client read nothing of its answer for {self._timeout:g} s (SMSERVE_SEND_TIMEOUT)"))
                continue
            while parts and sent >= len(parts[0]):
                sent -= len(parts.pop(0))
            if sent:
                parts[0] = parts[0][sent:]

    def __getattr__(self, name):
        return getattr(self._sock, name)


def send_error(sock, status: int, message: str, headers: dict[str, str] | None = None) -> None:
    """A JSON error answer, then the connection closes. Server and Date as on every
    other answer (RFC 9110 asks a Date of every 4xx a server with a clock sends)."""
    body = json_error_body(message)
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head = (f"HTTP/1.1 {status} {reason(status)}\r\nServer: {SERVER}\r\nDate: {http_date()}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n")
    try:
        with gevent.Timeout(5, False):
            sock.sendall(head.encode("latin-1") + body)
    except OSError:
        return
    if status != 408:  # a client that timed out is not sending
        linger(sock)


def linger(sock) -> None:
    """After an error answer the connection closes, but the client may still be sending
    the request that caused it (a body over the limit, the rest of a malformed one).
    Closing with its bytes unread makes the kernel reset the connection, and a reset can
    destroy the answer before the client has read it. So stop writing, then read and
    drop what still comes, for a bounded time and amount (as nginx's lingering close)."""
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        return
    dropped = 0
    turn = Turn()
    raw = sock._sock
    try:
        with gevent.Timeout(LINGER_TOTAL_S, False):
            while dropped < LINGER_BYTES:
                try:
                    data = raw.recv(READ_SIZE)
                except (BlockingIOError, InterruptedError):
                    # A client that has stopped sending is not waited for long.
                    gevent_socket.wait_read(raw.fileno(), timeout=LINGER_IDLE_S, timeout_exc=Close)
                    continue
                if not data:
                    return
                dropped += len(data)
                turn.take()
    except (OSError, Close):
        pass


def wsgi_request(req, sender, addr, listener_name, cfg):
    """gunicorn's response writer and WSGI environ for a request the app answers. A head
    the environ cannot be built from (a SCRIPT_NAME header that is no prefix of the
    path, say) is the client's error."""
    try:
        resp, environ = wsgi.create(req, sender, addr, listener_name, cfg)
    except Exception as e:  # noqa: BLE001 - gunicorn raises plain exceptions for bad heads
        raise ClientError(400, f"malformed request head: {type(e).__name__}: {e}") from None
    environ["wsgi.multithread"] = True
    return resp, environ

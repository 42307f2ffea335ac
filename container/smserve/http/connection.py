"""One client connection as the worker holds it: its deadlines, its request heads, and
its closing.

The connection: what it is doing now, and how a wait for its request bytes can be ended
(by an eviction at the connection cap, or the drain at SIGTERM) without touching a
connection whose bytes have arrived. Its heads: a plain one (an origin-form target,
HTTP/1.0 or 1.1, `Name: value` lines of allowed bytes) is read in one pass by two
regular expressions, each field then judged by gunicorn's own header policy, so the
request comes out exactly as gunicorn's parser makes it, at less cost; anything else (a
head not all read yet, a bare LF, obsolete line folding, a limit reached, an odd target
or method, the PROXY protocol) goes to gunicorn's parser from its first byte. Its
closing: an error answer, then a bounded lingering read so the client reads it; a client
cut off at the send deadline is reset."""

from __future__ import annotations

import logging
import re
import resource
import socket
import struct
import time
from email.utils import formatdate

import gevent
from gevent import hub
from gevent import socket as gevent_socket
from gunicorn import SERVER
from gunicorn.http.message import Request
from gunicorn.http.parser import RequestParser

from smserve import memo
from smserve.errors import json_error_body
from smserve.http.body import READ_SIZE, ClientError, Turn
from smserve.routes.table import reason

log = logging.getLogger(__name__)


class Close(Exception):
    """Ends a connection that is waiting for a request: idle at shutdown, or evicted."""


class Connection:
    """One client connection, and what it is doing now."""

    __slots__ = ("sock", "greenlet", "waiting_since", "busy", "reading_head", "parked", "ending", "deadline",
                 "late", "idle_until")

    def __init__(self, sock):
        self.sock = sock
        self.greenlet = gevent.getcurrent()
        self.waiting_since = time.monotonic()  # waiting for this request's head since
        self.busy = False  # a request is being read or answered
        self.reading_head = False  # between its first byte and its end
        # The I/O watcher this connection is parked on while it waits for request-head
        # bytes (between requests, or in the middle of a head); None at any other time.
        self.parked = None
        self.ending = False  # an eviction or the drain has asked it to end
        # When the part of a request now being read (its head, its body) must have
        # arrived by (time.monotonic), and the error to answer if it has not: checked
        # only when a read has to wait, so a request whose bytes are there pays no timer.
        self.deadline: float | None = None
        self.late: tuple[int, str] | None = None
        # While it waits for a request between requests: until when it may (the worker's
        # sweep ends it after that; no timer per wait).
        self.idle_until: float | None = None

    def expect_by(self, seconds: float, status: int, message: str) -> None:
        self.deadline = time.monotonic() + seconds
        self.late = (status, message)

    def remaining(self) -> float | None:
        """Seconds left until the deadline (None: none); past it, the late answer's error."""
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self.late_error()
        return left

    def late_error(self) -> Exception:
        return ClientError(*self.late)

    def end_wait(self) -> None:
        """End the connection if, and only if, it is still parked waiting for request
        bytes. gevent delivers the exception later, from the loop, and only while that
        same watcher is still waited on: a connection that meanwhile got its bytes and
        went on to read a body or answer is not touched (a kill() would land wherever
        it had got to, mid-request)."""
        if self.parked is not None and not self.ending:
            self.ending = True
            gevent_socket.cancel_wait(self.parked, Close())

    def wait_idle(self, seconds: float) -> None:
        """Wait up to `seconds` for a request's first bytes (Close past that, raised by
        the worker's sweep: idle_ended)."""
        self.idle_until = time.monotonic() + seconds
        try:
            self.wait_for_request_bytes()
        finally:
            self.idle_until = None

    def idle_ended(self, now: float) -> None:
        """The worker's sweep: end the wait of a connection idle past its time."""
        if self.idle_until is not None and self.idle_until <= now:
            self.end_wait()

    def wait_for_request_bytes(self, timeout: float | None = None, timeout_exc: Exception | type = Close) -> None:
        """Park until the socket is readable (or timeout: timeout_exc). Ended by
        end_wait(), unless bytes arrived meanwhile: then it goes on to read them."""
        # A watcher of its own for each wait: an end_wait() lands later, from the loop,
        # and only on the watcher it was meant for (a kept watcher would take it into
        # the next wait, in the middle of the next request's head).
        watcher = hub.get_hub().loop.io(self.sock.fileno(), 1)
        self.parked = watcher
        try:
            gevent_socket.wait(watcher, timeout, timeout_exc)
        except Close:
            if not bytes_waiting(self.sock):
                raise
        finally:
            self.parked = None
            self.ending = False
            watcher.close()


class RequestSource:
    """The socket as gunicorn's parser reads it. A read that has to wait does so in
    wait_for_request_bytes while the request's head is being read, so that an eviction
    can end a client stalled mid-head; a body's reads wait as any socket read does."""

    __slots__ = ("conn", "raw")

    def __init__(self, conn: Connection):
        self.conn = conn
        self.raw = conn.sock._sock  # the non-blocking OS socket under gevent's

    def recv(self, size: int) -> bytes:
        while True:
            try:
                return self.raw.recv(size)
            except (BlockingIOError, InterruptedError):
                pass
            conn = self.conn
            left = conn.remaining()
            late = conn.late_error() if left is not None else None
            if conn.reading_head:
                conn.wait_for_request_bytes(left, late)
            else:
                gevent_socket.wait_read(self.raw.fileno(), timeout=left, timeout_exc=late)


# How often idle connections are looked at: a keepalive or first-request wait ends up to
# this much after its time.
IDLE_SWEEP_S = 0.1


def sweep_idle(connections: dict) -> None:
    """End connections idle past their time (keepalive between requests, the header
    timeout before a first one): one pass every IDLE_SWEEP_S, run by the worker for as
    long as it accepts, instead of a timer made and cancelled around every wait."""
    while True:
        gevent.sleep(IDLE_SWEEP_S)
        now = time.monotonic()
        for conn in list(connections.values()):
            try:
                conn.idle_ended(now)
            except Exception:  # noqa: BLE001 - one connection's fault must not end every timeout
                log.exception("ending an idle connection failed")


def make_room(connections: dict, cap: int) -> None:
    """At the connection cap, end the connection that has waited longest for request
    bytes: idle between requests, or stalled in the middle of a request's head. One
    whose bytes have arrived, one reading a body or being answered, and a WebSocket
    session are never ended."""
    if len(connections) < cap:
        return
    waiting = sorted((c for c in connections.values() if c.parked is not None and not c.ending),
                     key=lambda c: c.waiting_since)
    for conn in waiting:
        if not bytes_waiting(conn.sock):
            conn.end_wait()
            return


def bytes_waiting(sock) -> bool:
    """Whether the socket holds unread bytes (or an end of file): a non-blocking check,
    on the raw descriptor, so gevent never parks the caller."""
    try:
        sock._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        pass  # reset or broken: reading it ends the connection promptly
    return True  # a byte, or the end of file


def buffered(parser) -> bool:
    """Bytes of a next (pipelined) request already read off the socket."""
    return parser.unreader.buf.getbuffer().nbytes > 0


# After an error answer, how long and how much of a request still arriving is read and
# dropped before the connection closes (see linger).
# (As nginx's lingering_timeout and lingering_time: a pause ends it, a steady sender
# gets the total.)
LINGER_IDLE_S = 2.0
LINGER_TOTAL_S = 10.0
LINGER_BYTES = 128 << 20

_date = [0, ""]  # the second it was made for, the Date field's value


def http_date() -> str:
    """The Date field's value, made once a second rather than once an answer."""
    now = int(time.time())
    if _date[0] != now:
        _date[0], _date[1] = now, formatdate(now, usegmt=True)
    return _date[1]


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


def connection_cap(setting: int, workers: int) -> int:
    """The configured cap, but never more than this process may open: raise the soft
    descriptor limit to the hard one and keep room for files and the model."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return max(16, min(setting, soft - 128))


class SettledConfig:
    """gunicorn's config as its request parser reads it, a dozen settings per request:
    each Config attribute is a lookup through its settings table (`__getattr__`, then
    the setting's `get()`), a large share of a head's parse. A worker's config no
    longer changes once it runs (a reload starts new workers), so each value is looked
    up once and kept as a plain attribute."""

    def __init__(self, cfg):
        self._cfg = cfg
        # Each peer address's trust for forwarded headers (PlainHeadRequest, below), as gunicorn
        # decides it from forwarded_allow_ips.
        self.trusted_peers: dict[str, bool] = {}

    def __getattr__(self, name):
        value = getattr(self._cfg, name)
        setattr(self, name, value)
        return value


# The methods a model server is asked with; any other goes to gunicorn's parser.
_METHODS = rb"GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH"
# origin-form only: "/" then visible ASCII, no '#' (a fragment) and not "//" (which
# gunicorn reads specially), ending in HTTP/1.0 or HTTP/1.1.
_REQUEST_LINE = re.compile(rb"(" + _METHODS + rb") (/(?!/)[!-\"$-~]*) HTTP/1\.([01])\r\n")
# RFC 9110's token for a name; a value of field-vchar, SP and HTAB (obs-text included,
# as gunicorn takes it), its surrounding blanks dropped as gunicorn drops them. A field
# starts a line (only those cover the head): the search tries no start inside a line,
# each of which would scan that line's rest again (quadratic in a long line).
_FIELD = re.compile(rb"(?<=\n)([!#$%&'*+\-.^_`|~0-9A-Za-z]+):([\t\x20-\x7e\x80-\xff]*)\r\n")
_BLANKS = b" \t"

# Peers whose trust for forwarded headers is known (the answer depends only on the
# address and the worker's fixed configuration), at most this many.
TRUSTED_PEERS_MAX = 1024


class PlainHeadRequest(Request):
    """gunicorn's Request, read in one pass when its head is plain (module docstring)."""

    def parse(self, unreader):
        buf = bytearray()
        self.read_into(unreader, buf, stop=True)
        if self.cfg.proxy_protocol == "off":
            rest = self._parse_plain(buf)
            if rest is not None:
                return rest
        unreader.unread(bytes(buf))  # from its first byte, as if never looked at
        return super().parse(unreader)

    def _parse_plain(self, buf: bytearray) -> bytes | None:
        """The part of buf after a plain head, with this request filled in from it;
        None (and nothing filled in) when the head is not plain or not all in buf."""
        end = buf.find(b"\r\n\r\n") + 2  # (the last field's line end)
        if end < 2 or end + 2 > self.max_buffer_headers:
            return None
        line = _REQUEST_LINE.match(buf)
        if line is None or 0 < self.limit_request_line < line.end() - 2:
            return None
        fields = list(_FIELD.finditer(buf, line.end(), end))
        sizes = [f.end() - f.start() for f in fields]
        limit = self.limit_request_field_size
        # Matches found one after another cover the head only when no byte between them
        # was left out: a line no field matches makes the sum fall short.
        if (sum(sizes) != end - line.end() or len(fields) > self.limit_request_fields
                or (limit > 0 and max(sizes, default=0) > limit)):
            return None
        self.method = line.group(1).decode("ascii")
        self.uri = line.group(2).decode("ascii")
        self.path, _, self.query = self.uri.partition("?")
        self.fragment = ""
        self.version = (1, 1) if line.group(3) == b"1" else (1, 0)
        headers = []
        scheme_state = [False]
        seen = set()
        secure_scheme_headers, forwarder_headers = self._peer_trusted_for_forwarded()
        policy = self._apply_header_policy
        for field in fields:
            name, value = field.groups()
            kept = policy(name.decode("ascii").upper(), value.strip(_BLANKS).decode("latin-1"), scheme_state, seen,
                          secure_scheme_headers, forwarder_headers)
            if kept is not None:
                headers.append(kept)
        self.headers = headers
        return bytes(memoryview(buf)[end + 2:])

    def _peer_trusted_for_forwarded(self):
        """gunicorn's answer, looked up once per peer address: it parses the address
        on every request otherwise (a SettledConfig holds the answers)."""
        peers = getattr(self.cfg, "trusted_peers", None)
        if peers is None or not isinstance(self.peer_addr, tuple):
            return super()._peer_trusted_for_forwarded()
        host = self.peer_addr[0]
        trusted = peers.get(host)
        if trusted is None:
            trusted = memo.keep(peers, host, self._peer_is_trusted_proxy(), TRUSTED_PEERS_MAX)
        return (self.cfg.secure_scheme_headers, self.cfg.forwarder_headers) if trusted else ({}, [])


class PlainHeadParser(RequestParser):
    mesg_class = PlainHeadRequest

"""A connection handed to the worker that holds a request's stateful session.

SageMaker pins a session to an instance; inside it, the session's state lives in the
worker that opened it, and the kernel gives each new connection to whichever worker
accepts first (SageMaker's load balancer also keeps connections alive and sends any
session's requests down any of them). So a worker that reads the head of a request of
a session held by a sibling (the session ID names its worker: core/session_ids.py)
hands it the connection: the socket itself (SCM_RIGHTS over a Unix socket between the
two), the request's head as read, and every byte read after it. The sibling serves the
connection from then on as if it had accepted it, this request first; a later request
on it for another worker's session moves it again.

Why not the alternatives: SO_REUSEPORT steering picks a worker per connection before
any request is read, and one connection carries many sessions' requests; proxying the
request to the owner over a local socket copies every body and answer twice more and
needs a relay for streamed answers; one worker owning every session would put all of
them, and their forward passes, on one GPU. A hand-off costs one sendmsg and one
recvmsg, and the connection's later requests of that session cost nothing.

Wire format, per hand-off on a stream socket between two workers: 8 bytes (the lengths
of a JSON note and of the request's bytes) with the descriptor attached, then the note
({"peer": [host, port]}) and the bytes. One sender at a time per sibling.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import struct

import gevent
from gevent import socket as gevent_socket
from gevent.lock import Semaphore

from smserve import files, metrics
from smserve.core import session_ids

log = logging.getLogger(__name__)

_LENGTHS = struct.Struct("!II")
# The most a hand-off's note and bytes may hold (a head within gunicorn's limits and
# what was read after it fit many times over).
MAX_HANDOFF_BYTES = 4 * 1024 * 1024
CONNECT_TIMEOUT_S = 2.0


class HandoffRefused(Exception):
    """The sibling could not take the connection (it is gone, or starting again)."""


def socket_path(state_dir: str, worker: int) -> str:
    return os.path.join(state_dir, f"handoff-{worker}.sock")


_SESSION_HEADER = session_ids.SESSION_ID.upper()


def session_header(req) -> str | None:
    """The request's X-Amzn-SageMaker-Session-Id, as gunicorn parsed it."""
    for name, value in req.headers:
        if name == _SESSION_HEADER:
            return value
    return None


def session_owner(req) -> int | None:
    """The worker that holds the request's session, as its ID says; None for none."""
    return session_ids.owner(session_header(req))


def head_bytes(req) -> bytes:
    """A parsed request's head as bytes a parser reads back to the same request: its
    request line and the fields gunicorn kept (names upper-cased, as parsed)."""
    lines = [f"{req.method} {req.uri} HTTP/{req.version[0]}.{req.version[1]}\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in req.headers]
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


class Handoff:
    """One worker's end: it takes connections from its siblings, and hands them theirs."""

    def __init__(self, state_dir: str, worker: int):
        self.state_dir = state_dir
        self.worker = worker
        self._listener = None
        self._acceptor = None
        self._peers: dict[int, gevent_socket.socket] = {}
        self._sending: dict[int, Semaphore] = {}

    # ------------------------------------------------------------ taking

    def listen(self, take) -> None:
        """Take siblings' connections: take(sock, peer address, bytes already read)."""
        path = socket_path(self.state_dir, self.worker)
        files.remove(path)  # a predecessor's, killed before it could remove it
        listener = gevent_socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(64)
        self._listener = listener
        self._acceptor = gevent.spawn(self._accept, take)

    def _accept(self, take) -> None:
        while True:
            try:
                channel, _ = self._listener.accept()
            except OSError:
                return  # closed
            gevent.spawn(self._receive, channel, take)

    def _receive(self, channel, take) -> None:
        with channel:
            while True:
                try:
                    handed = _read_handoff(channel)
                except (OSError, ValueError) as e:
                    log.warning("a sibling's hand-off broke off: %s", e)
                    return
                if handed is None:
                    return  # the sibling closed its end
                sock, peer, data = handed
                take(sock, peer, data)

    def close(self) -> None:
        """Stop taking connections (the worker's drain is over) and let go of the siblings'."""
        if self._acceptor is not None:
            self._acceptor.kill(block=False)
        if self._listener is not None:
            self._listener.close()
            files.remove(socket_path(self.state_dir, self.worker))
        for channel in self._peers.values():
            channel.close()
        self._peers.clear()

    # ------------------------------------------------------------ handing

    def hand_off(self, worker: int, req, sock, peer, ahead: bytes) -> str | None:
        """Hand a connection whose request (parsed: req; read after its head: ahead)
        belongs to worker's session; None once handed, else why it could not be (the
        answer to the request: that worker, and the session's state, are gone)."""
        try:
            self.send(worker, sock, peer, head_bytes(req) + ahead)
            metrics.session_handoff()
            return None
        except HandoffRefused as e:
            return f"session {session_header(req)!r} is not open: the worker that held it is not serving ({e})"

    def send(self, worker: int, sock, peer, data: bytes) -> None:
        """Hand sock, its peer's address and the bytes read from it to worker; the
        caller then lets go of its own descriptor. HandoffRefused if it cannot."""
        note = json.dumps({"peer": list(peer) if isinstance(peer, tuple) else peer}).encode()
        if len(note) + len(data) > MAX_HANDOFF_BYTES:
            raise HandoffRefused(f"the request's head and what followed it ({len(data)} bytes) are too big to hand on")
        lock = self._sending.setdefault(worker, Semaphore())
        with lock:
            for attempt in (1, 2):  # a channel the sibling closed (it restarted) is made again, once
                channel = self._channel(worker)
                try:
                    channel.sendmsg([_LENGTHS.pack(len(note), len(data))],
                                    [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", sock.fileno()))])
                    channel.sendall(note + data)
                    return
                except OSError as e:
                    self._peers.pop(worker, None)
                    channel.close()
                    if attempt == 2 or e.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                        raise HandoffRefused(f"worker {worker} does not take connections ({e.strerror})") from None

    def _channel(self, worker: int):
        channel = self._peers.get(worker)
        if channel is not None:
            return channel
        channel = gevent_socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        channel.settimeout(CONNECT_TIMEOUT_S)
        try:
            channel.connect(socket_path(self.state_dir, worker))
        except OSError as e:
            channel.close()
            raise HandoffRefused(f"worker {worker} does not take connections ({e.strerror or e})") from None
        self._peers[worker] = channel
        return channel


def _read_handoff(channel):
    """(socket, peer address, bytes) of the next hand-off on a channel; None at its end."""
    fd_space = socket.CMSG_SPACE(struct.calcsize("i"))
    head, ancillary, _, _ = channel.recvmsg(_LENGTHS.size, fd_space)
    fds = [fd for level, kind, payload in ancillary if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
           for fd in struct.unpack(f"{len(payload) // 4}i", payload[: len(payload) // 4 * 4])]
    if not head:
        for fd in fds:
            os.close(fd)
        return None
    if len(head) < _LENGTHS.size:
        head += _exactly(channel, _LENGTHS.size - len(head))
    note_length, data_length = _LENGTHS.unpack(head)
    if len(fds) != 1 or note_length + data_length > MAX_HANDOFF_BYTES:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"a hand-off with {len(fds)} descriptors and {note_length + data_length} bytes")
    body = _exactly(channel, note_length + data_length)
    peer = json.loads(body[:note_length])["peer"]
    sock = gevent_socket.socket(fileno=fds[0])
    return sock, tuple(peer) if isinstance(peer, list) else peer, body[note_length:]


def _exactly(channel, size: int) -> bytes:
    parts = []
    while size:
        part = channel.recv(min(size, 1 << 20))
        if not part:
            raise ValueError("the channel ended inside a hand-off")
        parts.append(part)
        size -= len(part)
    return b"".join(parts)

"""The WebSocket transport (RFC 6455) of bidirectional streaming: SageMaker's
InvokeEndpointWithBidirectionalStream.

SageMaker opens a WebSocket to `/invocations-bidirectional-stream` on the serving port
(or the path its caller chose: any path that is not a route), with the caller's query
string, and maps payload parts to frames one to one: UTF8 parts are text frames, BINARY
parts binary frames, a run of PARTIAL parts one fragmented message. This module is the
connection's side (as uvicorn keeps wsproto's framing apart from the app): the handshake,
frames in and out, pings, sends within the send deadline, the closing handshake, the
drain at SIGTERM. What messages mean is the session's (streaming/), which gets each
complete message and hands back what to send.

A session runs in the worker's gevent loop like any connection. It ends with a close
code (streaming.session.CloseReason): 1000 when the client or the stream_fn closed,
1001 at SIGTERM once the messages held are answered, 1008/1009/1011/1013 from the
session; a client that stops reading is cut off at the send deadline without a Close.
"""

from __future__ import annotations

import fcntl
import io
import logging
import socket
import sys
import termios
import time
from dataclasses import dataclass, field
from typing import Callable

import gevent
from gevent import socket as gevent_socket
from gevent.lock import Semaphore
from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage
from wsproto.frame_protocol import FrameProtocol
from wsproto.utilities import LocalProtocolError

from smserve import metrics
from smserve.http import access
from smserve.http.body import Turn, joined_headers
from smserve.http.connection import SendTimeout, reset_on_close, send_error
from smserve.http.websocket_handshake import (PATH, HandshakeRefused, accept_response, check_handshake,
                                              check_session, offers_websocket)
from smserve.streaming.handlers import open_session
from smserve.streaming.session import CloseReason, Closing, SessionContext

__all__ = ["PATH", "offers_websocket", "serve"]

log = logging.getLogger(__name__)

READ_SIZE = 256 * 1024
# How long a closing handshake may take once our Close frame is sent.
CLOSE_WAIT_S = 2.0
# Why the reader stopped: the client's Close, the connection's end, the drain at SIGTERM.
CLOSED, GONE, DRAINED = "closed", "gone", "drained"


def serve(sock, writer, req, leftover: bytes, addr, *, server, settings, sessions: set,
          alive: Callable[[], bool]) -> None:
    """Run one session on a connection whose handshake request was just parsed; the
    connection ends with it. writer sends within the send deadline (exchange.Sender);
    sessions: the worker's open ones, which its drain walks; alive(): False once it
    drains. A session opened while the worker drains (its handshake was waiting at
    SIGTERM) drains at once: what came with the handshake is answered, then 1001."""
    started = time.monotonic()
    try:
        key = check_handshake(req)
        check_session(server, req)
    except HandshakeRefused as refused:
        send_error(sock, refused.status, refused.message, refused.headers)
        access.log_request((req, addr), refused.status, 0, started, route=PATH)
        return
    writer.sendall(accept_response(key))
    websocket = WebSocket(server, settings, sock, writer, req, leftover, addr)
    sessions.add(websocket)
    metrics.websocket_session(opened=True)
    # After the add: begin_drain clears `alive` before it walks the sessions, so each is told.
    if not alive():
        websocket.shutdown()
    try:
        websocket.run()
    finally:
        sessions.discard(websocket)
        metrics.websocket_session(opened=False)
        access.log_request((req, addr), 101, websocket.sent, started, route=PATH)
        log.info("session from %s closed %d after %d message(s) in, %d out%s", access.peer(addr),
                 websocket.close_code or 0, websocket.received, websocket.answered,
                 f", cut off: {websocket.cut_off}" if websocket.cut_off else "")


@dataclass
class _Inbound:
    """One message whose frames are arriving."""

    text: bool
    parts: list = field(default_factory=list)
    size: int = 0
    # A binary message of several fragments grows in place: a join at the end would copy
    # the whole message in one step, the loop held.
    grown: io.BytesIO | None = None

    def add(self, data) -> None:
        if self.grown is not None:
            self.grown.write(data)
        elif self.parts and not self.text:
            self.grown = io.BytesIO()
            self.grown.write(self.parts.pop())
            self.grown.write(data)
        else:
            self.parts.append(data)

    def message(self):
        if self.grown is not None:
            return self.grown.getvalue()  # (hands the buffer over, no copy)
        if self.text:
            return "".join(self.parts)
        return self.parts[0] if self.parts else b""


class WebSocket:
    """One session's connection, from the 101 to the end of the closing handshake."""

    def __init__(self, server, settings, sock, writer, req, leftover: bytes, addr):
        self.server = server
        self.settings = settings
        self.sock = sock
        self.writer = writer
        # wsproto reads the client's frames and keeps the closing handshake's state.
        self.ws = Connection(ConnectionType.SERVER)
        # Data frames are framed apart from it: wsproto refuses to send one after the
        # client's Close, and a default session still answers what came before it.
        self.frames = FrameProtocol(client=False, extensions=[])
        self.leftover = leftover
        # The handshake's path and query (the caller may choose both), and its headers.
        self.context = SessionContext(joined_headers(req), req.path, req.query or "", access.peer(addr))
        self.session = None  # streaming.session.Session, once open
        self.write_lock = Semaphore()
        self.inbound: _Inbound | None = None
        self.reader = None
        self.close_code: int | None = None
        self.received = self.sent = 0
        self.remote_closed = False
        self.remote_close: CloseConnection | None = None
        self.draining = False
        # Why the session was cut off without a Close frame (the client stopped reading).
        self.cut_off: str | None = None
        # At SIGTERM: the bytes unread in the socket, which came before it: their messages are answered.
        self.held_unread = 0
        # The watcher the reader waits on for bytes; shutdown() cancels that wait.
        self.readable = None

    @property
    def answered(self) -> int:
        return self.session.answered if self.session is not None else 0

    # ------------------------------------------------------------ running

    def run(self) -> None:
        try:
            self.session = open_session(self.server, self.settings, self.context)
        except Closing as e:
            self._close(e.code, e.reason)
            return
        session = self.session
        answering = gevent.spawn(_quietly, session.answer, self.send)
        self.reader = gevent.spawn(_quietly, self._read)
        try:
            done = gevent.wait([self.reader, answering], count=1)[0]
            if done is self.reader and (self.reader.value == DRAINED or
                                        (self.reader.value == CLOSED and session.answers_after_close)):
                # SIGTERM, or the client's Close after messages it still wants answered:
                # the messages already received are answered, then the session closes.
                session.end_of_messages()
                answering.join()
                outcome = _outcome(answering)
            elif done is self.reader:
                # The client closed or vanished, or sent what cannot be read: no answer can reach it.
                session.end_of_messages()
                answering.kill(block=True, timeout=CLOSE_WAIT_S)
                outcome = _outcome(self.reader)
            else:
                self.reader.kill(block=True)
                outcome = _outcome(answering)
        finally:
            session.end_of_messages()
            self.reader.kill(block=False)
            answering.kill(block=False)
            if self.readable is not None:
                self.readable.close()
            session.release()
        self._end(outcome)

    def _end(self, outcome) -> None:
        """Close as the session's outcome says."""
        if isinstance(outcome, Closing):
            self._close(outcome.code, outcome.reason)
        elif isinstance(outcome, SendTimeout):
            self._cut(outcome)
        elif outcome == GONE or isinstance(outcome, (OSError, gevent.GreenletExit)):
            self.close_code = self.close_code or CloseReason.ABNORMAL_CLOSURE
        elif isinstance(outcome, BaseException):
            log.error("session failed: %s", outcome, exc_info=outcome)
            self._close(CloseReason.INTERNAL_ERROR, f"internal error: {type(outcome).__name__}")
        elif self.draining:
            self._close(CloseReason.GOING_AWAY, "server shutting down")
        else:
            self._close(CloseReason.NORMAL_CLOSURE, "")

    def shutdown(self) -> None:
        """SIGTERM: answer the messages held, then close 1001. Held: every complete
        message whose bytes reached the server before now, those already read and those
        still waiting in the socket; nothing that arrives later is read.

        The reader is never interrupted where it stands (a message it was handing on
        would be lost, a pong half written): it is woken only from its wait for bytes,
        and otherwise sees `draining` once the bytes in hand are taken apart."""
        if self.draining:
            return
        self.draining = True
        self.context.shutting_down = True
        if self.close_code is None and (self.reader is None or not self.reader.dead):
            self.held_unread = _unread(self.sock)
        if self.readable is not None:
            # Thrown only if the reader still waits on it when the hub gets to it.
            gevent_socket.cancel_wait(self.readable, _Stop())

    # ------------------------------------------------------------ reading

    def _read(self) -> str:
        """Frames in, until the client closes, the connection ends or we drain; which
        of those (CLOSED, GONE, DRAINED)."""
        if self.leftover:
            self._receive(self.leftover)
        raw = self.sock._sock  # non-blocking; the waits are ours (see _wait_readable)
        turn = Turn()
        while not self.remote_closed and not self.draining:
            try:
                data = raw.recv(READ_SIZE, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                self._wait_readable()
                continue
            if not data:
                return GONE
            self._receive(data)
            turn.take()  # a client streaming a big message must not hold the loop
        if self.remote_closed:
            return CLOSED
        # Draining: the messages completed by the bytes that were waiting at the signal
        # are held too. (A message still incomplete after them is not.)
        left = self.held_unread
        while left > 0 and not self.remote_closed:
            try:
                data = raw.recv(min(READ_SIZE, left), socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            if not data:
                return GONE
            left -= len(data)
            self._receive(data)
            turn.take()
        return CLOSED if self.remote_closed else DRAINED

    def _wait_readable(self) -> None:
        """Until the socket has bytes, or shutdown() cancels the wait."""
        if self.readable is None:
            self.readable = gevent.get_hub().loop.io(self.sock.fileno(), 1)
        try:
            gevent_socket.wait(self.readable)
        except _Stop:
            pass

    def _receive(self, data: bytes) -> None:
        self.ws.receive_data(data)
        for event in self.ws.events():
            if isinstance(event, (TextMessage, BytesMessage)):
                self._fragment(event)
            elif isinstance(event, Ping):
                self._write(self.frames.pong(event.payload))
            elif isinstance(event, CloseConnection):
                if self.ws.state is ConnectionState.REMOTE_CLOSING or self.ws.state is ConnectionState.CLOSED:
                    self.remote_closed = True
                    self.remote_close = event
                    return
                raise Closing(event.code, event.reason or "protocol error")  # a frame wsproto refused

    def _fragment(self, event) -> None:
        text = isinstance(event, TextMessage)
        if self.inbound is None:
            self.inbound = _Inbound(text)
        inbound = self.inbound
        data = event.data
        inbound.size += len(data.encode("utf-8")) if text else len(data)
        if inbound.size > self.settings.max_body_bytes:
            raise Closing(CloseReason.MESSAGE_TOO_BIG, f"message exceeds the payload limit of "
                          f"{self.settings.max_body_bytes} bytes ({self.settings.body_limit_setting})")
        if data:
            inbound.add(data)
        if event.message_finished:
            self.inbound = None
            self.received += 1
            metrics.websocket_message()
            self.session.deliver(inbound.message())

    # ------------------------------------------------------------ writing

    def send(self, data, finished: bool) -> None:
        """A data frame: text for a str, binary for bytes; the session's only way out.
        After the client's Close it still goes (a default session answers what came
        before it); after ours, never."""
        if self.ws.state not in (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING):
            raise OSError("the session is closed")
        self._write(self.frames.send_data(data, finished))

    def _write(self, data) -> None:
        with self.write_lock:
            if self.cut_off:
                raise OSError("the session was cut off")
            try:
                self.writer.sendall(data)
            except SendTimeout as e:
                # Whichever greenlet was sending: every other send now fails at once,
                # rather than waiting out the deadline again.
                self.cut_off = str(e)
                raise
            self.sent += len(data)

    def _cut(self, timeout: SendTimeout) -> None:
        """The client stopped reading: the connection is reset, as HTTP's answers are
        at the send deadline, with no Close frame (it could not be read either). Not the
        model's failure: the session's closing line says why, at INFO."""
        self.cut_off = self.cut_off or str(timeout)
        self.close_code = CloseReason.ABNORMAL_CLOSURE
        reset_on_close(self.sock)

    def _close(self, code: CloseReason, reason: str) -> None:
        """The closing handshake: our Close frame (or the answer to the client's), then
        a short wait for the client's, then the connection ends."""
        self.close_code = code
        try:
            if self.ws.state is ConnectionState.REMOTE_CLOSING:
                # The client closed first: echo its code, unless we have a reason of our own.
                response = self.remote_close.response()
                if code != CloseReason.NORMAL_CLOSURE:
                    response = CloseConnection(code=code, reason=reason)
                self.close_code = response.code
                self._write(self.ws.send(response))
                return
            if self.ws.state is ConnectionState.OPEN:
                self._write(self.ws.send(CloseConnection(code=code, reason=reason)))
        except SendTimeout as e:
            self._cut(e)
            return
        except (OSError, LocalProtocolError):
            return
        # Wait for the client's Close frame, answering nothing more.
        deadline = time.monotonic() + CLOSE_WAIT_S
        try:
            while self.ws.state is ConnectionState.LOCAL_CLOSING:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                gevent_socket.wait_read(self.sock.fileno(), timeout=left, timeout_exc=_Stop)
                data = self.sock.recv(READ_SIZE)
                if not data:
                    return
                self.ws.receive_data(data)
                for _ in self.ws.events():
                    pass
        except (_Stop, OSError, LocalProtocolError):
            return


class _Stop(Exception):
    """Stops a session's reader (draining) or its closing wait."""


def _quietly(fn, *args):
    """A session greenlet's body: how it ended (a Closing, a broken connection, a send
    timeout) comes back as its value, for WebSocket.run to act on, rather than as a
    printed traceback."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - WebSocket._end logs what is unexpected
        return e


def _outcome(greenlet):
    return greenlet.value if greenlet.successful() else greenlet.exception


def _unread(sock) -> int:
    """How many bytes wait unread in the socket's receive buffer (FIONREAD)."""
    count = bytearray(4)
    try:
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, count)
    except (OSError, ValueError):  # closed: nothing to read
        return 0
    return int.from_bytes(count, sys.byteorder, signed=True)

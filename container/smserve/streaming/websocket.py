"""Bidirectional streaming (SageMaker's InvokeEndpointWithBidirectionalStream).

SageMaker opens a WebSocket (RFC 6455) to `/invocations-bidirectional-stream` on the
serving port, with the caller's query string, and maps payload parts to frames one to
one: UTF8 parts are text frames, BINARY parts binary frames, a run of PARTIAL parts one
fragmented message. Frames are parsed by wsproto; the session runs in the worker's
gevent loop like any connection, and the model runs where HTTP requests run.

Two kinds of session:

- Default: every complete message is one request through the protocol table
  (protocols.answer), so the same codecs, dynamic batcher and inference thread as
  `POST /invocations`. Text messages are JSON (simple or KServe v2 JSON); binary
  messages take the connection's `content-type` query option (default
  application/x-npy). Answers go back one message per request, in order, in the
  `accept` option (default JSON for text, .npy for binary); a streamed answer is one
  fragmented message. Up to MAX_PENDING messages are worked on at once per session,
  so they batch with each other and with other sessions' messages.
- The model's `stream_fn(messages, model, context)`: one generator per session that
  reads messages (str for text, bytes for binary) and yields answers, keeping state
  for the life of the connection. It runs on a session thread, holding the model
  lock (shared with the inference thread) only while its own code runs.

Errors: a message the model cannot take gets a text message {"error", "status"} and
the session goes on; a message over the payload limit closes with 1009, an
unsupported query option with 1008, a failed model with 1011, a server shutting down
with 1001 once the messages it holds are answered.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import fcntl
import inspect
import io
import logging
import socket
import sys
import termios
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

import gevent
import orjson
from gevent import monkey
from gevent import socket as gevent_socket
from gevent.event import AsyncResult
from gevent.lock import Semaphore
from gevent.queue import Queue
from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage
from wsproto.utilities import LocalProtocolError, generate_accept_token

from smserve import metrics
from smserve.http import access, turns
from smserve.protocols import dispatch as protocols
from smserve.codecs import simple
from smserve.errors import HTTPError, PayloadTooLarge

log = logging.getLogger(__name__)

PATH = "/invocations-bidirectional-stream"
# Messages read ahead of their answers on one default session: enough to fill a
# batch, bounded so a client that never reads its answers stops being read.
MAX_PENDING = 64
READ_SIZE = 256 * 1024
# How long a closing handshake may take once our Close frame is sent.
CLOSE_WAIT_S = 2.0

NORMAL, GOING_AWAY, ABNORMAL, POLICY, TOO_BIG, SERVER_ERROR, TRY_AGAIN = 1000, 1001, 1006, 1008, 1009, 1011, 1013
# Why a session's reader stopped.
CLOSED, GONE, DRAINED = "closed", "gone", "drained"
# Answers of these types are text messages; everything else is binary.
TEXT_MEDIA = ("application/json", "application/jsonlines", "text/")
SESSION_OPTIONS = ("content-type", "accept")
TEXT_DEFAULT_TYPE = simple.JSON
BINARY_DEFAULT_TYPE = simple.NPY
BINARY_TYPES = (simple.NPY, simple.CSV, simple.JSON, simple.JSONLINES, protocols.OCTET_STREAM)

# Real-thread primitives: a stream_fn runs on a session thread that must block on them
# without the gevent hub (monkey-patching would otherwise hand it gevent's versions).
_RealQueue = monkey.get_original("queue", "SimpleQueue")
_END = object()


class Closing(Exception):
    """Ends a session with a WebSocket close code."""

    def __init__(self, code: int, reason: str):
        super().__init__(f"{code} {reason}")
        self.code = code
        self.reason = reason


@dataclass
class SessionContext:
    """What a stream_fn knows of its connection."""

    query: dict[str, str]
    headers: dict[str, str]
    peer: str
    # Set when the server begins to shut down (SIGTERM): finish, the messages end soon.
    shutting_down: bool = False


@dataclass
class _Inbound:
    text: bool
    parts: list = field(default_factory=list)
    size: int = 0
    # A binary message of several fragments grows in place here: joining them at the
    # end would copy the whole message at once (50 MB: tens of ms with the loop held).
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


# ---------------------------------------------------------------- the handshake


def handshake_error(req) -> tuple[int, str, dict[str, str]] | None:
    """Why this request cannot open a session (status, message, extra headers), or None."""
    headers = {name: value for name, value in req.headers}
    if req.method != "GET":
        return 405, f"{PATH} takes a WebSocket handshake (GET), not {req.method}", {"Allow": "GET"}
    upgrade = headers.get("UPGRADE", "").lower()
    connection = [token.strip().lower() for token in headers.get("CONNECTION", "").split(",")]
    if upgrade != "websocket" or "upgrade" not in connection:
        return 426, f"{PATH} speaks WebSocket only: send Upgrade: websocket and Connection: Upgrade", {
            "Upgrade": "websocket", "Sec-WebSocket-Version": "13"}
    if headers.get("SEC-WEBSOCKET-VERSION", "").strip() != "13":
        return 426, "only WebSocket version 13 (RFC 6455) is spoken", {"Sec-WebSocket-Version": "13"}
    try:
        key = headers.get("SEC-WEBSOCKET-KEY", "").strip()
        if len(base64.b64decode(key, validate=True)) != 16:
            raise ValueError
    except (ValueError, binascii.Error):
        return 400, "Sec-WebSocket-Key must be 16 bytes in base64", {}
    return None


def accept_response(req) -> bytes:
    key = next(value for name, value in req.headers if name == "SEC-WEBSOCKET-KEY").strip()
    token = generate_accept_token(key.encode("ascii")).decode("ascii")
    return (
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {token}\r\n\r\n"
    ).encode("ascii")


def serve(worker, sock, writer, req, leftover: bytes, addr) -> None:
    """Run one session on a connection whose handshake request was just parsed; the
    connection ends with it. A session that opens while the worker drains (its
    handshake was waiting at SIGTERM) drains at once: the messages that came with the
    handshake are answered, then 1001."""
    started = time.monotonic()
    environ = access.request_environ(req, addr)
    problem = handshake_error(req)
    if problem is not None:
        status, message, headers = problem
        worker.send_error(sock, status, message, headers)
        access.log_request(environ, status, 0, started, route=PATH)
        return
    writer.sendall(accept_response(req))
    session = Session(worker, sock, writer, req, leftover, addr)
    worker.sessions.add(session)
    metrics.websocket_session(opened=True)
    # After the add: begin_drain sets `alive` before it walks the sessions, so every
    # session is told, by begin_drain or here.
    if not getattr(worker, "alive", True):
        session.shutdown()
    try:
        session.run()
    finally:
        worker.sessions.discard(session)
        metrics.websocket_session(opened=False)
        access.log_request(environ, 101, session.sent, started, route=PATH)
        log.info("session from %s closed %s after %d message(s) in, %d out",
                 environ["REMOTE_ADDR"], session.close_code, session.received, session.answered)


# ---------------------------------------------------------------- a session


class Session:
    def __init__(self, worker, sock, writer, req, leftover: bytes, addr):
        self.worker = worker
        self.server = worker.model_server
        self.settings = worker.settings
        self.sock = sock
        self.writer = writer
        self.ws = Connection(ConnectionType.SERVER)
        self.leftover = leftover
        self.query = dict(parse_qsl(req.query or "", keep_blank_values=True))
        self.context = SessionContext(
            query=self.query,
            headers={name.lower(): value for name, value in req.headers},
            peer=access.peer(addr),
        )
        self.write_lock = Semaphore()
        self.inbound: _Inbound | None = None
        self.reader = None
        self.close_code: int | None = None
        self.received = self.answered = self.sent = 0
        self.remote_closed = False
        self.remote_close: CloseConnection | None = None
        self.draining = False
        # At SIGTERM: how many bytes were waiting unread in the socket. They reached the
        # server before the signal, so the messages they complete are held and answered.
        self.held_unread = 0
        # The watcher the reader waits on for bytes; shutdown() cancels that wait.
        self.readable = None
        # An answer of a text type was not valid text (logged once a session).
        self.warned_text = False
        # Default sessions: answers in the order their messages came.
        self.pending: Queue = Queue()
        self.slots = Semaphore(MAX_PENDING)
        # stream_fn sessions: the messages, for a real thread to read.
        self.inbox = None

    # ------------------------------------------------------------ running

    def run(self) -> None:
        try:
            self.server.check_ready()
            stream_fn = self.server.model.hooks.stream_fn
            options = self._options() if stream_fn is None else {}
            if stream_fn is not None and not self.server.open_stream_session():
                raise Closing(TRY_AGAIN, f"this worker holds its most stream_fn sessions "
                              f"({self.settings.max_sessions}, SMSERVE_MAX_SESSIONS); try again later")
        except Closing as e:
            self._close(e.code, e.reason)
            return
        except HTTPError as e:
            self._close(TRY_AGAIN if e.status == 503 else SERVER_ERROR, e.message)
            return
        if stream_fn is not None:
            self.inbox = _RealQueue()
            self.messages = _Messages(self.inbox, self.server.model_lock)
            self.delivered = 0
            answering = gevent.spawn(_quietly, self._run_stream_fn, stream_fn)
        else:
            self.text_type = TEXT_DEFAULT_TYPE
            self.binary_type = options.get("content-type", BINARY_DEFAULT_TYPE)
            self.accept = options.get("accept")
            answering = gevent.spawn(_quietly, self._send_answers)
        self.reader = gevent.spawn(_quietly, self._read)
        try:
            done = gevent.wait([self.reader, answering], count=1)[0]
            if done is self.reader and self.reader.value == DRAINED:
                # SIGTERM: the messages already received are answered, then 1001.
                self._end_of_messages()
                answering.join()
                outcome = _outcome(answering)
            elif done is self.reader:
                # The client closed or vanished, or sent what cannot be read: its
                # answers have nowhere to go.
                self._end_of_messages()
                answering.kill(block=True, timeout=CLOSE_WAIT_S)
                outcome = _outcome(self.reader)
            else:
                self.reader.kill(block=True)
                outcome = _outcome(answering)
        finally:
            self._end_of_messages()
            self.reader.kill(block=False)
            answering.kill(block=False)
            if self.readable is not None:
                self.readable.close()
            if stream_fn is not None:
                self.server.close_stream_session()
        if isinstance(outcome, Closing):
            self._close(outcome.code, outcome.reason)
        elif outcome == GONE or isinstance(outcome, (OSError, gevent.GreenletExit)):
            self.close_code = ABNORMAL
        elif isinstance(outcome, BaseException):
            log.error("session failed: %s", outcome, exc_info=outcome)
            self._close(SERVER_ERROR, f"internal error: {type(outcome).__name__}")
        elif self.draining:
            self._close(GOING_AWAY, "server shutting down")
        else:
            self._close(NORMAL, "")

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

    def _options(self) -> dict[str, str]:
        unknown = sorted(set(self.query) - set(SESSION_OPTIONS))
        if unknown:
            raise Closing(POLICY, f"unsupported query option(s) {', '.join(unknown)}; supported: "
                          f"{', '.join(SESSION_OPTIONS)}")
        options = {}
        if "content-type" in self.query:
            value = simple.media_type(self.query["content-type"])
            value = simple.ALIASES.get(value, value)
            if value not in BINARY_TYPES and not self.server.has_input_fn:
                raise Closing(POLICY, f"unsupported content-type {self.query['content-type']!r} for binary "
                              f"messages; supported: {', '.join(BINARY_TYPES)}")
            options["content-type"] = value
        if "accept" in self.query:
            value = self.query["accept"]
            if self.server.model.hooks.output_fn is None and not self.server.streams:
                try:
                    value = protocols.negotiate(value, simple.JSON)
                except HTTPError:
                    raise Closing(POLICY, f"unsupported accept {value!r}; supported: "
                                  f"{', '.join(simple.MEDIA_TYPES)}") from None
            options["accept"] = value
        return options

    # ------------------------------------------------------------ reading

    def _read(self) -> str:
        """Frames in, until the client closes, the connection ends or we drain; which
        of those (CLOSED, GONE, DRAINED)."""
        if self.leftover:
            self._receive(self.leftover)
        raw = self.sock._sock  # non-blocking; the waits are ours (see _wait_readable)
        turn = turns.Turn()
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
                self._send(event.response())
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
            raise Closing(TOO_BIG, f"message exceeds the payload limit of {self.settings.max_body_bytes} bytes "
                          f"({self.settings.body_limit_setting})")
        if data:
            inbound.add(data)
        if event.message_finished:
            self.inbound = None
            self.received += 1
            metrics.websocket_message()
            self._deliver(inbound.message())

    def _deliver(self, message) -> None:
        if self.inbox is not None:
            # Back-pressure: at MAX_PENDING unread messages, stop reading the socket.
            # (The session thread cannot signal a gevent primitive; poll its count.)
            while self.delivered - self.messages.taken >= MAX_PENDING:
                gevent.sleep(0.005)
            self.delivered += 1
            self.inbox.put(message)
            return
        self.slots.acquire()  # back-pressure: at MAX_PENDING, stop reading
        slot = AsyncResult()
        self.pending.put(slot)
        gevent.spawn(self._answer, message, slot)

    def _end_of_messages(self) -> None:
        if self.inbox is not None:
            self.inbox.put(_END)
        else:
            self.pending.put(None)

    # ------------------------------------------------------------ default sessions

    def _answer(self, message, slot: AsyncResult) -> None:
        if isinstance(message, str):
            body, content_type = message.encode("utf-8"), self.text_type
            accept = self.accept
        else:
            body, content_type = bytes(message), self.binary_type
            # .npy answers .npy unless the model's own hooks decide what they answer.
            builtin = content_type in simple.MEDIA_TYPES and not self.server.uses_byte_hooks
            accept = self.accept or (BINARY_DEFAULT_TYPE if builtin else None)
        try:
            reply = protocols.answer(protocols.Message(body, content_type, accept), self.server, self.settings)
        except BaseException as e:  # noqa: BLE001 - every outcome goes to the sender, in order
            slot.set(e)
            return
        slot.set(reply)

    def _send_answers(self) -> None:
        while True:
            slot = self.pending.get()
            if slot is None:
                return
            outcome = slot.get()
            try:
                if isinstance(outcome, protocols.Reply):
                    self._send_reply(outcome)
                else:
                    self._send_failure(outcome)
            finally:
                self.slots.release()
            self.answered += 1

    def _send_reply(self, reply: protocols.Reply) -> None:
        text = _Text(reply.media) if reply.media.startswith(TEXT_MEDIA) else None
        if not reply.streamed:
            self._send_message(bytes(reply.body) if text is None else text.piece(reply.body, final=True), True)
            self._check_text(text, f"an answer of type {reply.media}")
            return
        chunks = iter(reply.body)
        try:
            for chunk in chunks:
                self._send_message(bytes(chunk) if text is None else text.piece(chunk), False)
            self._send_message(b"" if text is None else text.end(), True)
            self._check_text(text, f"an answer of type {reply.media}")
        finally:
            close = getattr(chunks, "close", None)
            if close:
                close()

    def _check_text(self, text: _Text | None, what: str) -> None:
        if text is not None and text.invalid and not self.warned_text:
            self.warned_text = True
            log.warning("%s is not valid %s, but a text message must be: the bytes that are not were sent as "
                        "U+FFFD (logged once a session)", what, text.charset)

    def _send_failure(self, error: BaseException) -> None:
        if isinstance(error, PayloadTooLarge):
            raise Closing(TOO_BIG, error.message)
        if isinstance(error, HTTPError):
            if error.status >= 500 and error.status != 503:
                raise Closing(SERVER_ERROR, error.message)
            self._send_message(orjson.dumps({"error": error.message, "status": error.status}).decode(), True)
            return
        if isinstance(error, gevent.GreenletExit):
            raise error
        log.error("a session's message failed", exc_info=error)
        raise Closing(SERVER_ERROR, f"internal error: {type(error).__name__}: {error}")

    # ------------------------------------------------------------ stream_fn sessions

    def _run_stream_fn(self, stream_fn) -> None:
        """Drive the model's session generator on a session thread, one item a hop."""
        pool = self.server.session_pool
        lock = self.server.model_lock
        session = _call(pool, lock, _open_stream, stream_fn, self.messages, self.server.model.model, self.context)
        inner = None
        try:
            while True:
                item = _call(pool, lock, _next, session)
                if item is _END:
                    return
                if _is_iterator(item):
                    inner = item
                    self._send_fragmented(pool, lock, inner)
                    inner = None
                else:
                    self._send_item(item)
                self.answered += 1
        finally:
            self.inbox.put(_END)
            try:
                _call(pool, lock, _close_all, inner, session)
            except Exception:  # noqa: BLE001 - the session is over either way
                log.debug("closing a session's generator failed", exc_info=True)

    def _send_fragmented(self, pool, lock, items) -> None:
        """One fragmented message: a frame an item. The first item decides its type:
        bytes make a binary message, anything else text (str as it is, other values as
        a JSON line each)."""
        binary = None
        text = _Text()
        while True:
            piece = _call(pool, lock, _next, items)
            if piece is _END:
                break
            if binary is None:
                binary = isinstance(piece, (bytes, bytearray, memoryview))
            self._send_message(_item_payload(piece, None if binary else text, line=True), False)
        self._send_message(b"" if binary else text.end(), True)
        self._check_text(None if binary else text, "a stream_fn's text answer")

    def _send_item(self, item) -> None:
        if isinstance(item, (bytes, bytearray, memoryview)):
            self._send_message(bytes(item), True)
        elif isinstance(item, str):
            self._send_message(item, True)
        else:
            from smserve.streaming.streams import to_json

            self._send_message(to_json(item).decode("utf-8"), True)

    # ------------------------------------------------------------ writing

    def _send_message(self, data, finished: bool) -> None:
        event = TextMessage(data=data, message_finished=finished) if isinstance(data, str) else \
            BytesMessage(data=data, message_finished=finished)
        self._send(event)

    def _send(self, event) -> None:
        with self.write_lock:
            if self.ws.state not in (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING):
                raise OSError("the session is closed")
            if self.ws.state is ConnectionState.REMOTE_CLOSING and not isinstance(event, CloseConnection):
                raise OSError("the client closed the session")
            data = self.ws.send(event)
            self.writer.sendall(data)
            self.sent += len(data)

    def _close(self, code: int, reason: str) -> None:
        """The closing handshake: our Close frame (or the answer to the client's), then
        a short wait for the client's, then the connection ends."""
        self.close_code = code
        try:
            if self.ws.state is ConnectionState.REMOTE_CLOSING:
                # The client closed first: echo its code, unless we have a reason of our own.
                response = self.remote_close.response()
                if code != NORMAL:
                    response = CloseConnection(code=code, reason=reason)
                self.close_code = response.code
                self._send(response)
                return
            if self.ws.state is ConnectionState.OPEN:
                self._send(CloseConnection(code=code, reason=reason))
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


# ---------------------------------------------------------------- helpers


class _Messages:
    """The messages of a stream_fn session, read on its session thread. While it
    waits for the next message it lets go of the model lock, so other sessions and the
    inference thread run."""

    def __init__(self, inbox, lock):
        self.inbox = inbox
        self.lock = lock
        self.taken = 0  # messages handed to the stream_fn (read by the loop for back-pressure)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            item = self.inbox.get_nowait()
        except Exception:  # queue.Empty, from the real queue module
            self.lock.release()
            try:
                item = self.inbox.get()
            finally:
                self.lock.acquire()
        if item is _END:
            self.inbox.put(_END)  # every later call ends too
            raise StopIteration
        self.taken += 1
        return item


def _quietly(fn, *args):
    """A session greenlet's body: how it ended (a Closing, a broken connection) comes
    back as its value, for Session.run to act on, rather than as a printed traceback."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - Session.run logs what is unexpected
        return e


def _outcome(greenlet):
    return greenlet.value if greenlet.successful() else greenlet.exception


def _call(pool, lock, fn, *args):
    """fn on a session thread, holding the model lock; exceptions come back as values
    (the thread pool would print them) and are raised here."""
    ok, value = pool.apply(_locked, (lock, fn, args))
    if ok:
        return value
    raise value


def _locked(lock, fn, args):
    lock.acquire()
    try:
        return True, fn(*args)
    except BaseException as e:  # noqa: BLE001 - carried to the loop's side
        return False, e
    finally:
        lock.release()


def _open_stream(stream_fn, messages, model, context):
    try:
        session = stream_fn(messages, model, context)
        return iter(session)
    except (ValueError, HTTPError) as e:
        raise _client_error(e) from e
    except Exception as e:
        log.exception("stream_fn failed to start")
        raise Closing(SERVER_ERROR, f"model failed: {type(e).__name__}: {e}") from e


def _next(iterator):
    try:
        return next(iterator)
    except StopIteration:
        return _END
    except (ValueError, HTTPError) as e:
        raise _client_error(e) from e
    except Exception as e:
        log.exception("stream_fn failed")
        raise Closing(SERVER_ERROR, f"model failed: {type(e).__name__}: {e}") from e


def _client_error(e: Exception) -> Closing:
    """A stream_fn refusing its session (a bad query option, a message it cannot take):
    a ValueError or a 4xx HTTPError is the client's doing, 1008; a 5xx is 1011."""
    if isinstance(e, HTTPError) and e.status >= 500:
        return Closing(SERVER_ERROR, e.message)
    message = e.message if isinstance(e, HTTPError) else str(e)
    return Closing(POLICY, message)


def _close_all(*iterators) -> None:
    for iterator in iterators:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def _is_iterator(item) -> bool:
    if isinstance(item, (str, bytes, bytearray, memoryview, dict, list, tuple)):
        return False
    return inspect.isgenerator(item) or (hasattr(item, "__next__") and not hasattr(item, "shape"))


def _unread(sock) -> int:
    """How many bytes wait unread in the socket's receive buffer (FIONREAD)."""
    count = bytearray(4)
    try:
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, count)
    except (OSError, ValueError):  # closed: nothing to read
        return 0
    return int.from_bytes(count, sys.byteorder, signed=True)


class _Text:
    """The text of one text message whose bytes come in pieces (a streamed answer's
    chunks): each frame carries the characters complete so far, so a piece that ends
    inside a character leaves its last bytes to the next one (RFC 6455 lets a text
    message's fragments split a character; wsproto does not, each frame is a str).
    Bytes that are not text in the answer's charset (UTF-8 unless its Content-Type
    names another) come out as U+FFFD: the message stays text, as its type says."""

    def __init__(self, media: str = ""):
        self.charset = _charset(media)
        self.decoder = codecs.getincrementaldecoder(self.charset)("strict")
        self.invalid = False

    def piece(self, data, final: bool = False) -> str:
        try:
            return self.decoder.decode(data, final)
        except UnicodeDecodeError:
            # From here on with replacement, starting over at the bytes held back.
            pending = self.decoder.getstate()[0]
            self.decoder = codecs.getincrementaldecoder(self.charset)("replace")
            self.invalid = True
            return self.decoder.decode(pending + bytes(data), final)

    def end(self) -> str:
        """The message's last characters: an incomplete one left at the end is U+FFFD."""
        return self.piece(b"", final=True)

    @property
    def pending(self) -> bool:
        """Bytes of an incomplete character are held back."""
        return bool(self.decoder.getstate()[0])


def _charset(media: str) -> str:
    """The charset a Content-Type names, if Python knows it as a text encoding; else UTF-8."""
    for param in media.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            try:
                info = codecs.lookup(value.strip().strip('"'))
            except LookupError:
                break
            if getattr(info, "_is_text_encoding", True):  # (not base64, rot13, ...)
                return info.name
            break
    return "utf-8"


def _item_payload(item, text: "_Text | None", line: bool = False):
    """One item a stream_fn yielded, as a frame's payload of the message's type (text
    when `text` holds the message's decoder); other values than str and bytes as JSON
    (a line each, in a fragmented message)."""
    if isinstance(item, str):
        if text is None:
            return item.encode("utf-8")
        # (Behind the bytes of a character that the items before left incomplete.)
        return text.piece(item.encode("utf-8")) if text.pending else item
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item) if text is None else text.piece(item)
    from smserve.streaming.streams import to_json

    encoded = to_json(item) + (b"\n" if line else b"")
    return encoded if text is None else text.piece(encoded)


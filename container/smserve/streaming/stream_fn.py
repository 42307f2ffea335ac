"""A model's own WebSocket sessions: `stream_fn(messages, model, context)`, one generator
per session that reads messages (str for text, bytes for binary) and yields answers,
keeping state for the life of the connection.

It runs on a session thread, not the event loop, holding the model lock (shared with
the inference thread) only while its own code runs: between two yields, and while it
waits for the next message, the lock is free. A ValueError (or a 4xx) from it closes
the session with 1008, any other exception with 1011; when it returns, 1000.
"""

from __future__ import annotations

import logging

import gevent
from gevent import monkey

from smserve.core.reply import is_stream
from smserve.engine.worker.served import ServedModel
from smserve.errors import HTTPError
from smserve.streaming.session import MAX_PENDING, CloseReason, Closing, Send, Session, SessionContext
from smserve.protocols.streams import to_json
from smserve.streaming.text import TextPieces, item_payload

log = logging.getLogger(__name__)

# Real-thread primitives: a stream_fn runs on a session thread that must block on them
# without the gevent hub (monkey-patching would otherwise hand it gevent's versions).
_RealQueue = monkey.get_original("queue", "SimpleQueue")
_END = object()


class StreamFnSession(Session):
    # The client's Close ends the session: answers not yet sent are dropped and the
    # generator is closed (docs/streaming.md).
    answers_after_close = False

    def __init__(self, server: ServedModel, stream_fn, context: SessionContext):
        super().__init__()
        self.server = server
        self.stream_fn = stream_fn
        self.context = server.hook_contexts(context)
        self.inbox = _RealQueue()
        self.messages = _Messages(self.inbox, server.model_lock)
        self.delivered = 0

    def deliver(self, message) -> None:
        # Back-pressure: at MAX_PENDING messages the generator has not taken, stop
        # reading. (The session thread cannot signal a gevent primitive; poll its count.)
        while self.delivered - self.messages.taken >= MAX_PENDING:
            gevent.sleep(0.005)
        self.delivered += 1
        self.inbox.put(message)

    def end_of_messages(self) -> None:
        self.inbox.put(_END)

    def release(self) -> None:
        self.server.stream_sessions.give_back()

    def answer(self, send: Send) -> None:
        """Drive the model's session generator on a session thread, one item a hop."""
        pools, lock = self.server.pools, self.server.model_lock

        def call(fn, *args):
            return pools.on_session(lock, fn, *args)

        session = call(_open_stream, self.stream_fn, self.messages, self.server.model.model, self.context)
        inner = None
        try:
            while True:
                item = call(_next, session)
                if item is _END:
                    return
                if is_stream(item):
                    inner = item
                    self.check_text(_send_fragmented(send, call, inner), "a stream_fn's text answer")
                    inner = None
                else:
                    _send_item(send, item)
                self.answered += 1
        finally:
            self.inbox.put(_END)
            try:
                call(_close_all, inner, session)
            except Exception:  # noqa: BLE001 - the session is over either way
                log.debug("closing a session's generator failed", exc_info=True)


def _send_fragmented(send: Send, call, items) -> TextPieces | None:
    """One fragmented message: a frame an item. The first item decides its type: bytes
    make a binary message, anything else text (str as it is, other values as a JSON line
    each). The text sent, if it was a text message."""
    binary = None
    text = TextPieces()
    while True:
        piece = call(_next, items)
        if piece is _END:
            break
        if binary is None:
            binary = isinstance(piece, (bytes, bytearray, memoryview))
        send(item_payload(piece, None if binary else text, line=True), False)
    send(b"" if binary else text.end(), True)
    return None if binary else text


def _send_item(send: Send, item) -> None:
    if isinstance(item, (bytes, bytearray, memoryview)):
        send(bytes(item), True)
    elif isinstance(item, str):
        send(item, True)
    else:
        send(to_json(item).decode("utf-8"), True)


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


def _open_stream(stream_fn, messages, model, context):
    try:
        session = stream_fn(messages, model, context)
        return iter(session)
    except (ValueError, HTTPError) as e:
        raise _client_error(e) from e
    except Exception as e:
        log.exception("stream_fn failed to start")
        raise Closing(CloseReason.INTERNAL_ERROR, f"model failed: {type(e).__name__}: {e}") from e


def _next(iterator):
    try:
        return next(iterator)
    except StopIteration:
        return _END
    except (ValueError, HTTPError) as e:
        raise _client_error(e) from e
    except Exception as e:
        log.exception("stream_fn failed")
        raise Closing(CloseReason.INTERNAL_ERROR, f"model failed: {type(e).__name__}: {e}") from e


def _client_error(e: Exception) -> Closing:
    """A stream_fn refusing its session (a bad query option, a message it cannot take):
    a ValueError or a 4xx HTTPError is the client's doing, 1008; a 5xx is 1011."""
    if isinstance(e, HTTPError) and e.status >= 500:
        return Closing(CloseReason.INTERNAL_ERROR, e.message)
    message = e.message if isinstance(e, HTTPError) else str(e)
    return Closing(CloseReason.POLICY_VIOLATION, message)


def _close_all(*iterators) -> None:
    for iterator in iterators:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()

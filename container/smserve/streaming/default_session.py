"""Default WebSocket sessions (the model has no stream_fn): each complete message is one
request through the protocol table, so the same codecs, dynamic batcher and inference
thread as `POST /invocations`.

Text messages are JSON (simple or KServe v2 JSON); binary messages take the session's
`content-type` query option (default application/x-npy). Answers go back one message
per request, in order, in the `accept` option (default JSON for text, .npy for binary);
a streamed answer is one fragmented message. Up to MAX_PENDING messages are worked on
at once, so they batch with each other and with other sessions' messages. A message
the model cannot take gets a text message {"error", "status"} and the session goes on;
one over the payload limit closes with 1009, a failed model with 1011.
"""

from __future__ import annotations

import logging

import gevent
import orjson
from gevent.event import AsyncResult
from gevent.lock import Semaphore
from gevent.queue import Queue

from smserve.core import media
from smserve.core.reply import Reply
from smserve.engine.worker.served import ServedModel
from smserve.errors import HTTPError, PayloadTooLarge
from smserve.protocols import TABLE
from smserve.protocols.message import OCTET_STREAM, Message, negotiate
from smserve.streaming.session import MAX_PENDING, CloseReason, Closing, Send, Session, SessionContext
from smserve.streaming.text import TextPieces

log = logging.getLogger(__name__)

# Answers of these types are text messages; everything else is binary.
TEXT_MEDIA = ("application/json", "application/jsonlines", "text/")
OPTIONS = ("content-type", "accept")
TEXT_DEFAULT_TYPE = media.JSON
BINARY_DEFAULT_TYPE = media.NPY
BINARY_TYPES = (media.NPY, media.CSV, media.JSON, media.JSONLINES, OCTET_STREAM)


class DefaultSession(Session):
    # Each message was a request: what the client sent before its Close is answered.
    answers_after_close = True

    def __init__(self, server: ServedModel, settings, context: SessionContext):
        super().__init__()
        self.server = server
        self.settings = settings
        # Each message's hooks that take a context get one of their own, of this handshake.
        self.context = context
        options = _options(server, context.query)
        self.binary_type = options.get("content-type", BINARY_DEFAULT_TYPE)
        self.accept = options.get("accept")
        # Answers in the order their messages came: a slot each, None at the end.
        self.pending: Queue = Queue()
        self.slots = Semaphore(MAX_PENDING)

    def deliver(self, message) -> None:
        self.slots.acquire()  # back-pressure: at MAX_PENDING unanswered, stop reading
        slot = AsyncResult()
        self.pending.put(slot)
        gevent.spawn(self._work, message, slot)

    def end_of_messages(self) -> None:
        self.pending.put(None)

    def _work(self, message, slot: AsyncResult) -> None:
        if isinstance(message, str):
            body, content_type = message.encode("utf-8"), TEXT_DEFAULT_TYPE
            accept = self.accept
        else:
            body, content_type = bytes(message), self.binary_type
            # .npy answers .npy unless the model's own hooks decide what they answer.
            builtin = content_type in media.MEDIA_TYPES and not self.server.traits.byte_hooks
            accept = self.accept or (BINARY_DEFAULT_TYPE if builtin else None)
        try:
            message = Message(body, content_type, accept, context_of=self.context.for_message)
            reply = TABLE.answer(message, self.server, self.settings)
        except BaseException as e:  # noqa: BLE001 - every outcome goes to the sender, in order
            slot.set(e)
            return
        slot.set(reply)

    def answer(self, send: Send) -> None:
        while True:
            slot = self.pending.get()
            if slot is None:
                return
            outcome = slot.get()
            try:
                if isinstance(outcome, Reply):
                    self._send_reply(send, outcome)
                else:
                    self._send_failure(send, outcome)
            finally:
                self.slots.release()
            self.answered += 1

    def _send_reply(self, send: Send, reply: Reply) -> None:
        text = TextPieces(reply.media) if reply.media.startswith(TEXT_MEDIA) else None
        if not reply.streamed:
            send(bytes(reply.body) if text is None else text.piece(reply.body, final=True), True)
            self.check_text(text, f"an answer of type {reply.media}")
            return
        chunks = iter(reply.body)
        try:
            for chunk in chunks:
                send(bytes(chunk) if text is None else text.piece(chunk), False)
            send(b"" if text is None else text.end(), True)
            self.check_text(text, f"an answer of type {reply.media}")
        finally:
            close = getattr(chunks, "close", None)
            if close:
                close()

    def _send_failure(self, send: Send, error: BaseException) -> None:
        if isinstance(error, PayloadTooLarge):
            raise Closing(CloseReason.MESSAGE_TOO_BIG, error.message)
        if isinstance(error, HTTPError):
            if error.status >= 500 and error.status != 503:
                raise Closing(CloseReason.INTERNAL_ERROR, error.message)
            send(orjson.dumps({"error": error.message, "status": error.status}).decode(), True)
            return
        if isinstance(error, gevent.GreenletExit):
            raise error
        log.error("a session's message failed", exc_info=error)
        raise Closing(CloseReason.INTERNAL_ERROR, f"internal error: {type(error).__name__}: {error}")


def _options(server: ServedModel, query: dict[str, str]) -> dict[str, str]:
    """The session's query options, checked before any message is read: 1008 for one
    the model cannot take. `accept` is checked per answer instead when the model's own
    code may answer in other types (an output_fn) or stream (a predict_fn: only what it
    returns tells). Other options are refused, unless the model's hooks take a context:
    then they are the hooks' to read (context.query), as a stream_fn's are."""
    unknown = sorted(set(query) - set(OPTIONS))
    if unknown and not server.model.hooks.wants_context:
        raise Closing(CloseReason.POLICY_VIOLATION, f"unsupported query option(s) {', '.join(unknown)}; supported: "
                      f"{', '.join(OPTIONS)}")
    options = {}
    if "content-type" in query:
        value = media.media_type(query["content-type"])
        if value not in BINARY_TYPES and not server.traits.input_fn:
            raise Closing(CloseReason.POLICY_VIOLATION, f"unsupported content-type {query['content-type']!r} for "
                          f"binary messages; supported: {', '.join(BINARY_TYPES)}")
        options["content-type"] = value
    if "accept" in query:
        value = query["accept"]
        if server.model.hooks.output_fn is None and not server.traits.may_stream:
            try:
                value = negotiate(value, media.JSON)
            except HTTPError:
                raise Closing(CloseReason.POLICY_VIOLATION, f"unsupported accept {value!r}; supported: "
                              f"{', '.join(media.MEDIA_TYPES)}") from None
        options["accept"] = value
    return options

"""What every wire protocol shares: the message it answers (an HTTP body or a WebSocket
message), the protocol's interface, and the small rules more than one protocol follows."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

from smserve.codecs import v2
from smserve.core import media
from smserve.core.context import RequestContext
from smserve.core.reply import Reply
from smserve.engine.worker.served import ServedModel
from smserve.errors import Named500
from smserve.settings import Settings

OCTET_STREAM = "application/octet-stream"
# What Protocol.answer returns when the model's input_fn handed the body back
# (NotImplemented): the table is asked again, and the built-in codecs take it.
HANDED_BACK = object()


@dataclass
class Message:
    """One request, whatever carried it: an HTTP body or a WebSocket message."""

    body: bytes
    content_type: str = ""
    accept: str | None = None
    # The Inference-Header-Content-Length header (HTTP only).
    v2_header_length: str | None = None
    # Makes the request's context (core/context.py) for the hooks that declare one:
    # called at most once, and only when one does, so a request whose hooks do not ask
    # builds none.
    context_of: Callable[[], RequestContext] | None = field(default=None, repr=False)
    built_context: RequestContext | None = field(default=None, repr=False)
    # The model's input_fn returned NotImplemented for it: the built-in codecs take it.
    input_fn_declined: bool = False

    @classmethod
    def from_http(cls, body: bytes, header, context_of: Callable[[], RequestContext] | None = None) -> "Message":
        """An HTTP request's message; header(name) gives a header's value or None."""
        return cls(body=body, content_type=header("Content-Type") or "", accept=header("Accept"),
                   v2_header_length=header(v2.HEADER_LENGTH_HEADER), context_of=context_of)

    @functools.cached_property
    def kind(self) -> str:
        """The Content-Type's media type (asked by each protocol in turn: worked out once)."""
        return media.media_type(self.content_type)

    @property
    def context(self) -> RequestContext:
        """This request's context, made on first use (one per request, never shared)."""
        if self.built_context is None:
            self.built_context = self.context_of() if self.context_of is not None else RequestContext({})
        return self.built_context


class Protocol:
    name = ""

    def takes(self, message: Message, server: ServedModel) -> bool:
        raise NotImplementedError

    def answer(self, message: Message, server: ServedModel, settings: Settings) -> Reply:
        """The reply, or HANDED_BACK when the model's input_fn handed the body back."""
        raise NotImplementedError


def input_fn_takes(message: Message, server: ServedModel) -> bool:
    """The model's input_fn reads this message (it has one, and has not handed it back)."""
    return server.traits.input_fn and not message.input_fn_declined


def predict_context(server: ServedModel, message: Message | None):
    """The request's context for a predict_fn that takes one and runs on this request
    alone (an unbatched model); None otherwise, and then none is made."""
    if message is None or not server.traits.predict_context:
        return None
    return server.hook_contexts.of(message)


def writing(what: str) -> Named500:
    """An output the answer's format has no room for (complex numbers in JSON, a dtype
    of the model's own) is a 500 that says so, never an unhandled error."""
    return Named500(f"the model's outputs cannot be written as {what}", (TypeError, ValueError, OverflowError))


def nbytes(outputs) -> int:
    return sum(getattr(a, "nbytes", 0) for a in outputs.values())

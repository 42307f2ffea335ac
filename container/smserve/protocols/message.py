"""What every wire protocol shares: the message it answers (an HTTP body or a WebSocket
message), the protocol's interface, the table that picks the protocol for a message,
content negotiation (which media type an answer takes, from the request's Accept), and
the small rules more than one protocol follows."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

from werkzeug.datastructures import MIMEAccept
from werkzeug.http import parse_accept_header

from smserve.codecs import v2
from smserve.core import media
from smserve.core.context import RequestContext
from smserve.core.reply import Reply
from smserve.engine.worker.served import ServedModel
from smserve.errors import Named500, NotAcceptable, UnsupportedMediaType
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
    """A wire protocol. The table (ProtocolTable.choose) asks `takes` only of a protocol whose
    `kinds` hold the message's media type (None: any), whose `marker`, if it has one, is
    in the Content-Type, and, where `for_byte_hooks`, only when the model has hooks that
    may read or write bytes: so a request is matched by look-ups, and only the protocols
    that might take it are asked."""

    name = ""
    kinds: tuple[str, ...] | None = None
    marker: str | None = None
    for_byte_hooks = False

    def takes(self, message: Message, server: ServedModel) -> bool:
        """Whether this protocol answers the message, its kind already among `kinds`."""
        return True

    def answer(self, message: Message, server: ServedModel, settings: Settings) -> Reply:
        """The reply, or HANDED_BACK when the model's input_fn handed the body back."""
        raise NotImplementedError


SUPPORTED_REQUEST_TYPES = (
    "application/json (simple or KServe v2)",
    media.CSV,
    media.JSONLINES,
    media.NPY,
    f"{media.NPZ} (several named arrays)",
    "application/octet-stream (KServe v2 binary)",
    "application/vnd.sagemaker-triton.binary+json;json-header-size=N",
)


class ProtocolTable:
    """The protocols a worker speaks, in the order they are asked: the one way a message
    becomes a reply, for /invocations, the multi-model and v2 routes, and the WebSocket
    session alike (the table itself: protocols/__init__.py)."""

    def __init__(self, protocols: tuple[Protocol, ...]):
        self.protocols = protocols

    def choose(self, message: Message, server: ServedModel) -> Protocol:
        kind = message.kind
        for protocol in self.protocols:
            if protocol.kinds is not None and kind not in protocol.kinds:
                continue
            if protocol.marker is not None and protocol.marker not in message.content_type:
                continue
            if protocol.for_byte_hooks and not server.traits.may_handle_bytes:
                continue
            if protocol.takes(message, server):
                return protocol
        if message.input_fn_declined:
            raise UnsupportedMediaType(
                f"unsupported Content-Type {message.content_type!r}: the model's input_fn handed it back (it "
                "returned NotImplemented) and the built-in codecs take only: " + ", ".join(SUPPORTED_REQUEST_TYPES))
        raise UnsupportedMediaType(
            f"unsupported Content-Type {message.content_type!r}; send one of: " + ", ".join(SUPPORTED_REQUEST_TYPES)
            + "; or read any other type (an image, say) with an input_fn in the model's code/inference.py "
            "(docs/model.md#your-own-input-formats)")

    def answer(self, message: Message, server: ServedModel, settings: Settings) -> Reply:
        """The message's reply. A body the model's input_fn hands back is answered by the
        protocol the table chooses without it."""
        while True:
            protocol = self.choose(message, server)
            server.check_ready()
            reply = protocol.answer(message, server, settings)
            if reply is not HANDED_BACK:
                return reply


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

def default_accept(settings: Settings, request_kind: str) -> str:
    """SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT if set; in batch mode a CSV or JSON Lines
    request's own type, so AssembleWith=Line gets one line per record; else JSON."""
    if settings.default_accept:
        return settings.default_accept
    if settings.batch and request_kind in (media.CSV, media.JSONLINES):
        return request_kind
    return media.JSON


def accept_values(header: str | None) -> MIMEAccept:
    # Media-type parameters (charset=utf-8, header=present) are not ours to match on.
    parsed = parse_accept_header(header or "", MIMEAccept)
    return MIMEAccept([(value.split(";")[0].strip(), q) for value, q in parsed])


def preferred(header: str | None, default: str) -> str:
    """The client's most wanted concrete media type, for a user's output_fn."""
    for value, q in sorted(accept_values(header), key=lambda item: -item[1]):
        if q > 0 and "*" not in value:
            return value
    return default


def negotiate(header: str | None, default: str, offers: tuple[str, ...] = media.MEDIA_TYPES) -> str:
    """The best media type the Accept header allows (q-values honoured); 406 if none."""
    if not header:
        return default
    best = _best_match(header, default, offers)
    if best is None:
        raise NotAcceptable(f"cannot produce any of Accept: {header}; supported: {', '.join(offers)}")
    return best


@functools.lru_cache(maxsize=512)
def _best_match(header: str, default: str, offers: tuple[str, ...]) -> str | None:
    # Clients send the same few Accept headers again and again, and werkzeug's parse
    # is a real share of a small request's time.
    # On a tie (e.g. */*) werkzeug prefers the earlier offer: the default comes first.
    aliases = media.ALIASES if offers == media.MEDIA_TYPES else {}
    candidates = [default] + [m for m in offers if m != default] + list(aliases)
    best = accept_values(header).best_match(candidates)
    return None if best is None else aliases.get(best, best)

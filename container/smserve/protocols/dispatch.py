"""The wire protocols of /invocations, as one table that every route uses.

Each protocol says which requests it takes (from the Content-Type, a v2 header and
what the model's hooks handle) and how a body becomes an answer: decode, infer,
encode. `/invocations` and the WebSocket session pick the first protocol that takes a
message and call it; neither re-implements the choice. Decoding and encoding whose
cost grows with the body run on the codec threads, inference on the inference thread,
so the event loop only moves bytes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Iterator

from smserve.codecs import records, simple, v2
from smserve.core import media
from smserve.core.context import RequestContext
from smserve.core.inference import InferenceRequest
from smserve.core.reply import Reply
from smserve.engine.batching.batchable import is_stream
from smserve.errors import BadRequest, Named500, NotAcceptable, ServerError, UnsupportedMediaType
from smserve.protocols.negotiation import default_accept, negotiate, preferred
from smserve.settings import Settings
from smserve.protocols import streams

# Reply and the negotiation helpers are named here too: routes and sessions read the
# protocol table's module for everything about answering.
__all__ = ["Message", "Reply", "Protocol", "PROTOCOLS", "choose", "answer", "v2_reply", "simple_reply",
           "streamed_reply", "default_accept", "negotiate", "preferred", "answer_labels"]

OCTET_STREAM = "application/octet-stream"
# Answers of one line per record, which can leave pass by pass.
LINE_TYPES = (media.CSV, media.JSONLINES)
SUPPORTED_REQUEST_TYPES = (
    "application/json (simple or KServe v2)",
    media.CSV,
    media.JSONLINES,
    media.NPY,
    f"{media.NPZ} (several named arrays)",
    "application/octet-stream (KServe v2 binary)",
    "application/vnd.sagemaker-triton.binary+json;json-header-size=N",
)


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

    def takes(self, message: Message, server) -> bool:
        raise NotImplementedError

    def answer(self, message: Message, server, settings: Settings) -> Reply:
        raise NotImplementedError


# ---------------------------------------------------------------- KServe v2


class _V2(Protocol):
    """KServe v2 with Triton's binary extension; a v2 request gets a v2 answer."""

    def header_length(self, message: Message) -> int | None:
        raise NotImplementedError

    def answer(self, message, server, settings):
        metadata = server.metadata
        header_length = self.header_length(message)
        inference = server.codec(len(message.body), v2.decode_request, message.body, header_length, metadata)
        return v2_reply(server, inference, sagemaker=True, message=message)


class SageMakerBinary(_V2):
    """`application/vnd.sagemaker-triton.binary+json;json-header-size=N`: SageMaker strips
    custom headers, so the JSON header's length travels in the Content-Type."""

    name = "sagemaker-binary"

    def takes(self, message, server):
        return v2.SAGEMAKER_BINARY_CONTENT_TYPE in message.content_type

    def header_length(self, message):
        return v2.sagemaker_header_length(message.content_type, len(message.body))


class V2OctetStream(_V2):
    """`application/octet-stream` + Inference-Header-Content-Length; without the header,
    the raw bytes of the model's one input (unless the model's input_fn takes it)."""

    name = "v2-binary"

    def takes(self, message, server):
        return message.kind == OCTET_STREAM and (message.v2_header_length is not None or not _input_fn_takes(message,
                                                                                                            server))

    def header_length(self, message):
        return v2.header_length_from_header(message.v2_header_length, len(message.body)) or 0


class V2JsonBinary(_V2):
    """`application/json` + Inference-Header-Content-Length: a v2 JSON header, then blobs."""

    name = "v2-json-binary"

    def takes(self, message, server):
        return message.kind == media.JSON and message.v2_header_length is not None

    def header_length(self, message):
        return v2.header_length_from_header(message.v2_header_length, len(message.body))


def v2_reply(server, inference: InferenceRequest, sagemaker: bool, message: Message | None = None) -> Reply:
    """message: the request's, whose context a predict_fn may take."""
    results = server.infer(inference.inputs, _predict_context(server, message))
    if is_stream(results):
        server.close_stream(results)
        raise NotAcceptable("this model streams its answer (its predict_fn returned an iterator), and a KServe v2 "
                            "answer cannot be streamed: send simple JSON to /invocations, with Accept one of "
                            f"{', '.join(streams.STREAM_TYPES)}")
    size = sum(a.nbytes for a in results.values())
    payload, header_length = server.codec(size, _encode_v2, inference, results, server.metadata)
    return Reply(payload, v2.response_headers(header_length, sagemaker))


def _encode_v2(inference, results, metadata):
    with _writing("the KServe v2 answer"):
        return v2.encode_response(v2.build_response(inference, results, metadata))


def encode_simple(outputs, accept: str, labels=None, wrapped: bool = True):
    """simple.encode, its failures on a model's outputs answered as such."""
    with _writing(accept):
        return simple.encode(outputs, accept, labels, wrapped)


def _writing(what: str) -> Named500:
    """An output the answer's format has no room for (complex numbers in JSON, a dtype
    of the model's own) is a 500 that says so, never an unhandled error."""
    return Named500(f"the model's outputs cannot be written as {what}", (TypeError, ValueError, OverflowError))


# ---------------------------------------------------------------- the model's hooks


def _input_fn_takes(message: Message, server) -> bool:
    """The model's input_fn reads this message (it has one, and has not handed it back)."""
    return server.has_input_fn and not message.input_fn_declined


class Hooks(Protocol):
    """The model's own input_fn / output_fn (or a predict_fn that streams) decides:
    any Content-Type when it has an input_fn, the simple types otherwise. An input_fn
    that returns NotImplemented hands the body back: the table is asked again without
    it, so the built-in codecs decode it (a KServe v2 document gets a v2 answer)."""

    name = "hooks"

    def takes(self, message, server):
        if not server.uses_byte_hooks:
            return False
        if _input_fn_takes(message, server):
            return True
        # Without it: the built-in codecs decode, and output_fn or a streaming predict_fn answer.
        hooks = server.model.hooks
        return (hooks.output_fn is not None or hooks.streams) and message.kind in media.REQUEST_TYPES

    def answer(self, message, server, settings):
        value, decoded = NotImplemented, False
        if _input_fn_takes(message, server):
            value = server.hook_input(message)
            if value is NotImplemented:
                message.input_fn_declined = True
                return answer(message, server, settings)
        else:
            value = server.codec(len(message.body), _decode_builtin, message.body, message.content_type,
                                 server.metadata, settings.max_body_bytes)
            if isinstance(value, InferenceRequest):
                return v2_reply(server, value, sagemaker=True, message=message)
            decoded = True
        hooks = server.model.hooks
        default = default_accept(settings, message.kind)
        stream_format = None
        if hooks.streams:
            # Known to stream: an Accept no stream can meet is refused before the model runs.
            stream_format = streams.negotiate(message.accept, hooks.output_with(lambda: message.context))
        # The built-in encoders answer when there is no output_fn, or when it hands the
        # prediction back (NotImplemented). Whether predict_fn streams is known from what
        # it returns, and a stream type is acceptable then: a refusal waits for the result.
        try:
            builtin, refusal = negotiate(message.accept, default), None
            labels = answer_labels(message.accept, builtin, server.metadata)
        except NotAcceptable as e:
            builtin, refusal, labels = default, e, None

        # The records' wrapper is answered in kind only where the built-in codecs read it:
        # a body input_fn read is the script's own, answered bare as the toolkit's output_fn does.
        wrapped = decoded and simple.wraps_records(message.body, message.content_type)

        def encode(outputs):
            if refusal is not None:
                raise refusal
            return encode_simple(outputs, builtin, labels, wrapped)

        # The user's output_fn may speak types we do not: it gets the client's first choice.
        accept = preferred(message.accept, default) if hooks.output_fn is not None else builtin
        result = server.infer_with_hooks(value, message, accept, encode, decoded)
        if not isinstance(result, tuple):  # predict_fn returned an iterator: stream it
            return streamed_reply(server, message, result, stream_format)
        payload, media_type = result
        return Reply(payload, {"Content-Type": media_type})


def streamed_reply(server, message: Message, iterator, stream_format=None) -> Reply:
    """The iterator a predict_fn returned, streamed in the format the Accept chooses."""
    try:
        if stream_format is None:
            stream_format = streams.negotiate(message.accept,
                                              server.model.hooks.output_with(lambda: message.context))
    except NotAcceptable:
        server.close_stream(iterator)
        raise
    return streams.reply(server.stream_items(iterator, stream_format), stream_format)


# ---------------------------------------------------------------- simple types


class Json(Protocol):
    """`application/json`: simple tensors as the SageMaker SDK sends them, or a whole
    KServe v2 JSON request (recognised by its `inputs` list of named tensors)."""

    name = "json"

    def takes(self, message, server):
        return message.kind == media.JSON

    def answer(self, message, server, settings):
        body = message.body
        if not body:
            raise BadRequest("request body is empty")
        # Flat numeric records, the usual body, are read on the loop whatever their size
        # (up to the sliced reader's 1 MB): simdjson's C reader holds the GIL, so a codec
        # thread would not free the loop meanwhile, and the hop to it would cost more
        # than shaping the array. Any other body goes to a codec thread when it is big.
        found = records.c_records(body)
        if found is not None:
            return simple_reply(server, settings, message, simple.decode_json(found, server.metadata))
        decoded = server.codec(len(body), _decode_json, body, server.metadata, True)
        if isinstance(decoded, InferenceRequest):
            return v2_reply(server, decoded, sagemaker=True, message=message)
        return simple_reply(server, settings, message, decoded)


def _decode_builtin(body: bytes, content_type: str, metadata, max_bytes: int):
    """A simple type's body as named arrays for the model's hooks; a KServe v2 JSON
    document as its InferenceRequest (answered as v2)."""
    if media.media_type(content_type) == media.JSON:
        return _decode_json(body, metadata)
    return simple.decode(body, content_type, metadata, max_bytes)


def _decode_json(body: bytes, metadata, c_tried: bool = False):
    try:
        document = simple.parse_json(body, c_tried=c_tried)
    except BadRequest as e:
        raise BadRequest(
            f"{e.message} (if binary tensors follow a JSON header, give the header's length in "
            f"'{v2.SAGEMAKER_BINARY_CONTENT_TYPE}N' or the {v2.HEADER_LENGTH_HEADER} header)"
        ) from None
    if v2.is_v2_document(document):
        return v2.decode_json_request(document, metadata)
    return simple.decode_json(document, metadata)


class Simple(Protocol):
    """CSV, JSON Lines, .npy and .npz: one record a line (or arrays), answered by Accept."""

    name = "simple"

    def takes(self, message, server):
        return message.kind in (media.CSV, media.JSONLINES, media.NPY, media.NPZ)

    def answer(self, message, server, settings):
        inputs = server.codec(len(message.body), simple.decode, message.body, message.content_type, server.metadata,
                              settings.max_body_bytes)
        return simple_reply(server, settings, message, inputs)


def simple_reply(server, settings: Settings, message: Message, inputs) -> Reply:
    try:
        accept, refusal = negotiate(message.accept, default_accept(settings, message.kind)), None
    except NotAcceptable as e:
        if not server.may_stream:
            raise
        # Only what predict_fn returns tells whether a stream type would do.
        accept, refusal = None, e
    labels = answer_labels(message.accept, accept, server.metadata) if refusal is None else None
    wrapped = simple.wraps_records(message.body, message.content_type)
    if accept in LINE_TYPES and server.passes(inputs) > 1:
        # Many records in a line format: each pass's lines leave as the pass ends, so
        # the first lines go out before the last pass runs. The first pass runs before
        # the status line is sent: a model that fails on it gets its 500 (the worker
        # sends nothing until the body's first bytes exist, and then it is too late).
        by_pass = server.infer_by_pass(inputs)
        first = next(by_pass)
        if is_stream(first):  # (a predict_fn that streams: the whole request's one iterator)
            return streamed_reply(server, message, first)
        payload, _ = server.codec(_nbytes(first), encode_simple, first, accept, labels)
        return Reply(_resumed(payload, _lines_by_pass(server, by_pass, accept, labels)), {"Content-Type": accept})
    outputs = server.infer(inputs, _predict_context(server, message))
    if is_stream(outputs):
        return streamed_reply(server, message, outputs)
    if refusal is not None:
        raise refusal
    payload, media_type = server.codec(_nbytes(outputs), encode_simple, outputs, accept, labels, wrapped)
    return Reply(payload, {"Content-Type": media_type})


def _predict_context(server, message: Message | None):
    """The request's context for a predict_fn that takes one and runs on this request
    alone (an unbatched model); None otherwise, and then none is made."""
    if message is None or not server.predict_context:
        return None
    return server.hook_context(message)


def _lines_by_pass(server, by_pass, accept: str, labels) -> Iterator[bytes]:
    """The lines of the passes after the first. (Closed before it starts, by_pass is
    closed as it is let go of.)"""
    try:
        for outputs in by_pass:
            if is_stream(outputs):
                server.close_stream(outputs)
                raise ServerError("predict_fn returned an iterator for a pass of a request whose first pass it "
                                  "answered with arrays: a streamed answer must come from one call")
            payload, _ = server.codec(_nbytes(outputs), encode_simple, outputs, accept, labels)
            yield payload
    finally:
        by_pass.close()


def _resumed(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    """first, then the rest; closing it closes the rest (a client that left stops the passes)."""
    try:
        yield first
        yield from rest
    finally:
        rest.close()


def _nbytes(outputs) -> int:
    return sum(getattr(a, "nbytes", 0) for a in outputs.values())


# ---------------------------------------------------------------- the table

# Order matters: the v2 forms are recognised by their headers before the model's hooks
# see a body; JSON is sniffed for a v2 document only when no hook takes it.
PROTOCOLS: tuple[Protocol, ...] = (SageMakerBinary(), V2OctetStream(), V2JsonBinary(), Hooks(), Json(), Simple())


def choose(message: Message, server) -> Protocol:
    for protocol in PROTOCOLS:
        if protocol.takes(message, server):
            return protocol
    if message.input_fn_declined:
        raise UnsupportedMediaType(
            f"unsupported Content-Type {message.content_type!r}: the model's input_fn handed it back (it returned "
            "NotImplemented) and the built-in codecs take only: " + ", ".join(SUPPORTED_REQUEST_TYPES))
    raise UnsupportedMediaType(
        f"unsupported Content-Type {message.content_type!r}; send one of: " + ", ".join(SUPPORTED_REQUEST_TYPES)
        + "; or read any other type (an image, say) with an input_fn in the model's code/inference.py "
        "(docs/model.md#your-own-input-formats)")


def answer(message: Message, server, settings: Settings) -> Reply:
    """The one way a message becomes a reply, for every route."""
    protocol = choose(message, server)
    server.check_ready()
    return protocol.answer(message, server, settings)


# ---------------------------------------------------------------- Accept


def answer_labels(header: str | None, chosen: str, metadata) -> dict[str, tuple[str, ...]] | None:
    """The outputs' class labels when the Accept entry that chose `chosen` asks for
    them (`application/json; labels=true`); None when it does not. Asked of a model
    whose metadata.json gives no labels: 406, so the client learns why none came."""
    if not header or "labels" not in header.lower():
        return None
    family = chosen.split("/")[0] + "/*"
    for entry in header.split(","):
        kind, _, parameters = entry.partition(";")
        if media.media_type(kind) not in (chosen, family, "*/*"):
            continue
        if any(p.strip().lower().replace(" ", "") == "labels=true" for p in parameters.split(";")):
            labels = {spec.name: spec.labels for spec in metadata.outputs if spec.labels}
            if not labels:
                raise NotAcceptable("labels=true: this model's metadata.json gives no output labels")
            return labels
    return None

"""The simple types on /invocations: JSON tensors as the SageMaker SDK sends them (or a
whole KServe v2 JSON request, recognised by its `inputs` list), CSV, JSON Lines, .npy and
.npz; answered in the type the Accept chooses, line formats pass by pass."""

from __future__ import annotations

from typing import Iterator

from smserve.codecs import records, simple, v2
from smserve.core import media
from smserve.core.inference import InferenceRequest
from smserve.core.reply import Reply
from smserve.core.reply import is_stream
from smserve.engine.worker.served import ServedModel
from smserve.errors import BadRequest, NotAcceptable, ServerError
from smserve.protocols.kserve_v2 import v2_reply
from smserve.protocols.message import Message, Protocol, default_accept, negotiate, nbytes, predict_context, writing
from smserve.protocols.streams import streamed_reply
from smserve.settings import Settings

# Answers of one line per record, which can leave pass by pass.
LINE_TYPES = (media.CSV, media.JSONLINES)


class Json(Protocol):
    """`application/json`: simple tensors as the SageMaker SDK sends them, or a whole
    KServe v2 JSON request (recognised by its `inputs` list of named tensors)."""

    name = "json"
    kinds = (media.JSON,)

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
        decoded = server.pools.offload(len(body), _decode_json, body, server.metadata, True)
        if isinstance(decoded, InferenceRequest):
            return v2_reply(server, decoded, sagemaker=True, message=message)
        return simple_reply(server, settings, message, decoded)


class Simple(Protocol):
    """CSV, JSON Lines, .npy and .npz: one record a line (or arrays), answered by Accept."""

    name = "simple"
    kinds = (media.CSV, media.JSONLINES, media.NPY, media.NPZ)

    def answer(self, message, server, settings):
        inputs = server.pools.offload(len(message.body), simple.decode, message.body, message.content_type,
                                      server.metadata, settings.max_body_bytes)
        return simple_reply(server, settings, message, inputs)


def decode_builtin(body: bytes, content_type: str, metadata, max_bytes: int):
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


def encode_simple(outputs, accept: str, labels=None, wrapped: bool = True):
    """simple.encode, its failures on a model's outputs answered as such."""
    with writing(accept):
        return simple.encode(outputs, accept, labels, wrapped)


def simple_reply(server: ServedModel, settings: Settings, message: Message, inputs) -> Reply:
    try:
        accept, refusal = negotiate(message.accept, default_accept(settings, message.kind)), None
    except NotAcceptable as e:
        if not server.traits.may_stream:
            raise
        # Only what predict_fn returns tells whether a stream type would do.
        accept, refusal = None, e
    labels = answer_labels(message.accept, accept, server.metadata) if refusal is None else None
    wrapped = message.kind == media.JSON and simple.wraps_records(message.body, message.content_type)
    offload = server.pools.offload
    if accept in LINE_TYPES and server.passes(inputs) > 1:
        # Many records in a line format: each pass's lines leave as the pass ends, so
        # the first lines go out before the last pass runs. The first pass runs before
        # the status line is sent: a model that fails on it gets its 500 (the worker
        # sends nothing until the body's first bytes exist, and then it is too late).
        by_pass = server.infer_by_pass(inputs)
        first = next(by_pass)
        if is_stream(first):  # (a predict_fn that streams: the whole request's one iterator)
            return streamed_reply(server, message, first)
        payload, _ = offload(nbytes(first), encode_simple, first, accept, labels)
        return Reply(_resumed(payload, _lines_by_pass(server, by_pass, accept, labels)), {"Content-Type": accept})
    outputs = server.infer(inputs, predict_context(server, message))
    if is_stream(outputs):
        return streamed_reply(server, message, outputs)
    if refusal is not None:
        raise refusal
    payload, media_type = offload(nbytes(outputs), encode_simple, outputs, accept, labels, wrapped)
    return Reply(payload, {"Content-Type": media_type})


def _lines_by_pass(server: ServedModel, by_pass, accept: str, labels) -> Iterator[bytes]:
    """The lines of the passes after the first. (Closed before it starts, by_pass is
    closed as it is let go of.)"""
    try:
        for outputs in by_pass:
            if is_stream(outputs):
                server.close_stream(outputs)
                raise ServerError("predict_fn returned an iterator for a pass of a request whose first pass it "
                                  "answered with arrays: a streamed answer must come from one call")
            payload, _ = server.pools.offload(nbytes(outputs), encode_simple, outputs, accept, labels)
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

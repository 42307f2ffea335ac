"""Response streaming (SageMaker's InvokeEndpointWithResponseStream).

SageMaker relays whatever the container writes as it arrives; the container streams by
answering with `Transfer-Encoding: chunked`. A model streams when its predict_fn
returns an iterator (a generator function's, or any other): each item is encoded here
and sent as its own chunk as soon as it exists.

Formats, by Accept: `application/jsonlines` (the default: one JSON value a line),
`text/event-stream` (Server-Sent Events: `data: <json>` per item, then `event: end`),
`text/plain` (str items as they are). A failure after the first chunk cannot change
the status any more: the stream ends with an error record in its own format.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import orjson

from smserve import metrics
from smserve.core.reply import Reply
from smserve.errors import HTTPError, NotAcceptable
from smserve.protocols.message import negotiate as negotiate_accept, preferred

log = logging.getLogger(__name__)

JSONLINES = "application/jsonlines"
EVENT_STREAM = "text/event-stream"
TEXT = "text/plain"
STREAM_TYPES = (JSONLINES, EVENT_STREAM, TEXT)
# Relays and proxies must pass chunks on as they come.
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def to_json(value) -> bytes:
    """One item as JSON: numpy arrays and scalars natively, tensors through numpy,
    non-finite floats as null (JSON has no NaN)."""
    return orjson.dumps(value, default=_json_default, option=orjson.OPT_SERIALIZE_NUMPY)


def _json_default(value):
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, without importing torch
        return value.detach().cpu().numpy().tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, (set, tuple)):
        return list(value)
    raise TypeError(f"cannot send a {type(value).__name__} as JSON")


@dataclass(frozen=True)
class StreamFormat:
    media: str
    # The user's output_fn, called per item with the negotiated media type.
    output_fn: Callable | None = None

    def item(self, value) -> bytes:
        if self.output_fn is not None:
            result = self.output_fn(value, self.media)
            if isinstance(result, tuple):
                result = result[0]
            return result.encode() if isinstance(result, str) else bytes(result)
        if self.media == TEXT:
            if isinstance(value, str):
                return value.encode()
            if isinstance(value, (bytes, bytearray)):
                return bytes(value)
            return to_json(value) + b"\n"
        if self.media == EVENT_STREAM:
            return b"data: " + to_json(value) + b"\n\n"
        return to_json(value) + b"\n"

    def error(self, message: str) -> bytes:
        if self.media == EVENT_STREAM:
            return b"event: error\ndata: " + to_json({"error": message}) + b"\n\n"
        if self.media == TEXT and self.output_fn is None:
            return b"\n" + to_json({"error": message}) + b"\n"
        return to_json({"error": message}) + b"\n"

    def end(self) -> bytes:
        return b"event: end\ndata: {}\n\n" if self.media == EVENT_STREAM else b""


def negotiate(accept: str | None, output_fn: Callable | None) -> StreamFormat:
    """The stream's format. With an output_fn the client's first choice goes to it."""
    if output_fn is not None:
        return StreamFormat(preferred(accept, JSONLINES), output_fn)
    try:
        return StreamFormat(negotiate_accept(accept, JSONLINES, STREAM_TYPES))
    except NotAcceptable:
        raise NotAcceptable(
            f"this model streams its answer; cannot produce Accept: {accept}; "
            f"supported: {', '.join(STREAM_TYPES)}"
        ) from None


def reply(chunks: Iterator[bytes], stream_format: StreamFormat) -> Reply:
    """A streamed Reply. The first chunk is computed before the status is sent, so a
    request that fails at once still gets its 4xx/5xx."""
    chunks = iter(chunks)
    try:
        first = next(chunks)
    except StopIteration:
        first = None
    except BaseException:
        close = getattr(chunks, "close", None)
        if close:
            close()
        raise
    metrics.stream_started()
    return Reply(_after_first(first, chunks, stream_format), {"Content-Type": stream_format.media, **STREAM_HEADERS})


def streamed_reply(server, message, iterator, stream_format: StreamFormat | None = None) -> Reply:
    """The iterator a predict_fn returned (server: the engine/worker/served.ServedModel
    whose model returned it, message: its request's), streamed in the format the Accept
    chooses."""
    try:
        if stream_format is None:
            stream_format = negotiate(message.accept, server.model.hooks.output_with(lambda: message.context))
    except NotAcceptable:
        server.close_stream(iterator)
        raise
    return reply(server.stream_items(iterator, stream_format), stream_format)


def _after_first(first: bytes | None, chunks: Iterator[bytes], stream_format: StreamFormat) -> Iterator[bytes]:
    try:
        if first is not None:
            metrics.stream_chunk()
            yield first
        for chunk in chunks:
            metrics.stream_chunk()
            yield chunk
        end = stream_format.end()
        if end:
            yield end
    except HTTPError as e:
        log.error("stream failed after its first chunk: %s", e.message)
        yield stream_format.error(e.message)
    except Exception as e:  # noqa: BLE001 - the status is sent; the stream says what broke
        log.exception("stream failed after its first chunk")
        yield stream_format.error(f"{type(e).__name__}: {e}")
    finally:
        close = getattr(chunks, "close", None)
        if close:
            close()

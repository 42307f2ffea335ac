"""KServe v2 with Triton's binary extension, on /invocations: a v2 request gets a v2
answer. Three forms, told apart by their headers: SageMaker's binary Content-Type, an
octet stream with Inference-Header-Content-Length (or the raw bytes of the model's one
input), and JSON with that header."""

from __future__ import annotations

from smserve.codecs import v2
from smserve.core import media
from smserve.core.inference import InferenceRequest
from smserve.core.reply import Reply, is_stream
from smserve.engine.worker.served import ServedModel
from smserve.errors import NotAcceptable
from smserve.protocols import streams
from smserve.protocols.message import OCTET_STREAM, Message, Protocol, input_fn_takes, predict_context, writing


class _V2(Protocol):
    """KServe v2 with Triton's binary extension; a v2 request gets a v2 answer."""

    def header_length(self, message: Message) -> int | None:
        raise NotImplementedError

    def answer(self, message, server, settings):
        metadata = server.metadata
        header_length = self.header_length(message)
        inference = server.pools.offload(len(message.body), v2.decode_request, message.body, header_length, metadata)
        return v2_reply(server, inference, sagemaker=True, message=message)


class SageMakerBinary(_V2):
    """`application/vnd.sagemaker-triton.binary+json;json-header-size=N`: SageMaker strips
    custom headers, so the JSON header's length travels in the Content-Type."""

    name = "sagemaker-binary"
    # Anywhere in the Content-Type: one that names it other than first is refused (400).
    marker = v2.SAGEMAKER_BINARY_CONTENT_TYPE

    def header_length(self, message):
        return v2.sagemaker_header_length(message.content_type, len(message.body))


class V2OctetStream(_V2):
    """`application/octet-stream` + Inference-Header-Content-Length; without the header,
    the raw bytes of the model's one input (unless the model's input_fn takes it)."""

    name = "v2-binary"
    kinds = (OCTET_STREAM,)

    def takes(self, message, server):
        return message.v2_header_length is not None or not input_fn_takes(message, server)

    def header_length(self, message):
        return v2.header_length_from_header(message.v2_header_length, len(message.body)) or 0


class V2JsonBinary(_V2):
    """`application/json` + Inference-Header-Content-Length: a v2 JSON header, then blobs."""

    name = "v2-json-binary"
    kinds = (media.JSON,)

    def takes(self, message, server):
        return message.v2_header_length is not None

    def header_length(self, message):
        return v2.header_length_from_header(message.v2_header_length, len(message.body))


def v2_reply(server: ServedModel, inference: InferenceRequest, sagemaker: bool,
             message: Message | None = None) -> Reply:
    """message: the request's, whose context a predict_fn may take."""
    results = server.infer(inference.inputs, predict_context(server, message))
    if is_stream(results):
        server.close_stream(results)
        raise NotAcceptable("this model streams its answer (its predict_fn returned an iterator), and a KServe v2 "
                            "answer cannot be streamed: send simple JSON to /invocations, with Accept one of "
                            f"{', '.join(streams.STREAM_TYPES)}")
    size = sum(a.nbytes for a in results.values())
    payload, header_length = server.pools.offload(size, _encode_v2, inference, results, server.metadata)
    return Reply(payload, v2.response_headers(header_length, sagemaker))


def _encode_v2(inference, results, metadata):
    with writing("the KServe v2 answer"):
        return v2.encode_response(v2.build_response(inference, results, metadata))

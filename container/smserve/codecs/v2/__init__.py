"""KServe v2 inference requests and responses, with Triton's binary tensor extension.

A pure codec: bytes in, InferenceRequest out; InferenceResponse in, bytes out. No Flask,
no torch. One module per step of a request's way through:

- header: where the JSON header ends (Inference-Header-Content-Length, or the SageMaker
  Content-Type that carries it), and the response headers that say the same;
- request: the JSON document (and the binary tensors after it) -> InferenceRequest;
- plans: a binary request's JSON header, kept once decoded, for the next with the same;
- raw: a raw binary body (header length 0) -> InferenceRequest;
- tensors: one tensor's binary and JSON wire forms, both ways;
- response: the model's results -> InferenceResponse -> bytes.

May import: codecs/' own modules, core/ and the base modules.
"""

from smserve.codecs.v2.header import (
    HEADER_LENGTH_HEADER,
    SAGEMAKER_BINARY_CONTENT_TYPE,
    header_length_from_header,
    response_headers,
    sagemaker_header_length,
)
from smserve.codecs.v2.request import decode_json_request, decode_request, is_v2_document
from smserve.codecs.v2.response import build_response, encode_error, encode_response
from smserve.codecs.v2.tensors import (
    bf16_to_float32,
    deserialize_bytes,
    float32_to_bf16,
    serialize_bytes,
    to_binary,
)

__all__ = [
    "SAGEMAKER_BINARY_CONTENT_TYPE",
    "HEADER_LENGTH_HEADER",
    "sagemaker_header_length",
    "header_length_from_header",
    "response_headers",
    "decode_request",
    "decode_json_request",
    "is_v2_document",
    "build_response",
    "encode_response",
    "encode_error",
    "serialize_bytes",
    "deserialize_bytes",
    "bf16_to_float32",
    "float32_to_bf16",
    "to_binary",
]

"""The JSON header's length: where a KServe v2 body's JSON ends and its binary tensors begin.

It travels in `Inference-Header-Content-Length` (/v2), or inside the Content-Type in
Triton's SageMaker form, because SageMaker strips custom request headers. Values are
parsed as Triton parses them (std::stoi), with Triton's wording for each refusal.
"""

from __future__ import annotations

import re

from smserve.errors import BadRequest

# SageMaker strips custom request headers, so Triton's SageMaker form carries the JSON
# header's length inside the Content-Type.
SAGEMAKER_BINARY_CONTENT_TYPE = "application/vnd.sagemaker-triton.binary+json;json-header-size="
HEADER_LENGTH_HEADER = "Inference-Header-Content-Length"
# Triton parses the length with std::stoi, into an int.
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
# std::stoi: leading C whitespace, an optional sign, decimal digits; the rest is ignored.
_STOI = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


def sagemaker_header_length(content_type: str | None, content_length: int) -> int | None:
    """The JSON header length from the SageMaker binary Content-Type, or None when the
    Content-Type is not that form (the caller then decides what the body is).

    Triton matches the value case- and whitespace-sensitively: with a space after the
    ';' it is not the binary form at all.
    """
    if content_type is None:
        return None
    at = content_type.find(SAGEMAKER_BINARY_CONTENT_TYPE)
    if at < 0:
        return None
    if at > 0:
        raise BadRequest(
            f"expect MIME type for binary data starts with '{SAGEMAKER_BINARY_CONTENT_TYPE}', got: {content_type}"
        )
    rest = content_type[len(SAGEMAKER_BINARY_CONTENT_TYPE) :]
    if content_type.count("json-header-size") > 1 or "," in rest:
        # Two Content-Type headers (joined with ',') or two sizes in one: which is meant?
        raise BadRequest(f"ambiguous Content-Type: it gives json-header-size more than once, got: {_shown(content_type)}")
    value = _stoi(rest)
    if value is None:
        raise BadRequest(f"Unable to parse inference header size, got: {_shown(rest)}")
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise BadRequest(f"Unable to parse inference header size, value is out of range, got: {_shown(rest)}")
    return _within_body(value, content_length, _shown(rest))


def header_length_from_header(value: str | None, content_length: int) -> int | None:
    """The JSON header length from `Inference-Header-Content-Length`; None when absent."""
    if value is None:
        return None
    if "," in value:
        # gunicorn joins repeated headers with ',': two lengths, and no way to tell which.
        raise BadRequest(f"ambiguous {HEADER_LENGTH_HEADER}: the request sends it more than once, got: {_shown(value)}")
    parsed = _stoi(value)
    if parsed is None:
        raise BadRequest(f"Unable to parse {HEADER_LENGTH_HEADER}, got: {_shown(value)}")
    if not _INT32_MIN <= parsed <= _INT32_MAX:
        raise BadRequest(
            f"Unable to parse {HEADER_LENGTH_HEADER}, value is out of range "
            f"[ {_INT32_MIN}, {_INT32_MAX} ], got: {_shown(value)}"
        )
    return _within_body(parsed, content_length, _shown(value))


def _stoi(text: str) -> int | None:
    match = _STOI.match(text)
    if not match:
        return None
    sign, digits = match.group(1)[:1], match.group(1).lstrip("+-").lstrip("0")
    if len(digits) > 12:
        # Out of int32 range whatever follows, and int() refuses 4,300+ digits (ValueError).
        return _INT32_MIN - 1 if sign == "-" else _INT32_MAX + 1
    return int((sign if sign in "+-" else "") + (digits or "0"))


def _shown(text: str) -> str:
    """A header value as an error message shows it: the first 64 characters."""
    return text if len(text) <= 64 else text[:64] + f"... ({len(text)} characters)"


def _within_body(value: int, content_length: int, shown: str) -> int:
    # Triton's text says "(0, N)" but 0 and N are both accepted.
    if value < 0 or value > content_length:
        raise BadRequest(f"inference header size should be in range (0, {content_length}), got: {shown}")
    return value



def response_headers(header_length: int | None, sagemaker: bool) -> dict[str, str]:
    """The headers that tell a client where an encoded response's JSON ends.

    On SageMaker (/invocations) the length rides in the Content-Type, since only that
    header reaches the client; on /v2 it is Inference-Header-Content-Length.
    """
    if header_length is None:
        return {"Content-Type": "application/json"}
    if sagemaker:
        return {"Content-Type": f"{SAGEMAKER_BINARY_CONTENT_TYPE}{header_length}"}
    return {"Content-Type": "application/octet-stream", HEADER_LENGTH_HEADER: str(header_length)}


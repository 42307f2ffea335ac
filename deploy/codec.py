"""Request bodies for an endpoint, and its responses back to arrays.

Pure functions over bytes and numpy arrays, so `invoke` and the tests that talk to a
real server share them. The KServe v2 binary form is built and read by tritonclient,
the independent client the server is tested against, rather than by our own code.
"""

from __future__ import annotations

import io
import json
import re

import numpy as np

JSON = "application/json"
CSV = "text/csv"
JSONLINES = "application/jsonlines"
NPY = "application/x-npy"
# SageMaker strips custom request headers, so the v2 JSON header length travels inside
# the Content-Type: "<this prefix><N>".
V2_BINARY = "application/vnd.sagemaker-triton.binary+json"
V2_BINARY_PREFIX = V2_BINARY + ";json-header-size="

SIMPLE_TYPES = (JSON, CSV, JSONLINES, NPY)
CONTENT_TYPES = SIMPLE_TYPES + (V2_BINARY,)

_HEADER_SIZE = re.compile(r"json-header-size=(\d+)")


class CodecError(ValueError):
    """A body that cannot be built or read; its message is one line for the user."""


def media_type(content_type: str) -> str:
    """The media type without parameters, lower-cased: 'text/csv; charset=utf-8' -> 'text/csv'."""
    return content_type.split(";", 1)[0].strip().lower()


def encode(array: np.ndarray, content_type: str, input_name: str | None = None) -> tuple[bytes, str]:
    """Serialise `array` as `content_type`; returns the body and the Content-Type to send.

    Simple types carry one record per row of dimension 0, as the SageMaker SDK's
    serializers do. The v2 binary type needs the model's input name.
    """
    kind = media_type(content_type)
    array = np.asarray(array)
    if kind == JSON:
        return json.dumps({"instances": array.tolist()}).encode(), JSON
    if kind == CSV:
        rows = np.atleast_2d(array) if array.ndim < 2 else array
        if rows.ndim != 2:
            raise CodecError(f"text/csv carries 2-D arrays (records x columns), got shape {list(array.shape)}")
        lines = (",".join(_csv_field(v) for v in row) for row in rows.tolist())
        return ("\n".join(lines) + "\n").encode(), CSV
    if kind == JSONLINES:
        rows = array if array.ndim >= 1 else array.reshape(1)
        return "".join(json.dumps(row) + "\n" for row in rows.tolist()).encode(), JSONLINES
    if kind == NPY:
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        return buffer.getvalue(), NPY
    if kind == V2_BINARY:
        return _encode_v2_binary(array, input_name)
    raise CodecError(f"unsupported content type {content_type!r}; use one of: {', '.join(CONTENT_TYPES)}")


def _csv_field(value) -> str:
    # repr keeps every float digit that matters and writes ints without ".0".
    return repr(value) if not isinstance(value, bool) else str(int(value))


def _encode_v2_binary(array: np.ndarray, input_name: str | None) -> tuple[bytes, str]:
    # Imported here: tritonclient is only needed for this one content type.
    import tritonclient.http as httpclient
    from tritonclient.utils import np_to_triton_dtype

    if not input_name:
        raise CodecError("the v2 binary content type needs the model's input name (--input-name)")
    datatype = np_to_triton_dtype(array.dtype)
    if datatype is None:
        raise CodecError(f"no KServe v2 datatype for numpy dtype {array.dtype}")
    tensor = httpclient.InferInput(input_name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=True)
    # No requested outputs: tritonclient then asks for every output in binary.
    body, json_size = httpclient.InferenceServerClient.generate_request_body([tensor])
    if json_size is None:  # nothing binary followed the header (an empty tensor)
        return body, JSON
    return body, f"{V2_BINARY_PREFIX}{json_size}"


def header_size(content_type: str) -> int | None:
    """N from '...binary+json;json-header-size=N', or None for any other content type."""
    if media_type(content_type) != V2_BINARY:
        return None
    found = _HEADER_SIZE.search(content_type.replace(" ", ""))
    if found is None:
        raise CodecError(f"response Content-Type {content_type!r} lacks json-header-size=N")
    return int(found.group(1))


def decode(body: bytes, content_type: str):
    """Read a response body by its Content-Type.

    Returns {output name: ndarray} for a v2 response (binary or JSON), an ndarray for
    npy and CSV, a list of records for JSON Lines, the parsed object for other JSON,
    and the bytes for anything else.
    """
    kind = media_type(content_type)
    try:
        if kind == V2_BINARY:
            return _decode_v2(body, header_size(content_type))
        if kind == JSON:
            value = json.loads(body)
            if _looks_like_v2_response(value):
                return _decode_v2(body, None)
            return value
        if kind == CSV:
            text = body.decode()
            if not text.strip():
                return np.empty((0, 0))
            return np.loadtxt(io.StringIO(text), delimiter=",", ndmin=2)
        if kind == JSONLINES:
            return [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        if kind == NPY:
            return np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, UnicodeDecodeError) as error:
        raise CodecError(f"cannot read the {kind} response: {_one_line(error)}") from None
    return body


def _looks_like_v2_response(value) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("outputs"), list)
        and all(isinstance(o, dict) and "name" in o and "datatype" in o for o in value["outputs"])
    )


def _decode_v2(body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    import tritonclient.http as httpclient

    try:
        result = httpclient.InferenceServerClient.parse_response_body(body, header_length=header_length)
        names = [output["name"] for output in result.get_response().get("outputs", [])]
        return {name: result.as_numpy(name) for name in names}
    except Exception as error:  # tritonclient raises bare Exceptions for malformed bodies
        raise CodecError(f"cannot read the v2 response: {_one_line(error)}") from None


def to_printable(decoded):
    """A JSON-serialisable form of what `decode` returned, for printing."""
    if isinstance(decoded, dict) and decoded and all(isinstance(v, np.ndarray) for v in decoded.values()):
        return {"outputs": {name: _array_summary(value) for name, value in decoded.items()}}
    if isinstance(decoded, np.ndarray):
        return _array_summary(decoded)
    if isinstance(decoded, bytes):
        return {"bytes": len(decoded), "text": decoded.decode("utf-8", "replace")}
    return decoded


def _array_summary(array: np.ndarray) -> dict:
    data = array.tolist()
    if array.dtype.kind in ("S", "O"):
        data = np.vectorize(lambda v: v.decode("utf-8", "replace") if isinstance(v, bytes) else v, otypes=[object])(
            array
        ).tolist()
    return {"shape": list(array.shape), "dtype": str(array.dtype), "data": data}


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__

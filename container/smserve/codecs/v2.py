"""KServe v2 inference requests and responses, with Triton's binary tensor extension.

A pure codec: bytes in, InferenceRequest out; InferenceResponse in, bytes out. No Flask,
no torch. The rules, limits and error wording follow Triton (PROTOCOL.md), with one
deliberate difference: every malformed request is a BadRequest (400), where Triton
answers JSON type errors with 500. Messages Triton words without naming the tensor get
" for input '<name>'" appended, so the client learns which tensor broke the rule.

Binary inputs become numpy views on the request body (no copy) wherever the wire
format is already the array's memory: BYTES (variable-length elements) and BF16 (no
numpy dtype) are the only conversions. A declared shape is checked against the bytes
that carry it before any array exists, so a request can never make the server allocate
more than its own body justifies.
"""

from __future__ import annotations

import math
import re
import struct

import numpy as np
import orjson

from smserve.core import datatypes
from smserve.codecs import textout
from smserve.errors import BadRequest, ServerError
from smserve.core.inference import InferenceRequest, InferenceResponse, OutputTensor, RequestedOutput
from smserve.core.metadata import ModelMetadata, TensorSpec

# SageMaker strips custom request headers, so Triton's SageMaker form carries the JSON
# header's length inside the Content-Type.
SAGEMAKER_BINARY_CONTENT_TYPE = "application/vnd.sagemaker-triton.binary+json;json-header-size="
HEADER_LENGTH_HEADER = "Inference-Header-Content-Length"

MAX_JSON_NESTING = 100
# Triton counts elements and bytes in int64.
_INT64_MAX = 2**63 - 1
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
# numpy cannot make arrays of more dimensions than this (NPY_MAXDIMS in numpy 2).
_MAX_DIMS = 64
# A top-k over more values than this is refused rather than sorted (Triton's limit).
_MAX_CLASSIFICATION_ELEMENTS = 1_000_000
# Parameter keys Triton keeps for itself; request parameters must not use the prefix.
_RESERVED_PREFIX = "triton_"
_UNSUPPORTED_CLASSIFICATION = ("BOOL", "FP16", "BF16", "BYTES")

_LENGTH_PREFIX = struct.Struct("<I")
# std::stoi: leading C whitespace, an optional sign, decimal digits; the rest is ignored.
_STOI = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


# --------------------------------------------------------------------------------------
# The JSON header's length


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
    return _in_body(value, content_length, _shown(rest))


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
    return _in_body(parsed, content_length, _shown(value))


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


def _in_body(value: int, content_length: int, shown: str) -> int:
    # Triton's text says "(0, N)" but 0 and N are both accepted.
    if value < 0 or value > content_length:
        raise BadRequest(f"inference header size should be in range (0, {content_length}), got: {shown}")
    return value


# --------------------------------------------------------------------------------------
# Requests


def decode_request(
    body: bytes | bytearray | memoryview, header_length: int | None, metadata: ModelMetadata
) -> InferenceRequest:
    """Decode a v2 request.

    header_length None: the whole body is the JSON document. 0: a raw binary request,
    the whole body is the model's one input. N: a JSON header of N bytes, then the
    binary inputs' bytes in the order the inputs are listed. An empty body is raw, as
    in Triton (its header length defaults to the body's length, 0).
    """
    view = memoryview(body)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    if header_length == 0 or (header_length is None and len(view) == 0):
        return _decode_raw(view, metadata)
    length = len(view) if header_length is None else header_length
    if length < 0:
        raise BadRequest(f"inference header size should be in range (0, {len(view)}), got: {length}")
    if length > len(view):
        raise BadRequest(f"unexpected size for request JSON, expecting {length - len(view)} more bytes")
    doc = _parse_json(view[:length], header_length is None)
    return _Decoder(doc, view, length, header_length is not None, metadata).request()


def is_v2_document(doc: object) -> bool:
    """A JSON body whose `inputs` lists tensor objects is KServe v2, not simple JSON."""
    inputs = doc.get("inputs") if isinstance(doc, dict) else None
    return isinstance(inputs, list) and (not inputs or all(isinstance(i, dict) for i in inputs))


def decode_json_request(doc: dict, metadata: ModelMetadata) -> InferenceRequest:
    """A v2 request whose whole body is JSON, already parsed (by a caller that had to
    look inside to tell v2 from simple JSON)."""
    return _Decoder(doc, memoryview(b""), 0, False, metadata).request()


def _parse_json(raw: memoryview, whole_body: bool) -> dict:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        if e.msg.startswith("str is not valid UTF-8"):
            try:
                str(raw, "utf-8")
            except UnicodeDecodeError as bad:
                raise BadRequest(f"failed to parse the request JSON buffer: invalid UTF-8 at {bad.start}") from None
        if "depth" in e.msg or "recursion" in e.msg:
            raise BadRequest(f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_NESTING})") from None
        message = f"failed to parse the request JSON buffer: {e.msg} at {e.pos}"
        if e.msg == "unexpected content after document" and whole_body:
            # The usual cause (Triton issues #1822, #4244): binary tensors appended
            # without telling the server where the JSON ends.
            message += (
                f" (Extra data); binary data after the JSON needs the JSON's length in '{HEADER_LENGTH_HEADER}'"
                f" or in the Content-Type '{SAGEMAKER_BINARY_CONTENT_TYPE}<N>'"
            )
        raise BadRequest(message) from None
    if not isinstance(doc, dict):
        raise BadRequest("failed to parse the request JSON buffer: the request must be a JSON object")
    return doc


class _Decoder:
    """One JSON request's walk; holds the cursor into the binary part of the body."""

    def __init__(self, doc: dict, view: memoryview, offset: int, has_header_length: bool, metadata: ModelMetadata):
        self.doc = doc
        self.view = view
        self.offset = offset
        self.has_header_length = has_header_length
        self.metadata = metadata
        self.model = metadata.name
        # Metadata without inputs (or outputs) knows nothing to check names against.
        self.check_inputs = bool(metadata.inputs)
        self.check_outputs = bool(metadata.outputs)

    def request(self) -> InferenceRequest:
        doc = self.doc
        request_id = doc.get("id")
        if "id" in doc and not isinstance(request_id, str):
            raise BadRequest("Unable to parse 'id': attempt to access JSON non-string as string")
        binary_output, parameters = _request_parameters(doc)
        inputs, dtypes = self._inputs()
        outputs = self._outputs()
        return InferenceRequest(
            inputs=inputs,
            datatypes=dtypes,
            outputs=outputs,
            binary_output=binary_output,
            raw=False,
            id=request_id,
            parameters=parameters,
        )

    # -- inputs --------------------------------------------------------------------

    def _inputs(self) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        if "inputs" not in self.doc:
            raise BadRequest("Unable to parse 'inputs': attempt to access non-existing object member 'inputs'")
        items = self.doc["inputs"]
        if not isinstance(items, list):
            raise BadRequest("Unable to parse 'inputs': attempt to access JSON non-array as array")
        arrays: dict[str, np.ndarray] = {}
        dtypes: dict[str, str] = {}
        batch: tuple[str, int] | None = None
        for item in items:
            name, array, datatype = self._input(item, arrays)
            arrays[name] = array
            dtypes[name] = datatype
            # The batcher concatenates along dimension 0, so all inputs must agree on it.
            if self.metadata.max_batch_size > 0 and array.ndim > 0:
                if batch is None:
                    batch = (name, array.shape[0])
                elif array.shape[0] != batch[1]:
                    raise BadRequest(
                        f"input '{name}' batch size does not match other inputs for '{self.model}': "
                        f"{array.shape[0]} but input '{batch[0]}' has {batch[1]}"
                    )
        if self.offset != len(self.view):
            raise BadRequest(f"unexpected additional input data for model '{self.model}'")
        if self.check_inputs:
            missing = [t.name for t in self.metadata.inputs if t.name not in arrays]
            if missing:
                raise BadRequest(
                    f"expected {len(self.metadata.inputs)} inputs but got {len(arrays)} inputs for model "
                    f"'{self.model}'. Got input(s) {_names(arrays)}, but missing required input(s) "
                    f"{_names(missing)}. Please provide all required input(s)."
                )
        return arrays, dtypes

    def _input(self, item: object, seen: dict) -> tuple[str, np.ndarray, str]:
        if not isinstance(item, dict):
            raise BadRequest("Unable to parse 'inputs': each input must be a JSON object")
        name = item.get("name")
        if not isinstance(name, str):
            raise BadRequest("Unable to parse 'name': attempt to access JSON non-string as string")
        parameters = item.get("parameters", {})
        if not isinstance(parameters, dict):
            raise BadRequest(f"Unable to parse 'parameters': attempt to access JSON non-object as object for input '{name}'")
        _check_content_fields(item, parameters, name)
        if "shared_memory_region" in parameters:
            raise BadRequest(f"input '{name}': shared memory is not supported; send the tensor as 'data' or as binary")
        if name in seen:
            raise BadRequest(f"input '{name}' already exists in request")

        spec = self.metadata.input(name)
        if spec is None and self.check_inputs:
            raise BadRequest(f"unexpected inference input '{name}' for model '{self.model}'")
        datatype = item.get("datatype")
        if not isinstance(datatype, str):
            raise BadRequest(f"Unable to parse 'datatype': attempt to access JSON non-string as string for input '{name}'")
        if spec is not None and datatype != spec.datatype:
            raise BadRequest(
                f"inference input '{name}' data-type is '{datatype}', but model '{self.model}' expects '{spec.datatype}'"
            )
        dt = datatypes.by_name(datatype)
        if dt is None:
            raise BadRequest(f"invalid datatype for input {name}")
        shape = _shape(item, name)
        if spec is not None:
            self._check_shape(shape, spec, name)
        count = _element_count(shape, dt, name)

        if "binary_data_size" in parameters:
            array = self._binary_input(parameters["binary_data_size"], dt, shape, count, name)
        else:
            array = _json_input(item["data"], dt, shape, count, name)
        return name, array, datatype

    def _check_shape(self, shape: list[int], spec: TensorSpec, name: str) -> None:
        expected = self.metadata.full_shape(spec)
        if expected is None:  # not known: any shape, with the batch dimension of a batching model
            expected = [-1] if self.metadata.max_batch_size > 0 and not shape else shape
        if len(shape) != len(expected) or any(e >= 0 and e != s for e, s in zip(expected, shape)):
            raise BadRequest(
                f"unexpected shape for input '{name}' for model '{self.model}'. "
                f"Expected {_dims(expected)}, got {_dims(shape)}"
            )

    def _binary_input(self, size: object, dt: datatypes.DataType, shape: list[int], count: int, name: str) -> np.ndarray:
        if type(size) is not int or size < 0:
            raise BadRequest(f"Unable to parse 'binary_data_size' for input '{name}'")
        available = len(self.view) - self.offset
        if size > available:
            if not self.has_header_length:
                raise BadRequest(
                    f"input '{name}' is sent as binary data, so the request must give the JSON's length in "
                    f"'{HEADER_LENGTH_HEADER}' or in the Content-Type '{SAGEMAKER_BINARY_CONTENT_TYPE}<N>'"
                )
            raise BadRequest(
                f"unexpected size for input '{name}', expecting {size - available} additional bytes "
                f"for model '{self.model}'"
            )
        blob = self.view[self.offset : self.offset + size]
        self.offset += size
        return _from_binary(blob, dt, shape, count, name, self.model)

    # -- outputs -------------------------------------------------------------------

    def _outputs(self) -> list[RequestedOutput] | None:
        if "outputs" not in self.doc:
            return None
        items = self.doc["outputs"]
        if not isinstance(items, list):
            raise BadRequest("Unable to parse 'outputs': attempt to access JSON non-array as array")
        requested: dict[str, RequestedOutput] = {}
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise BadRequest("Unable to parse 'outputs': each output must be an object with a string 'name'")
            name = item["name"]
            parameters = item.get("parameters", {})
            if not isinstance(parameters, dict):
                raise BadRequest(
                    f"Unable to parse 'parameters': attempt to access JSON non-object as object for output '{name}'"
                )
            if "shared_memory_region" in parameters:
                raise BadRequest(f"output '{name}': shared memory is not supported")
            if name in requested:
                raise BadRequest(f"output '{name}' already exists in request")
            if self.check_outputs and self.metadata.output(name) is None:
                raise BadRequest(f"unexpected inference output '{name}' for model '{self.model}'")
            binary = parameters.get("binary_data")
            if binary is not None and not isinstance(binary, bool):
                raise BadRequest(f"Unable to parse 'binary_data' for output '{name}'")
            classes = parameters.get("classification", 0)
            if type(classes) is not int or classes < 0:
                raise BadRequest(f"Unable to set 'classification' for output '{name}'")
            requested[name] = RequestedOutput(name=name, binary=binary, classification=classes)
        # No listed output means every output (Triton's Normalize).
        return list(requested.values()) or None


def _check_content_fields(item: dict, parameters: dict, name: str) -> None:
    present = [
        field
        for field, there in (
            ("'data'", "data" in item),
            ("'binary_data_size'", "binary_data_size" in parameters),
            ("'shared_memory_region'", "shared_memory_region" in parameters),
        )
        if there
    ]
    if len(present) != 1:
        found = " no field is set" if not present else " set " + " ".join(present)
        raise BadRequest(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
            f"'shared_memory_region' in 'parameters'. But{found} for input '{name}'"
        )


def _request_parameters(doc: dict) -> tuple[bool, dict]:
    if "parameters" not in doc:
        return False, {}
    parameters = doc["parameters"]
    if not isinstance(parameters, dict):
        raise BadRequest("Unable to parse 'parameters': attempt to access JSON non-object as object")
    binary_output = False
    forwarded = {}
    for key, value in parameters.items():
        if key.startswith(_RESERVED_PREFIX):
            raise BadRequest(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
            )
        if key == "binary_data_output":
            if not isinstance(value, bool):
                raise BadRequest("Unable to parse 'binary_data_output'")
            binary_output = value
            continue
        if key in ("sequence_start", "sequence_end"):
            ok = isinstance(value, bool)
        elif key in ("priority", "timeout"):
            ok = type(value) is int and value >= 0
        elif key == "sequence_id":
            ok = isinstance(value, str) or (type(value) is int and value >= 0)
        else:
            ok = isinstance(value, (str, int, float))  # bool is an int
        if not ok:
            raise BadRequest(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")
        forwarded[key] = value
    return binary_output, forwarded


def _shape(item: dict, name: str) -> list[int]:
    if "shape" not in item:
        raise BadRequest(f"Unable to parse 'shape': attempt to access non-existing object member 'shape' for input '{name}'")
    shape = item["shape"]
    if not isinstance(shape, list):
        raise BadRequest(f"Unable to parse 'shape': attempt to access JSON non-array as array for input '{name}'")
    if not all(type(d) is int and d >= 0 for d in shape):
        raise BadRequest(
            "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer "
            f"for input '{name}'"
        )
    if len(shape) > _MAX_DIMS:
        raise BadRequest(f"invalid shape for input '{name}': {len(shape)} dimensions, at most {_MAX_DIMS} are supported")
    return shape


def _element_count(shape: list[int], dt: datatypes.DataType, name: str) -> int:
    """Elements in `shape`, refusing counts and byte sizes that do not fit in int64.

    A shape with a zero dimension holds no elements, but numpy still refuses one whose
    other dimensions overflow, so those are checked too.
    """
    count = math.prod(shape)  # a scalar (shape []) holds one element, as in numpy
    if count > _INT64_MAX or math.prod(d for d in shape if d) > _INT64_MAX:
        raise BadRequest(
            f"invalid shape for input '{name}': shape {_dims(shape)} causes total element count to exceed "
            f"maximum size of {_INT64_MAX}"
        )
    size = dt.size or _LENGTH_PREFIX.size  # each BYTES element takes at least its length prefix
    if count * size > _INT64_MAX or math.prod(d for d in shape if d) * size > _INT64_MAX:
        raise BadRequest(
            f"byte size overflow for input '{name}': element count ({count}) * data type size ({size}) "
            f"exceeds maximum allowed size ({_INT64_MAX})"
        )
    return count


def _from_binary(
    blob: memoryview, dt: datatypes.DataType, shape: list[int], count: int, name: str, model: str
) -> np.ndarray:
    """An array over `blob`'s bytes: a view, except for BYTES and BF16."""
    if dt.is_bytes:
        elements = deserialize_bytes(blob, count, name, model)
        array = np.empty(count, dtype=object)
        array[:] = elements
        return array.reshape(shape)
    expected = count * dt.size
    if len(blob) != expected:
        raise BadRequest(
            f"input byte size mismatch for input '{name}' for model '{model}'. Expected {expected}, got {len(blob)}"
        )
    if dt.name == "BF16":
        return bf16_to_float32(np.frombuffer(blob, dtype=_wire_uint(dt), count=count)).reshape(shape)
    if dt.name == "BOOL":
        # numpy bools other than 0/1 compare and sum inconsistently; refuse them at the door.
        raw = np.frombuffer(blob, dtype=np.uint8, count=count)
        if count and raw.max() > 1:
            raise BadRequest(f"BOOL input '{name}' for model '{model}' has a byte other than 0 or 1")
    return np.frombuffer(blob, dtype=dt.dtype, count=count).reshape(shape)


def _wire_uint(dt: datatypes.DataType) -> np.dtype:
    return np.dtype(f"<u{dt.size}")


def deserialize_bytes(blob: memoryview | bytes, count: int, name: str = "", model: str = "") -> list[bytes]:
    """`count` BYTES elements, each a 4-byte little-endian length and that many bytes."""
    if count * _LENGTH_PREFIX.size > len(blob):
        # Refused before any element list exists: every element needs its prefix.
        raise BadRequest(
            f"expected {count} string elements for inference input '{name}' for model '{model}', "
            f"but its {len(blob)} bytes hold at most {len(blob) // _LENGTH_PREFIX.size}"
        )
    data = bytes(blob)  # slicing bytes yields bytes: one allocation per element
    end = len(data)
    unpack = _LENGTH_PREFIX.unpack_from
    elements: list[bytes] = []
    pos = 0
    while pos < end:
        if end - pos < _LENGTH_PREFIX.size:
            raise BadRequest(
                f"incomplete string length indicator for inference input '{name}' for model '{model}', "
                f"expecting {_LENGTH_PREFIX.size} bytes but only {end - pos} bytes available"
            )
        (length,) = unpack(data, pos)
        pos += _LENGTH_PREFIX.size
        if length > end - pos:
            raise BadRequest(
                f"element {len(elements)} of inference input '{name}' for model '{model}' declares {length} "
                f"bytes but only {end - pos} bytes remain"
            )
        elements.append(data[pos : pos + length])
        pos += length
        if len(elements) > count:
            # Count the rest only to say how many there were; each costs >= 4 bytes.
            extra = _count_bytes_elements(data, pos)
            raise BadRequest(
                f"unexpected number of string elements {count + 1 + extra} for inference input '{name}' "
                f"for model '{model}', expecting {count}"
            )
    if len(elements) != count:
        raise BadRequest(
            f"expected {count} string elements for inference input '{name}' for model '{model}', got {len(elements)}"
        )
    return elements


def _count_bytes_elements(data: bytes, pos: int) -> int:
    n = 0
    while pos + _LENGTH_PREFIX.size <= len(data):
        (length,) = _LENGTH_PREFIX.unpack_from(data, pos)
        pos += _LENGTH_PREFIX.size + length
        n += 1
    return n


def _json_input(data: object, dt: datatypes.DataType, shape: list[int], count: int, name: str) -> np.ndarray:
    if not dt.json_ok:
        raise BadRequest(
            f"receiving {dt.name} data via JSON is not supported. Please use the binary data format for input {name}"
        )
    if count == 0:
        # Triton does not read 'data' for an empty tensor either.
        return np.empty(shape, dtype=dt.dtype)
    if not isinstance(data, list):
        raise BadRequest(f"Unable to parse 'data': attempt to access JSON non-array as array for input '{name}'")
    leaves: list = []
    _flatten_into(data, 1, leaves, name)
    if len(leaves) > count:
        raise BadRequest(f"Unable to parse 'data': Shape does not match true shape of 'data' field for input '{name}'")
    if len(leaves) < count:
        raise BadRequest(f"Failed to parse 'data' field: shape does not match true shape for input '{name}'")
    return _leaves_to_array(leaves, dt, name).reshape(shape)


def _flatten_into(values: list, depth: int, out: list, name: str) -> None:
    """Row-major leaves of nested lists; only the number of leaves must match the shape,
    so ragged nesting is accepted, as Triton does."""
    if depth > MAX_JSON_NESTING:
        raise BadRequest(f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_NESTING}) for input '{name}'")
    if list not in set(map(type, values)):
        out.extend(values)  # the common case, innermost rows: no Python loop per leaf
        return
    for v in values:
        if type(v) is list:
            _flatten_into(v, depth + 1, out, name)
        else:
            out.append(v)


def _leaves_to_array(leaves: list, dt: datatypes.DataType, name: str) -> np.ndarray:
    kind = dt.dtype.kind
    if dt.is_bytes:
        if not _only(leaves, str):
            raise BadRequest(f"Unable to parse JSON bytes array: attempt to access JSON non-string as string for input '{name}'")
        array = np.empty(len(leaves), dtype=object)
        try:
            array[:] = [v.encode("utf-8") for v in leaves]
        except UnicodeEncodeError:  # a lone surrogate escape such as "\ud800"
            raise BadRequest(f"Unable to parse 'data': a string is not valid Unicode for input '{name}'") from None
        return array
    if kind == "b":
        if not _only(leaves, bool):
            raise BadRequest(f"Unable to parse 'data': attempt to access JSON non-boolean as boolean for input '{name}'")
        return np.array(leaves, dtype=dt.dtype)
    if kind in "iu":
        # JSON true/false and 1.0 are not integers (Triton's AsInt64/AsUInt agree).
        if not _only(leaves, int):
            what = "unsigned-integer" if kind == "u" else "signed-integer"
            raise BadRequest(f"Unable to parse 'data': attempt to access JSON non-{what} as {what} for input '{name}'")
        try:
            return np.array(leaves, dtype=dt.dtype)
        except OverflowError:
            if kind == "u" and min(leaves) < 0:
                raise BadRequest(
                    "Unable to parse 'data': attempt to access JSON non-unsigned-integer as unsigned-integer "
                    f"for input '{name}'"
                ) from None
            raise BadRequest(f"Unable to parse 'data': a value is out of range for {dt.name} for input '{name}'") from None
    # FP32 / FP64: any JSON number; values beyond FP32's range become inf, as a C cast does.
    if not _only(leaves, float, int):
        raise BadRequest(f"Unable to parse 'data': attempt to access JSON non-number as double for input '{name}'")
    try:
        with np.errstate(over="ignore"):
            return np.array(leaves, dtype=dt.dtype)
    except OverflowError:
        raise BadRequest(f"Unable to parse 'data': a value is out of range for {dt.name} for input '{name}'") from None


def _only(values: list, *types: type) -> bool:
    """Whether every value is exactly one of `types` (bool is not an int here)."""
    return set(map(type, values)) <= set(types)


def _decode_raw(view: memoryview, metadata: ModelMetadata) -> InferenceRequest:
    """A raw binary request: the body is the model's one input (Triton's rules)."""
    model = metadata.name
    if len(metadata.inputs) != 1:
        raise BadRequest(
            f"Raw request must only have 1 input (found 1) to be deduced but got {len(metadata.inputs)} inputs "
            f"in '{model}' model configuration"
        )
    spec = metadata.inputs[0]
    dt = spec.dtype
    if spec.shape is None:
        raise BadRequest(
            f"The shape of the raw input '{spec.name}' can not be deduced because the model's shape is not known "
            "(declare it in metadata.json, or send a KServe v2 header that gives it)"
        )
    batch = [1] if metadata.max_batch_size > 0 else []
    if dt.is_bytes:
        # The body is one bare element; there is no length prefix to read.
        if tuple(spec.shape) != (1,):
            raise BadRequest(f"For BYTE datatype raw input '{spec.name}', the model must have input shape [1]")
        array = np.empty(1, dtype=object)
        array[0] = bytes(view)
        return _raw_request(spec, array.reshape(batch + [1]))
    dims = list(spec.shape)
    variable = [i for i, d in enumerate(dims) if d < 0]
    if len(variable) > 1:
        raise BadRequest(
            f"The shape of the raw input '{spec.name}' can not be deduced because there are more than one "
            "variable-sized dimension"
        )
    if variable:
        per_unit = math.prod(d for d in dims if d >= 0) * dt.size
        if per_unit == 0 or len(view) % per_unit:
            if not (per_unit == 0 and len(view) == 0):
                raise BadRequest(
                    f"input byte size mismatch for input '{spec.name}' for model '{model}'. "
                    f"Expected a multiple of {per_unit}, got {len(view)}"
                )
            dims[variable[0]] = 0
        else:
            dims[variable[0]] = len(view) // per_unit
    shape = batch + dims
    count = _element_count(shape, dt, spec.name)
    return _raw_request(spec, _from_binary(view, dt, shape, count, spec.name, model))


def _raw_request(spec: TensorSpec, array: np.ndarray) -> InferenceRequest:
    return InferenceRequest(
        inputs={spec.name: array},
        datatypes={spec.name: spec.datatype},
        outputs=None,
        binary_output=True,
        raw=True,
    )


# --------------------------------------------------------------------------------------
# Responses


def build_response(
    request: InferenceRequest, results: dict[str, np.ndarray], metadata: ModelMetadata
) -> InferenceResponse:
    """Select, order, encode-kind and classify the model's results as the request asked."""
    if request.outputs is None:
        # The declared outputs in their order, then any other the model returned (a
        # TorchScript model's derived metadata knows only output__0 of its tuple): the
        # simple protocols answer every output, and so does this.
        declared = [t.name for t in metadata.outputs]
        names = declared + [name for name in results if name not in declared]
        # Unlisted outputs follow `binary_data_output`; a raw request gets only binary.
        wanted = [(name, request.raw or request.binary_output, 0) for name in names]
    else:
        # A listed output is JSON unless it asks for binary, whatever `binary_data_output` says.
        wanted = [(o.name, request.raw or bool(o.binary), o.classification) for o in request.outputs]
    outputs = []
    for name, binary, classes in wanted:
        if name not in results:
            raise ServerError(f"model '{metadata.name}' did not produce output '{name}'")
        spec = metadata.output(name)
        datatype = spec.datatype if spec is not None else _datatype_of(results[name], name)
        array = _output_array(results[name], datatype, name)
        if classes > 0:
            labels = spec.labels if spec is not None else None
            array = _classify(array, datatype, classes, labels, metadata.max_batch_size > 0, name)
            datatype = "BYTES"
        if not binary:
            array = _json_ready(array, datatype, name)
        outputs.append(OutputTensor(name=name, datatype=datatype, data=array, binary=binary))
    return InferenceResponse(
        model_name=metadata.name,
        model_version=metadata.version,
        outputs=outputs,
        id=request.id,
    )


def _datatype_of(value: object, name: str) -> str:
    try:
        return datatypes.from_numpy(np.asarray(value).dtype).name
    except TypeError as e:
        raise ServerError(f"output '{name}': {e}") from None


def _output_array(value: object, datatype: str, name: str) -> np.ndarray:
    """The model's result as the array its declared datatype travels as."""
    dt = datatypes.BY_NAME[datatype]
    array = np.asarray(value)
    if dt.is_bytes:
        if array.dtype.kind not in "OSU":
            raise ServerError(f"output '{name}' is declared BYTES but the model returned {array.dtype}")
        return array
    if array.dtype == dt.dtype:
        return array
    # Widening or narrowing within a kind is fine (float64 -> FP32); float -> int is not.
    if not np.can_cast(array.dtype, dt.dtype, casting="same_kind"):
        raise ServerError(f"output '{name}' is declared {datatype} but the model returned {array.dtype}")
    return array.astype(dt.dtype)


def _classify(
    array: np.ndarray, datatype: str, k: int, labels: tuple[str, ...] | None, batching: bool, name: str
) -> np.ndarray:
    """Top-k "<value>:<index>[:<label>]" strings per sample, highest value first."""
    if datatype in _UNSUPPORTED_CLASSIFICATION:
        raise BadRequest(f"class result not available for output '{name}' due to unsupported type '{datatype}'")
    if array.size > _MAX_CLASSIFICATION_ELEMENTS:
        raise BadRequest(f"classification output tensor too large for output '{name}'")
    if batching:
        if array.ndim == 0:
            raise ServerError(f"output '{name}' of a batching model has no batch dimension")
        rows = array.reshape(array.shape[0], math.prod(array.shape[1:]))
    else:
        rows = array.reshape(1, array.size)
    n = rows.shape[1]
    k = min(k, n)
    # Stable sort of the reversed rows, then reversed back: descending values with ties
    # in ascending index order, so equal scores list the lower class first.
    ascending = np.argsort(rows[:, ::-1], axis=1, kind="stable")
    top = (n - 1) - ascending[:, ::-1][:, :k]
    values = np.take_along_axis(rows, top, axis=1)
    # std::to_string: "%f" for floating point, plain digits for integers.
    fmt = "%f".__mod__ if rows.dtype.kind == "f" else str
    out = np.empty(top.shape, dtype=object)
    for r, (row_values, row_top) in enumerate(zip(values.tolist(), top.tolist())):
        for c, (value, index) in enumerate(zip(row_values, row_top)):
            text = f"{fmt(value)}:{index}"
            if labels is not None and index < len(labels):
                text += f":{labels[index]}"
            out[r, c] = text.encode("utf-8")
    return out if batching else out.reshape(k)


def _json_ready(array: np.ndarray, datatype: str, name: str) -> np.ndarray:
    """Refuse what JSON cannot carry; BYTES become str so encoding cannot fail later."""
    if not datatypes.BY_NAME[datatype].json_ok:
        raise BadRequest(
            f"sending {datatype} data via JSON is not supported. Please use the binary data format for output '{name}'"
        )
    if datatype != "BYTES":
        return array
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    try:
        for i, value in enumerate(array.reshape(-1).tolist()):
            flat[i] = value.decode("utf-8") if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError:
        raise BadRequest(
            f"output '{name}' holds bytes that are not UTF-8, which JSON cannot carry; "
            "request it with 'binary_data': true"
        ) from None
    return out


def encode_response(response: InferenceResponse) -> tuple[bytes, int | None]:
    """The response body and its JSON header's length; None when the body is only JSON.

    Compact JSON, then each binary output's bytes in output order. Zero-size binary
    outputs declare binary_data_size 0 and add no bytes; with no bytes at all the
    response is plain JSON, as Triton sends it.
    """
    head: dict = {}
    if response.id:
        head["id"] = response.id
    head["model_name"] = response.model_name
    head["model_version"] = response.model_version
    if response.parameters:
        head["parameters"] = response.parameters
    # The header as pieces joined once: each whole-body copy of a big JSON answer
    # holds the GIL (~50 ms for 25 MB, mostly page faults) while /ping waits.
    header = [textout.dumps(head)[:-1], b',"outputs":[']
    blobs = []
    for tensor in response.outputs:
        entry = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.data.shape)}
        if tensor.binary:
            blob = to_binary(tensor.data, tensor.datatype)
            entry["parameters"] = {"binary_data_size": blob.nbytes}
            if blob.nbytes:
                blobs.append(blob)
            header.append(textout.dumps(entry))
        else:
            # The data, often most of the body, is written a bounded slice at a time.
            header += [textout.dumps(entry)[:-1], b',"data":', *_json_data(tensor.data, tensor.datatype), b"}"]
        header.append(b",")
    if response.outputs:
        header.pop()
    header.append(b"]}")
    # Non-ASCII names and ids go out as UTF-8; ones with lone surrogates (which UTF-8
    # cannot carry) are escaped by textout.dumps' fallback, so encoding never fails.
    if not blobs:
        return b"".join(header), None
    # One copy of each tensor: straight from its memory into the body.
    return b"".join([*header, *blobs]), sum(memoryview(p).nbytes for p in header)


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


def to_binary(array: np.ndarray, datatype: str) -> np.ndarray:
    """A tensor's wire bytes, as a 1-D uint8 array (a view where the memory already is)."""
    dt = datatypes.BY_NAME[datatype]
    if dt.is_bytes:
        return np.frombuffer(serialize_bytes(array), dtype=np.uint8)
    if dt.name == "BF16":
        array = float32_to_bf16(np.asarray(array, dtype=np.float32))
    else:
        array = np.ascontiguousarray(array, dtype=dt.dtype)
    return array.reshape(-1).view(np.uint8)


def _json_data(array: np.ndarray, datatype: str) -> list:
    """A flat JSON list, as pieces to join; NaN and infinities as null (JSON has no
    spelling for them)."""
    if datatype == "BYTES":
        return [textout.dumps([v if isinstance(v, str) else v.decode("utf-8") for v in array.reshape(-1).tolist()])]
    return textout.array_json_parts(np.ravel(array))


def serialize_bytes(array: np.ndarray) -> bytes:
    """BYTES elements, row-major, each as a 4-byte little-endian length and the bytes.

    str elements travel as UTF-8; other objects as the UTF-8 of str(), as tritonclient does.
    """
    parts = []
    pack = _LENGTH_PREFIX.pack
    for value in np.asarray(array).reshape(-1).tolist():
        if not isinstance(value, bytes):
            value = str(value).encode("utf-8")
        parts.append(pack(len(value)))
        parts.append(value)
    return b"".join(parts)


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """BF16 is the upper half of a float32: widening is exact."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> BF16 bits, rounding to nearest even (as torch and ml_dtypes do);
    NaN stays a quiet NaN instead of rounding into infinity."""
    bits = np.ascontiguousarray(values, dtype="<f4").view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16
    nan = np.isnan(values)
    if nan.any():
        rounded = np.where(nan, (bits >> 16) | 0x0040, rounded)
    return rounded.astype("<u2")


def encode_error(message: str) -> bytes:
    """The `{"error":"..."}` body every v2 error carries (compact, as Triton's clients grep it)."""
    return textout.dumps({"error": message})


def _dims(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _names(names) -> str:
    return "[" + ", ".join(f"'{n}'" for n in names) + "]"


__all__ = [
    "SAGEMAKER_BINARY_CONTENT_TYPE",
    "HEADER_LENGTH_HEADER",
    "MAX_JSON_NESTING",
    "sagemaker_header_length",
    "header_length_from_header",
    "decode_request",
    "build_response",
    "encode_response",
    "encode_error",
    "response_headers",
    "serialize_bytes",
    "deserialize_bytes",
    "bf16_to_float32",
    "float32_to_bf16",
    "to_binary",
]

"""A v2 tensor's two wire forms: Triton's binary extension and the JSON `data` list.

Little-endian, row-major, no padding; BOOL one byte 0/1; BYTES elements a 4-byte
length and the bytes; BF16 the upper half of a float32. Binary inputs become numpy
views on the request body (no copy) wherever the wire format already is the array's
memory: BYTES and BF16 are the only conversions. A declared shape is checked against
the bytes that carry it before any array exists, so a request can never make the
server allocate more than its own body justifies.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from smserve.codecs import textout
from smserve.codecs.limits import MAX_JSON_DEPTH
from smserve.core import datatypes
from smserve.errors import BadRequest

# Triton counts elements and bytes in int64.
INT64_MAX = 2**63 - 1
LENGTH_PREFIX = struct.Struct("<I")


def element_count(shape: list[int], dt: datatypes.DataType, name: str) -> int:
    """Elements in `shape`, refusing counts and byte sizes that do not fit in int64.

    A shape with a zero dimension holds no elements, but numpy still refuses one whose
    other dimensions overflow, so those are checked too.
    """
    count = math.prod(shape)  # a scalar (shape []) holds one element, as in numpy
    if count > INT64_MAX or math.prod(d for d in shape if d) > INT64_MAX:
        raise BadRequest(
            f"invalid shape for input '{name}': shape {dims_text(shape)} causes total element count to exceed "
            f"maximum size of {INT64_MAX}"
        )
    size = dt.size or LENGTH_PREFIX.size  # each BYTES element takes at least its length prefix
    if count * size > INT64_MAX or math.prod(d for d in shape if d) * size > INT64_MAX:
        raise BadRequest(
            f"byte size overflow for input '{name}': element count ({count}) * data type size ({size}) "
            f"exceeds maximum allowed size ({INT64_MAX})"
        )
    return count


def from_binary(
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
    if count * LENGTH_PREFIX.size > len(blob):
        # Refused before any element list exists: every element needs its prefix.
        raise BadRequest(
            f"expected {count} string elements for inference input '{name}' for model '{model}', "
            f"but its {len(blob)} bytes hold at most {len(blob) // LENGTH_PREFIX.size}"
        )
    data = bytes(blob)  # slicing bytes yields bytes: one allocation per element
    end = len(data)
    unpack = LENGTH_PREFIX.unpack_from
    elements: list[bytes] = []
    pos = 0
    while pos < end:
        if end - pos < LENGTH_PREFIX.size:
            raise BadRequest(
                f"incomplete string length indicator for inference input '{name}' for model '{model}', "
                f"expecting {LENGTH_PREFIX.size} bytes but only {end - pos} bytes available"
            )
        (length,) = unpack(data, pos)
        pos += LENGTH_PREFIX.size
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
    while pos + LENGTH_PREFIX.size <= len(data):
        (length,) = LENGTH_PREFIX.unpack_from(data, pos)
        pos += LENGTH_PREFIX.size + length
        n += 1
    return n


def json_input(data: object, dt: datatypes.DataType, shape: list[int], count: int, name: str) -> np.ndarray:
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
    if depth > MAX_JSON_DEPTH:
        raise BadRequest(f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH}) for input '{name}'")
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
        if not _all_exactly(leaves, str):
            raise BadRequest(f"Unable to parse JSON bytes array: attempt to access JSON non-string as string for input '{name}'")
        array = np.empty(len(leaves), dtype=object)
        try:
            array[:] = [v.encode("utf-8") for v in leaves]
        except UnicodeEncodeError:  # a lone surrogate escape such as "\ud800"
            raise BadRequest(f"Unable to parse 'data': a string is not valid Unicode for input '{name}'") from None
        return array
    if kind == "b":
        if not _all_exactly(leaves, bool):
            raise BadRequest(f"Unable to parse 'data': attempt to access JSON non-boolean as boolean for input '{name}'")
        return np.array(leaves, dtype=dt.dtype)
    if kind in "iu":
        # JSON true/false and 1.0 are not integers (Triton's AsInt64/AsUInt agree).
        if not _all_exactly(leaves, int):
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
    if not _all_exactly(leaves, float, int):
        raise BadRequest(f"Unable to parse 'data': attempt to access JSON non-number as double for input '{name}'")
    try:
        with np.errstate(over="ignore"):
            return np.array(leaves, dtype=dt.dtype)
    except OverflowError:
        raise BadRequest(f"Unable to parse 'data': a value is out of range for {dt.name} for input '{name}'") from None


def _all_exactly(values: list, *types: type) -> bool:
    """Whether every value is exactly one of `types` (bool is not an int here)."""
    return set(map(type, values)) <= set(types)




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


def json_data(array: np.ndarray, datatype: str) -> list:
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
    pack = LENGTH_PREFIX.pack
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



def dims_text(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


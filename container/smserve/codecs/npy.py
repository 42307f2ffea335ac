"""The .npy format, read as a view and written as header + buffer.

numpy's own reader parses the header dict with `ast.literal_eval` (safe, but a cost
every small request pays) and np.load would allocate whatever shape a tiny body claims.
Here the header numpy writes, `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }`,
is matched by a strict pattern: a plain dtype string, a bool, a tuple of integers, and
nothing else. Anything else (another writer's spelling) goes to numpy's reader, which
evaluates literals only; object and structured dtypes are refused either way, so nothing
from a request is ever unpickled. The array is a view on the body (no copy).
"""

from __future__ import annotations

import io
import re
import struct

import numpy as np

from smserve import memo
from smserve.codecs.limits import MAX_DIMS
from smserve.errors import BadRequest

MAGIC = b"\x93NUMPY"
# numpy >= 1.14 pads the header so the data starts on a 64-byte boundary.
_ALIGN = 64
# No real dimension has more digits than this (2**64 has 20).
_MAX_DIM_DIGITS = 20
_DESCR = r"""(?P<q>['"])(?P<descr>[<>|=]?[biuf][1-8])(?P=q)"""
_ORDER = r"(?P<order>True|False)"
_SHAPE = r"\((?P<shape>\s*(?:\d+\s*,\s*)*(?:\d+\s*)?)\)"
_ENTRY = {
    "descr": _DESCR,
    "fortran_order": _ORDER,
    "shape": _SHAPE,
}
# numpy's order (keys sorted); other orders go to numpy's reader. No two quantifiers
# here may take the same byte (as `\s*,?\s*` would): the match stays linear in the
# header's length, whatever a client pads it with.
_HEADER = re.compile(
    r"\{\s*"
    + r"\s*,\s*".join(rf"""['"]{key}['"]\s*:\s*{value}""" for key, value in _ENTRY.items())
    + r"\s*(?:,\s*)?\}\s*"
)


# A client sends one shape and dtype again and again, so each header's parse (and each
# answer's header) is kept: a look-up instead of parsing and formatting each time.
# Cleared when full, so a client varying its shapes costs memory for this many.
HEADERS_KEPT = 256
_parsed: dict[bytes, tuple] = {}
_written: dict[tuple, bytes] = {}


def read(body: bytes) -> np.ndarray:
    """A .npy body -> an array viewing the body's bytes (numeric dtypes only)."""
    key = _header_bytes(body)
    known = _parsed.get(key) if key is not None else None
    if known is None:
        known = _checked_header(body)
        if key is not None:
            memo.keep(_parsed, key, known, HEADERS_KEPT)
    shape, fortran_order, dtype, offset, count = known
    data = len(body) - offset
    if count * dtype.itemsize != data:
        raise BadRequest(
            f"the .npy header declares shape {list(shape)} of {dtype} ({count * dtype.itemsize} bytes) "
            f"but {data} bytes follow it"
        )
    try:
        array = np.frombuffer(body, dtype=dtype, count=count, offset=offset)
        return array.reshape(shape, order="F" if fortran_order else "C")
    except (ValueError, OverflowError) as e:  # e.g. a zero-size array with absurd dimensions
        raise BadRequest(f"the .npy header declares an unusable shape {list(shape)}: {e}") from None


def _header_bytes(body: bytes) -> bytes | None:
    """The magic, version 1.0 and header of a body as bytes (what the parse is kept
    under), or None for any other version or a body too short to hold them."""
    if len(body) < 10 or body[6:8] != b"\x01\x00":
        return None
    end = 10 + (body[8] | body[9] << 8)
    return bytes(body[:end]) if end <= len(body) else None


def _checked_header(body: bytes) -> tuple[tuple, bool, np.dtype, int, int]:
    """The header parsed and checked: shape, Fortran order, dtype, data offset, count."""
    shape, fortran_order, dtype, offset = _header(body)
    # type(), not isinstance: True and False are ints to isinstance, and no dimension.
    if not all(type(d) is int and d >= 0 for d in shape) or len(shape) > MAX_DIMS:
        raise BadRequest(f"the .npy header declares an invalid shape {shape!r}")
    if dtype.hasobject:
        raise BadRequest("the .npy body holds Python objects, which are never unpickled; send a numeric array")
    if dtype.kind not in "biuf":
        raise BadRequest(f"the .npy array has dtype {dtype}; send a numeric array")
    count = 1
    for dim in shape:
        count *= dim
    return shape, fortran_order, dtype, offset, count


def _header(body: bytes) -> tuple[tuple, bool, np.dtype, int]:
    if body[:6] != MAGIC or len(body) < 10:
        raise BadRequest("body is not a valid .npy array: it does not start with the .npy magic string")
    major = body[6]
    if major == 1:
        (length,), start = struct.unpack_from("<H", body, 8), 10
    elif major in (2, 3):
        if len(body) < 12:
            raise BadRequest("body is not a valid .npy array: the header is cut short")
        (length,), start = struct.unpack_from("<I", body, 8), 12
    else:
        raise BadRequest(f"body is not a valid .npy array: unknown format version {major}.{body[7]}")
    end = start + length
    if end > len(body):
        raise BadRequest("body is not a valid .npy array: the header is cut short")
    try:
        text = body[start:end].decode("utf-8" if major == 3 else "latin1")
    except UnicodeDecodeError:
        raise BadRequest("body is not a valid .npy array: the header is not UTF-8") from None
    match = _HEADER.fullmatch(text)
    if match is None:
        return (*_numpy_header(body), end)
    dims = match["shape"].replace(",", " ").split()
    if any(len(d) > _MAX_DIM_DIGITS for d in dims):  # (int() refuses 4,300+ digits: ValueError)
        raise BadRequest(f"the .npy header declares an invalid shape ({match['shape'][:40]}...)")
    shape = tuple(int(d) for d in dims)
    try:
        dtype = np.dtype(match["descr"])
    except TypeError:  # a size numpy lacks: '<f5', '<i3'
        raise BadRequest(f"the .npy header declares a dtype numpy does not have: {match['descr']!r}") from None
    return shape, match["order"] == "True", dtype, end


def _numpy_header(body: bytes) -> tuple[tuple, bool, np.dtype]:
    """numpy's reader (literal evaluation only) for headers spelt another way."""
    stream = io.BytesIO(body)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(stream)
        return np.lib.format.read_array_header_2_0(stream)
    except Exception as e:  # any malformed header: numpy raises many kinds
        raise BadRequest(f"body is not a valid .npy array: {type(e).__name__}: {e}") from None


def header(array: np.ndarray) -> bytes:
    """The .npy header np.save writes for a C-ordered array of this dtype and shape."""
    key = (array.dtype, array.shape)
    made = _written.get(key)
    if made is None:
        made = memo.keep(_written, key, _make_header(array), HEADERS_KEPT)
    return made


def _make_header(array: np.ndarray) -> bytes:
    descr = np.lib.format.dtype_to_descr(array.dtype)
    shape = "(" + "".join(f"{d}, " for d in array.shape)[:-2] + ("," if array.ndim == 1 else "") + ")"
    text = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {shape}, }}"
    # magic(6) + version(2) + length(2) + text + padding + "\n", a multiple of _ALIGN.
    size = len(text) + 1
    pad = -(10 + size) % _ALIGN
    if size + pad > 0xFFFF:  # only arrays of many dimensions need format 2.0
        pad = -(12 + size) % _ALIGN
        return MAGIC + b"\x02\x00" + struct.pack("<I", size + pad) + (text + " " * pad + "\n").encode("latin1")
    return MAGIC + b"\x01\x00" + struct.pack("<H", size + pad) + (text + " " * pad + "\n").encode("latin1")


def write(array: np.ndarray) -> bytes:
    """One .npy body: header + the array's memory, in one join (one copy of the data)."""
    if array.dtype.hasobject or array.dtype.kind not in "biufc":
        raise ValueError(f"an array of dtype {array.dtype} has no .npy form without pickling")
    if not array.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
        array = array.copy(order="C")
    return b"".join((header(array), array.reshape(-1).view(np.uint8).data))

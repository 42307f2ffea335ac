"""How big a piece of work one C call may take, so the event loop keeps the GIL's turns.

The server decodes and encodes on a codec thread while the gevent loop answers /ping
on another. json/orjson/np.loadtxt and numpy's conversions are C code that hold the
GIL for their whole run (bench/RESULTS.md has the figures), and the loop only gets the
GIL back between Python-level steps. So every codec step whose cost grows with the
body works in pieces of about these sizes, each a few milliseconds on one core, and
stitches the pieces together; the result is identical to doing it in one call.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

# Text handed to one orjson.loads call (with the float64 conversion): a few milliseconds.
TEXT_BYTES = 256 * 1024
# Text handed to one np.loadtxt call: its reader is several times slower than orjson's,
# so an eighth.
CSV_TEXT_BYTES = 32 * 1024
# Values converted, cast or formatted by one numpy / orjson.dumps call.
VALUES = 1 << 16
# Bytes scanned by one vectorised step over a JSON body (a few numpy passes).
SCAN_BYTES = 1 << 20


def row_slices(array: np.ndarray, values: int | None = None) -> Iterator[slice]:
    """Slices along dimension 0, each holding about `values` elements (at least one row)."""
    rows = len(array)
    per_row = max(1, array.size // rows) if rows else 1
    step = max(1, (values or VALUES) // per_row)
    for start in range(0, rows, step):
        yield slice(start, min(start + step, rows))


def pieces(array: np.ndarray, values: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """(flat offset of its first value, a 1-D piece): the array's values in row-major
    order, about `values` at a time, so one wide record (a CSV line of a million
    columns) is split as well as many narrow ones. Views of a C-contiguous array;
    otherwise whole rows, copied flat."""
    step = values or VALUES
    if array.ndim == 0:
        yield 0, array.reshape(1)
    elif array.flags.c_contiguous:
        flat = array.reshape(-1)
        for start in range(0, flat.size, step):
            yield start, flat[start : start + step]
    else:
        per_row = array.size // len(array) if len(array) else 0
        for s in row_slices(array, step):
            yield s.start * per_row, array[s].reshape(-1)


def stack(parts: list[np.ndarray]) -> np.ndarray:
    """np.concatenate of same-shaped pieces, one bounded copy at a time."""
    if len(parts) == 1:
        return parts[0]
    out = np.empty((sum(len(p) for p in parts),) + parts[0].shape[1:], dtype=parts[0].dtype)
    at = 0
    for part in parts:
        _copy(out[at : at + len(part)], part)
        at += len(part)
    return out


def cast(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """np.ascontiguousarray(array, dtype), converting a bounded piece per call."""
    dtype = np.dtype(dtype)
    if array.dtype == dtype and array.flags.c_contiguous:
        return array
    if array.ndim == 0:
        return np.array(array, dtype=dtype)  # (np.ascontiguousarray would make it 1-D)
    if array.size <= VALUES:
        return np.ascontiguousarray(array, dtype=dtype)
    out = np.empty(array.shape, dtype=dtype)
    _copy(out, array)
    return out


def _copy(out: np.ndarray, array: np.ndarray) -> None:
    """out[...] = array (out C-contiguous, of the same shape), a bounded piece per call."""
    if array.size <= VALUES:
        out[...] = array
        return
    flat = out.reshape(-1)  # a view: out is C-contiguous
    for start, piece in pieces(array):
        flat[start : start + len(piece)] = piece

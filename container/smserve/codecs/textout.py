"""Output arrays as JSON, JSON Lines and CSV text, with orjson, a bounded slice per call:
one array at a time, and several outputs side by side, one record a row.

orjson writes float32 arrays with their shortest round-trip float32 digits (0.1, not
0.10000000149011612) and float64 with the shortest float64 digits: the same digits
numpy's `astype(str)` gives, and faster (bench/RESULTS.md); only the notation of some
exponents differs (orjson `1e-8` and `1756885.0` where numpy wrote `1e-08` and
`1.756885e+06`). NaN and ±Infinity are not JSON: orjson writes them as `null`. CSV
writes them `nan`, `inf`, `-inf`.
"""

from __future__ import annotations

import json
import math

import numpy as np
import orjson

from smserve.codecs import slices
from smserve.errors import NotAcceptable

_NUMPY = orjson.OPT_SERIALIZE_NUMPY
# Dtypes orjson writes itself. float16 is left out: orjson widens it and loses the
# shortest float16 digits.
_ORJSON_KINDS = "biu"
_ORJSON_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def dumps(value) -> bytes:
    """orjson, falling back to json for what orjson refuses (a str with a lone surrogate)."""
    try:
        return orjson.dumps(value, option=_NUMPY)
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(_plain(value), separators=(",", ":")).encode()


def _plain(value):
    if isinstance(value, np.ndarray | np.generic):
        value = jsonable(np.asarray(value))
        if isinstance(value, orjson.Fragment):
            return json.loads(value.contents)
        if isinstance(value, np.ndarray):
            return json.loads(orjson.dumps(value, option=_NUMPY))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def fast(array: np.ndarray) -> bool:
    """Whether orjson writes this array's values itself (numbers and bools)."""
    return array.dtype.kind in _ORJSON_KINDS or array.dtype.newbyteorder("=") in _ORJSON_FLOATS


def jsonable(array: np.ndarray):
    """What orjson can write for this array: itself (C-ordered, native byte order), or
    for text and float16, a list (text as str, float16 with its own shortest digits)."""
    if fast(array):
        if array.ndim == 0:  # one number (a predict_fn's `.numpy()[0]`): orjson writes numpy's scalars, not 0-d arrays
            return array[()]
        native = array.dtype.newbyteorder("=")
        if array.dtype != native or not array.flags.c_contiguous:
            array = np.ascontiguousarray(array, dtype=native)
        return array
    if array.dtype.kind == "f":
        text = array.astype(str)
        finite = np.isfinite(array)
        if not finite.all():
            text[~finite] = "null"
        return orjson.Fragment(_nested(text).encode()) if text.ndim else orjson.Fragment(str(text).encode())
    if array.dtype.kind in "OSU":
        return np.vectorize(_text, otypes=[object])(array).tolist() if array.size else array.tolist()
    return array.tolist()


def _nested(tokens: np.ndarray) -> str:
    if tokens.ndim == 1:
        return "[" + ",".join(tokens.tolist()) + "]"
    return "[" + ",".join(_nested(t) for t in tokens) + "]"


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def array_json(array: np.ndarray, values: int | None = None) -> bytes:
    """One array as a nested JSON list, a bounded slice of rows per orjson call."""
    return b"".join(array_json_parts(array, values))


def array_json_parts(array: np.ndarray, values: int | None = None) -> list:
    """array_json's text as pieces to join once with whatever surrounds it: each
    whole-body copy of a big answer holds the GIL."""
    limit = values or slices.VALUES
    if array.ndim == 0 or array.size <= limit or not fast(array):
        return [dumps(jsonable(array))]
    out: list = [b"["]
    if array.size // len(array) > limit:
        for row in array:
            out.extend(array_json_parts(row, values))
            out.append(b",")
    else:
        for s in slices.row_slices(array, limit):
            out.append(memoryview(dumps(jsonable(array[s])))[1:-1])
            out.append(b",")
    out[-1] = b"]"
    return out


def json_lines(array: np.ndarray, values: int | None = None) -> bytes:
    """One JSON line per record (row of dimension 0), each ending in a newline."""
    limit = values or slices.VALUES
    out = []
    for s in slices.row_slices(array, limit):
        rows = array[s]
        if fast(rows) and rows.ndim <= 2 and rows.size:
            text = dumps(jsonable(rows))[1:-1]
            # Numbers hold no ',' or '[': a row boundary is the only "],[" (2-D) or ","
            # (1-D) at this level.
            out.append(text.replace(b"],[", b"]\n[") if rows.ndim == 2 else text.replace(b",", b"\n"))
        else:
            out.append(b"\n".join(array_json(np.asarray(row), values) for row in rows))
    return b"".join(part + b"\n" for part in out)


def csv_rows(array: np.ndarray, values: int | None = None) -> list[bytes]:
    """A 2-D numeric array -> one CSV line (without its newline) per row; non-finite
    values written nan, inf, -inf."""
    limit = values or slices.VALUES
    lines: list[bytes] = []
    for s in slices.row_slices(array, limit):
        rows = jsonable(array[s])
        if rows.shape[1] == 0:
            lines.extend([b""] * len(rows))
            continue
        slice_lines = dumps(rows)[2:-2].split(b"],[")
        if rows.dtype.kind == "f":
            bad = ~np.isfinite(rows)
            for r in np.flatnonzero(bad.any(axis=1)).tolist():
                cells = slice_lines[r].split(b",")
                for c in np.flatnonzero(bad[r]).tolist():
                    v = rows[r, c]
                    cells[c] = b"nan" if v != v else (b"inf" if v > 0 else b"-inf")
                slice_lines[r] = b",".join(cells)
        lines.extend(slice_lines)
    return lines


# ---------------------------------------------------------------- several outputs, one record a row


def outputs_json_parts(outputs: dict[str, np.ndarray]) -> list:
    """Pieces of the answer's JSON, for one join (each whole-body copy holds the GIL)."""
    if _same_rows(outputs):
        records = json_records(outputs)
        return [b"[", b",".join(records), b"]"] if records else [b"[]"]
    out: list = [b"{"]
    for name, a in outputs.items():
        out += [dumps(name), b":", *array_json_parts(a), b","]
    out[-1] = b"}"
    return out


def json_records(outputs: dict[str, np.ndarray]) -> list[bytes]:
    """One JSON object per record: each output's values for that record."""
    if not _same_rows(outputs):
        raise NotAcceptable("the model's outputs do not share a batch dimension; ask for application/json")
    names = list(outputs)
    arrays = list(outputs.values())
    lines = []
    for s in slices.row_slices(max(arrays, key=np.size)):
        columns = [_per_record(a[s]) for a in arrays]
        lines.extend(dumps(dict(zip(names, values))) for values in zip(*columns))
    return lines


def _per_record(rows: np.ndarray):
    """What orjson writes for each record of these rows, iterable by record."""
    value = jsonable(rows)
    if isinstance(value, orjson.Fragment):  # float16 and other widths: one fragment a record
        return [jsonable(row) for row in rows]
    return value


def _same_rows(outputs: dict[str, np.ndarray]) -> bool:
    rows = {a.shape[0] if a.ndim else None for a in outputs.values()}
    return len(rows) == 1 and None not in rows


def outputs_csv(outputs: dict[str, np.ndarray]) -> bytes:
    """One line per record: each output's values for that record, side by side."""
    if not _same_rows(outputs):
        raise NotAcceptable("the model's outputs do not share a batch dimension; ask for application/json")
    flat = [a.reshape(a.shape[0], math.prod(a.shape[1:])) for a in outputs.values()]  # (-1 fails when empty)
    columns = [csv_rows(f) if fast(f) and f.dtype.kind != "b" else _csv_text_rows(f) for f in flat]
    rows = columns[0] if len(columns) == 1 else [b",".join(cells) for cells in zip(*columns)]
    return b"".join(row + b"\n" for row in rows)


def _csv_text_rows(flat: np.ndarray) -> list[bytes]:
    """Text, bool and float16 outputs (and labels): a Python value per cell, in
    Python's spelling; one CSV line (without its newline) per row."""
    rows: list[bytes] = []
    for s in slices.row_slices(flat):
        rows.extend(",".join(_csv_cell(v) for v in row).encode() for row in _tolist(flat[s]))
    return rows


def _tolist(array: np.ndarray):
    if array.dtype == object or array.dtype.kind in "SU":
        return np.vectorize(_text, otypes=[object])(array).tolist() if array.size else array.tolist()
    if array.dtype.kind == "f":
        return [[_Float(v) for v in row] for row in array.tolist()] if array.dtype.itemsize < 4 else array.tolist()
    return array.tolist()


class _Float(float):
    """A float16 written with its own shortest digits."""

    def __repr__(self) -> str:
        return str(np.float16(self))


def _csv_cell(value) -> str:
    if isinstance(value, str):
        return '"' + value.replace('"', '""') + '"' if any(c in value for c in ',"\n') else value
    if isinstance(value, list):
        return _csv_cell(dumps(value).decode())
    return repr(value) if isinstance(value, float) else str(value)

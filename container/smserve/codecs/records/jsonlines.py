"""JSON Lines request bodies: one JSON record a line, a slice of lines per parse.

One rule for errors, whatever the slicing: the error of the first bad line, a line
being bad when it is blank, not JSON, not numbers, a ragged record, or a record whose
shape differs from line 1's.

A line longer than a slice is read as a sliced JSON document is when it holds numbers
and lists only; any other (objects, strings, a malformed one) is parsed in one call,
which the payload limit bounds.
"""

from __future__ import annotations

import numpy as np
import orjson

from smserve.codecs import slices
from smserve.codecs.limits import MAX_DIMS
from smserve.codecs.records.jsondoc import (
    NOT_NUMERIC_JSON,
    RECORD_KEYS,
    check_numbers,
    float64_records,
    numeric_list,
    numeric_records,
    parse,
    too_deep,
)
from smserve.codecs.records.text import BLANK_BYTES, lines
from smserve.errors import BadRequest


def jsonlines(body: bytes, size: int | None = None, input_name: str | None = None) -> np.ndarray:
    """One JSON record a line -> a float64 array, one record per line. A line may be
    the record itself, or an object holding it under the model's input name
    (`input_name`) or one of RECORD_KEYS."""
    parts: list[np.ndarray] = []
    shape = None  # line 1's record shape
    size = size or slices.TEXT_BYTES
    for piece, first in lines(body, size):
        if len(piece) > size:  # one line, longer than a slice
            array = _long_numeric_line(piece, size)
            if array is not None and shape is not None and array.shape[1:] != shape:
                raise BadRequest(f"JSON Lines line {first}: record shape differs from line 1's")
        else:
            array = _numeric_lines(piece)
        if array is None or (shape is not None and array.shape[1:] != shape):
            array = _parsed_lines(piece, first, shape, input_name)
        if shape is None:
            shape = array.shape[1:]
        parts.append(array)
    return slices.stack(parts)


def _numeric_lines(piece: bytes) -> np.ndarray | None:
    """A slice of lines of numbers and lists in one parse (numeric_list); None when it holds
    anything else (objects, strings, null, true/false, a blank line) or does not parse.
    A blank line needs no search of its own (a regex over the slice cost more than the
    parse): it leaves an empty element between two commas, which is not JSON."""
    if any(piece.find(byte) >= 0 for byte in NOT_NUMERIC_JSON):
        return None
    array = numeric_list(b"[" + piece.replace(b"\n", b",") + b"]")
    if array is None or len(array) != piece.count(b"\n") + 1:
        # (a line holding two values, "[1],[2]", makes a row too many: the
        # line-by-line parse says so)
        return None
    return array


def _long_numeric_line(line: bytes, size: int) -> np.ndarray | None:
    """A line longer than a slice that is one list of numbers and lists (bare, or the one
    member of an object under one of RECORD_KEYS), read a slice at a time as a sliced
    JSON document is (numeric_records), as a batch of one record; None for any other
    line, which is parsed in one call (the limit in this module's header)."""
    found = numeric_records(line, size)
    return None if found is None else found[1][np.newaxis]


def _parsed_lines(piece: bytes, first: int, shape: tuple | None, input_name: str | None = None) -> np.ndarray:
    """The slice's records, a line at a time; raises the error of its first bad line."""
    keys = RECORD_KEYS if input_name is None or input_name in RECORD_KEYS else (input_name, *RECORD_KEYS)
    records = []
    for number, line in enumerate(piece.split(b"\n"), start=first):
        where = f"JSON Lines line {number}"
        try:
            record = _parse_line(line, number)
            if isinstance(record, dict):
                key = next((k for k in keys if k in record), None)
                if key is None:
                    raise BadRequest(
                        f"{where}: an object record must hold the record (an array or a number) under "
                        + ", ".join(f"'{k}'" for k in keys[:-1]) + f" or '{keys[-1]}'"
                    )
                record = record[key]
            check_numbers(record, where)
        except BadRequest:
            _shape_culprit(records, first, shape)  # an earlier line's shape comes first
            raise
        records.append(record)
    try:
        array = np.array(records, dtype=np.float64)
    except ValueError as e:
        if too_deep(e):
            raise BadRequest(f"JSON Lines lines {first}-{first + len(records) - 1}: a record {_TOO_DEEP}") from None
        array = None
    if array is None or (shape is not None and array.shape[1:] != shape):
        _shape_culprit(records, first, shape)
        raise BadRequest(f"JSON Lines lines {first}-{first + len(records) - 1} are not numeric records")
    return array


def _parse_line(line: bytes, number: int):
    if not line.strip(BLANK_BYTES):
        raise BadRequest(f"line {number} is empty: each line must be one record")
    return parse(line, f"JSON Lines line {number}")


def _shape_culprit(records: list, first: int, shape: tuple | None) -> None:
    """Raise for the first record that is ragged, or of another shape than line 1's
    (`shape`, or the first record's when these are the body's first lines); None if
    none is."""
    for number, record in enumerate(records, start=first):
        where = f"JSON Lines line {number}"
        found = _record_shape(record, where)
        if shape is None:
            if found is None:
                raise BadRequest(f"{where}: the record {_TOO_DEEP}")
            shape = found
        elif found != shape:
            raise BadRequest(f"{where}: record shape differs from line 1's")


_TOO_DEEP = (f"nests deeper than {MAX_DIMS - 1} levels (arrays have at most {MAX_DIMS} dimensions, one of them "
             "the batch)")


def _record_shape(record, where: str, what: str = "the record") -> tuple | None:
    """The shape of one record of numbers, None when it nests deeper than a batch of
    such records can (MAX_DIMS, one of them the batch); raises, naming `where`, when it
    is ragged."""
    try:
        shape = np.shape(np.array(record, dtype=np.float64))
    except ValueError as e:
        if too_deep(e):
            return None
        raise BadRequest(f"{where}: {what} is ragged: its items differ in shape (it must be a number or an "
                         "array whose rows all have one length)") from None
    return shape if len(shape) < MAX_DIMS else None


# JSON Lines for a model of several inputs: a line is one object keyed by the input
# names, the record form simple JSON's instances take ({"age": [..], "income": [..]}),
# or that object under one of RECORD_KEYS ({"inputs": {"age": ..}}); other keys are
# ignored, as in simple JSON. A slice's lines are parsed in one call and each input's
# values converted at once; a slice that fails is walked line by line for its error.


def jsonlines_named(body: bytes, names: tuple[str, ...], size: int | None = None) -> dict[str, np.ndarray]:
    """One named record a line -> each input's float64 array, one row per line."""
    parts: dict[str, list[np.ndarray]] = {name: [] for name in names}
    shapes = None  # line 1's shape of each input
    for piece, first in lines(body, size):
        arrays = _named_piece(piece, names)
        if arrays is None or (shapes is not None and any(arrays[n].shape[1:] != shapes[n] for n in names)):
            arrays = _named_lines(piece, first, names, shapes)
        if shapes is None:
            shapes = {name: array.shape[1:] for name, array in arrays.items()}
        for name in names:
            parts[name].append(arrays[name])
    return {name: slices.stack(parts[name]) for name in names}


def _named_piece(piece: bytes, names: tuple[str, ...]) -> dict[str, np.ndarray] | None:
    """A slice of named records in one parse; None when any line is not one (a blank
    line, a line of two values, a missing input, a value that is not numbers) or
    their values are ragged: the line-by-line walk names it."""
    try:
        values = orjson.loads(b"[" + piece.replace(b"\n", b",") + b"]")
    except orjson.JSONDecodeError:
        return None
    if len(values) != piece.count(b"\n") + 1 or set(map(type, values)) != {dict}:
        return None
    try:
        columns = [[record[name] for record in values] for name in names]
    except KeyError:  # records under a key, or an input missing
        values = [_named_record(record, names) for record in values]
        try:
            columns = [[record[name] for record in values] for name in names]
        except (KeyError, TypeError):
            return None
    arrays = {}
    for name, column in zip(names, columns):
        try:
            if not set(map(type, column)) <= {int, float}:
                for value in column:
                    check_numbers(value, "")
            arrays[name] = float64_records(column)
        except (BadRequest, ValueError, TypeError, OverflowError):
            return None
    return arrays


def _named_record(record, names: tuple[str, ...]):
    """The named record a line holds: itself, or the one object it holds under one of
    RECORD_KEYS (that is not an input's name)."""
    if type(record) is dict and len(record) == 1:
        ((key, inner),) = record.items()
        if key in RECORD_KEYS and key not in names and type(inner) is dict:
            return inner
    return record


def _named_lines(piece: bytes, first: int, names: tuple[str, ...], shapes: dict | None) -> dict[str, np.ndarray]:
    """The slice's named records, a line at a time; raises the error of its first bad line."""
    shapes = dict(shapes or {})
    rows: dict[str, list] = {name: [] for name in names}
    for number, line in enumerate(piece.split(b"\n"), start=first):
        where = f"JSON Lines line {number}"
        record = _named_record(_parse_line(line, number), names)
        if type(record) is not dict:
            example = "{" + ", ".join(f'"{name}": ...' for name in names) + "}"
            raise BadRequest(f"{where}: this model has several inputs ({', '.join(names)}): a record is one object "
                             f"holding each of them by name, {example}")
        for name in names:
            if name not in record:
                raise BadRequest(f"{where}: missing input '{name}'")
            check_numbers(record[name], f"{where}, input '{name}'")
            shape = _record_shape(record[name], f"{where}, input '{name}'", "the value")
            if shape is None:
                raise BadRequest(f"{where}, input '{name}': the value {_TOO_DEEP}")
            if shapes.setdefault(name, shape) != shape:
                raise BadRequest(f"{where}, input '{name}': shape {list(shape)} differs from line 1's "
                                 f"{list(shapes[name])}")
            rows[name].append(record[name])
    return {name: np.array(rows[name], dtype=np.float64) for name in names}

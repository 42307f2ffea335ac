"""Numeric records from CSV, JSON Lines and JSON request text, parsed in bounded slices.

Each parse works on about `slices.TEXT_BYTES` of text per C call (split at newlines, or
at record boundaries of a JSON list; CSV `slices.CSV_TEXT_BYTES`, and a CSV line longer
than that is cut at commas) so the event loop's thread gets the GIL between slices; the
result is the same array, and the same error, as one parse of the whole body. Text
carries finite numbers only (see simple.py's header for the rules).

A JSON Lines line longer than a slice is read as a sliced JSON document is when it holds
numbers and lists only; any other (objects, strings, a malformed one) is parsed in one
call, which the payload limit bounds.
"""

from __future__ import annotations

import codecs
import io
import math
import re
import struct
from collections.abc import Iterator

import numpy as np
import orjson
import simdjson
from gevent import monkey

from smserve.codecs import slices
from smserve.errors import BadRequest

RECORD_KEYS = ("instances", "inputs", "features", "data")
MAX_JSON_DEPTH = 100
# Bodies smaller than this are parsed in one call: slicing doubles the cost of a
# realistic batch (256 x 64 floats, 320 KB: 3.4 ms whole, 6.5 ms sliced), and one call
# on 1 MB holds the GIL for about 10 ms, well within /ping's budget.
SLICED_JSON_MIN_BYTES = 1024 * 1024

_WHITESPACE = b" \t\r\n\f\v"
# What a blank line holds.
_BLANK = " \t\r\f\v"
_BLANK_BYTES = _BLANK.encode()
# The plain spelling of a number, which np.loadtxt and float() read alike; any other
# cell (other whitespace, nan, inf, junk) is judged by np.loadtxt itself.
_FINITE = re.compile(r"[ \t]*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[ \t]*")
_NON_FINITE = re.compile(r"\s*[+-]?(?:nan|inf|infinity)\s*", re.IGNORECASE)
# Bytes of a JSON text that holds only numbers, commas, brackets and whitespace.
_NUMERIC_JSON_BYTES = b"0123456789+-.eE,[]" + _WHITESPACE
# Bytes only a string ("), an object ({) or null, true or false (n, t, f) holds: a JSON
# text orjson has parsed without any of them holds only lists and numbers.
_NOT_NUMERIC_JSON = (b'"', b"{", b"n", b"t", b"f")
# simdjson's parser keeps its buffers for the next text (a copy of the text, the tape,
# the structural indexes: for a 1 MB text 15 MB allocated, 4.5 MB of it touched), so
# each thread reuses one parser for texts up to this size. A new parser for every body
# allocated and freed them each time, and where the allocator handed the memory back
# to the kernel (a lone process parsing 338 KB bodies: 300 page faults a parse), that
# doubled the parse. Only a body under SLICED_JSON_MIN_BYTES is parsed whole, a bigger
# one slice by slice; a text past this size gets a parser that goes with it.
_PARSER_REUSE_MAX_BYTES = SLICED_JSON_MIN_BYTES
# Local to the OS thread, not to the greenlet: a worker patched by gevent makes
# threading.local greenlet-local, which would keep a parser (and its buffers) for every
# connection's greenlet. The loop's greenlets share one; none yields inside a parse.
_parsers = monkey.get_original("_thread", "_local")()

_RECORDS_START = re.compile(rb'\s*(?:\{\s*"(' + b"|".join(k.encode() for k in RECORD_KEYS) + rb')"\s*:\s*)?\[')


# ---------------------------------------------------------------- lines


def lines(body: bytes, size: int | None = None) -> Iterator[tuple[bytes, int]]:
    """(slice, number of its first line): whole lines, at most `size` bytes together or
    one longer line alone, with the newline between slices dropped and trailing blank
    lines ignored."""
    for start, stop, number in _spans(body, size or slices.TEXT_BYTES):
        yield body[start:stop], number


def _spans(body: bytes, size: int) -> Iterator[tuple[int, int, int]]:
    """lines() as (start, stop, number of its first line) in `body`: a slice longer than
    `size` is one line, and the caller can read it a bounded piece at a time."""
    end = len(body)
    while end:  # trailing whitespace, a bounded piece at a time
        chunk = body[max(0, end - 4096) : end]
        kept = len(chunk.rstrip(_WHITESPACE))
        end -= len(chunk) - kept
        if kept:
            break
    if not end:
        raise BadRequest("request body holds no records")
    pos, number = 0, 1
    while pos < end:
        stop = end if end - pos <= size else body.rfind(b"\n", pos, pos + size + 1)
        if stop < 0:  # the line at pos is longer than a slice: it goes alone
            stop = body.find(b"\n", pos + size, end)
            stop = end if stop < 0 else stop
            lines_in = 1
        else:
            lines_in = body.count(b"\n", pos, stop) + 1
        yield pos, stop, number
        number += lines_in
        pos = stop + 1


# ---------------------------------------------------------------- CSV
#
# One rule for errors, whatever the slicing: a body's error is that of its first bad
# line, and a line's is the first of: not UTF-8, blank, wrong column count (more than
# the model's input takes, for line 1), then its first bad cell. A slice numpy reads
# cleanly holds no bad line; a slice it refuses is walked line by line, and every line
# is judged alone by the same test, so a sliced parse names the very line (and words)
# one parse of the whole body names.
#
# A line longer than a slice (a million columns on one line) is read alone, cut at
# commas into pieces of about a slice each: numpy reads a line's cells the same
# together or apart. Before any cell it is checked whole, a bounded window at a time,
# for what comes first in the rule (UTF-8, blank, its column count), and a line 1
# wider than the model's input is refused there, before a cell is converted.

# No number is written this long; a cell past it is refused without being read (numpy
# would convert it in one call, holding the GIL ~20 ms a MB).
MAX_CELL_BYTES = slices.CSV_TEXT_BYTES


def csv(body: bytes, size: int | None = None, max_columns: int | None = None, input_name: str = "input") -> np.ndarray:
    """CSV rows -> a 2-D float64 array, numpy's C reader one slice at a time.

    max_columns: the most values a record of the model's input holds, when its
    metadata says: a wider line 1 is refused before its cells are read."""
    size = min(size or slices.CSV_TEXT_BYTES, MAX_CELL_BYTES)  # every line that may hold a too-long cell is long
    parts: list[np.ndarray] = []
    columns = None
    for start, stop, first in _spans(body, size):
        if stop - start > size:  # one line, longer than a slice
            count = _csv_long_line_columns(body, start, stop, first)
            if columns is None:
                columns = count
                _check_width(first, columns, max_columns, input_name)
            elif count != columns:
                raise _column_count_error(first, count, columns)
            parts.append(_csv_long_line(body, start, stop, first, columns, size))
            continue
        piece = body[start:stop]
        if columns is None:
            line = piece.split(b"\n", 1)[0]
            columns = line.count(b",") + 1
            if max_columns is not None and columns > max_columns:
                _csv_line_text(line, first)  # not UTF-8, or blank, comes first
                _check_width(first, columns, max_columns, input_name)
        values = _csv_piece(piece, columns)
        if values is None:
            _csv_culprit(piece, first, columns)
        parts.append(values)
    return slices.stack(parts)


def _check_width(number: int, columns: int, max_columns: int | None, input_name: str) -> None:
    if max_columns is not None and columns > max_columns:
        raise BadRequest(f"CSV line {number} has {columns} columns; input '{input_name}' takes at most {max_columns}")


def _column_count_error(number: int, count: int, columns: int) -> BadRequest:
    return BadRequest(
        f"CSV line {number} has {count} columns, line 1 has {columns}: every record needs the same number of columns"
    )


def _csv_piece(piece: bytes, columns: int) -> np.ndarray | None:
    """The slice's rows, or None when any of its lines is bad. A blank line needs no
    search of its own (a regex over every slice was a quarter of the decode): np.loadtxt
    skips it or refuses it, and either way the row count below or the parse fails."""
    if piece.count(b"\r") != piece.count(b"\r\n") + piece.endswith(b"\r"):
        return None  # a lone CR: np.loadtxt would take it as a line end
    values = _loadtxt(piece)
    if values is None or values.shape != (piece.count(b"\n") + 1, columns) or not np.isfinite(values).all():
        return None
    return values


def _loadtxt(text: bytes) -> np.ndarray | None:
    """np.loadtxt's float64 rows of `text`; None where it refuses it, or finds no row."""
    if not text.strip(b"\r\n"):
        return None  # (numpy warns of an empty input, then gives no row)
    try:
        return np.loadtxt(io.StringIO(text.decode("utf-8")), delimiter=",", dtype=np.float64, ndmin=2,
                          comments=None, quotechar=None)
    except (UnicodeDecodeError, ValueError):
        return None


def _csv_culprit(piece: bytes, first: int, columns: int):
    """Raise the error of the slice's first bad line."""
    for number, raw in enumerate(piece.split(b"\n"), start=first):
        cells = _csv_line_text(raw, number).split(",")
        if len(cells) != columns:
            raise _column_count_error(number, len(cells), columns)
        _csv_cell_culprit(cells, number, 1)
    raise BadRequest("CSV body does not parse as numbers")  # not reached: some line above is bad


def _csv_line_text(raw: bytes, number: int) -> str:
    """A line's text without its CR; raises when it is not UTF-8 or is blank."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"body is not UTF-8 text (line {number})") from None
    if line.endswith("\r"):
        line = line[:-1]
    if not line.strip(_BLANK):
        raise BadRequest(f"line {number} is empty: each line must be one record")
    return line


def _csv_cell_culprit(cells: list[str], number: int, column: int) -> None:
    """Raise for the first bad one of these cells of line `number`, the first of them
    in column `column`; None when all are numbers."""
    for column, cell in enumerate(cells, start=column):
        problem = _cell_problem(cell)
        if problem:
            raise BadRequest(f"CSV line {number}, column {column}: {cell.strip()[:40]!r} {problem}")


def _csv_long_line_columns(body: bytes, start: int, stop: int, number: int) -> int:
    """The column count of the line body[start:stop], once it is known to be UTF-8 and
    not blank (which come first), a bounded window at a time."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    blank, commas = True, 0
    for at in range(start, stop, slices.SCAN_BYTES):
        window = body[at : min(at + slices.SCAN_BYTES, stop)]
        try:
            decoder.decode(window, final=at + slices.SCAN_BYTES >= stop)
        except UnicodeDecodeError:
            raise BadRequest(f"body is not UTF-8 text (line {number})") from None
        blank = blank and not window.strip(_BLANK_BYTES)
        commas += window.count(b",")
    if blank:
        raise BadRequest(f"line {number} is empty: each line must be one record")
    return commas + 1


def _csv_long_line(body: bytes, start: int, stop: int, number: int, columns: int, size: int) -> np.ndarray:
    """The line body[start:stop] (UTF-8, not blank, `columns` cells) as a (1, columns)
    row: its cells cut at commas into runs of about `size` bytes, each read alone."""
    if body[stop - 1 : stop] == b"\r":
        stop -= 1  # the line's own CR; any other is a lone one, which no cell may hold
    out = np.empty((1, columns), dtype=np.float64)
    at, column = start, 1  # where the run of cells starts, and its first cell's column
    while True:
        if stop - at <= size:
            cut = stop
        else:
            cut = body.rfind(b",", at, at + size + 1)
            if cut < 0:  # the cell at `at` is longer than a slice
                cut = body.find(b",", at + size, min(stop, at + MAX_CELL_BYTES + 1))
                if cut < 0 and stop - at > MAX_CELL_BYTES:
                    cut = body.find(b",", at, stop)
                    cut = stop if cut < 0 else cut
                    out[0, column - 1] = _padded_cell(body, at, cut, number, column)
                    column += 1
                    if cut >= stop:
                        return out
                    at = cut + 1
                    continue
                cut = stop if cut < 0 else cut
        run = body[at:cut]
        values = _csv_cells(run)
        if values is None:
            _csv_cell_culprit(run.decode("utf-8").split(","), number, column)
            raise BadRequest("CSV body does not parse as numbers")  # not reached: a cell above is bad
        out[0, column - 1 : column - 1 + len(values)] = values
        column += len(values)
        if cut >= stop:
            return out
        at = cut + 1


def _padded_cell(body: bytes, start: int, stop: int, number: int, column: int) -> float:
    """A cell over MAX_CELL_BYTES, body[start:stop]. No number needs that many bytes,
    but padding can make one that long, as a client filling a body to an exact size
    does: spaces around it, zeros before its digits, zeros after a fraction's last
    digit. Those are taken off (a bounded window a step), and what is left must be a
    number of at most MAX_CELL_BYTES; anything else is refused without being read."""
    start = _skip(body, start, stop, b" \t")
    stop = _skip_back(body, start, stop, b" \t")
    sign = body[start : start + 1] if body[start : start + 1] in (b"+", b"-") else b""
    digits = start + len(sign)
    start = _skip(body, digits, stop, b"0")
    # One zero is kept where any were taken: "000e5" reads "0e5", "000 5" reads "0 5"
    # (refused, as numpy refuses it), and a cell of spaces alone stays blank (refused).
    zero = b"0" if start > digits else b""
    if (stop - start > MAX_CELL_BYTES and body.find(b".", start, stop) >= 0
            and body.find(b"e", start, stop) < 0 and body.find(b"E", start, stop) < 0):
        stop = max(_skip_back(body, start, stop, b"0"), start + 1)  # keep the point's neighbour
    if stop - start > MAX_CELL_BYTES:
        raise BadRequest(f"CSV line {number}, column {column}: a cell over {MAX_CELL_BYTES} bytes long "
                         "is not a number")
    cell = sign + zero + body[start:stop]
    values = _csv_cells(cell) if cell.strip(b"+-") else None
    if values is None and not cell.strip():
        raise BadRequest(f"CSV line {number}, column {column}: '' is not a number")
    if values is None:
        _csv_cell_culprit([cell.decode("utf-8")], number, column)
        raise BadRequest(f"CSV line {number}, column {column}: not a number")  # not reached
    return float(values[0])


def _skip(body: bytes, at: int, stop: int, chars: bytes) -> int:
    """The first position in body[at:stop] whose byte is not one of chars."""
    other = re.compile(b"[^" + re.escape(chars) + b"]")
    while at < stop:
        step = min(stop, at + slices.SCAN_BYTES)
        found = other.search(body, at, step)
        if found:
            return found.start()
        at = step
    return stop


def _skip_back(body: bytes, start: int, stop: int, chars: bytes) -> int:
    """The end of body[start:stop] without its trailing run of chars."""
    while stop > start:
        step = max(start, stop - slices.SCAN_BYTES)
        kept = len(body[step:stop].rstrip(chars))
        if kept:
            return step + kept
        stop = step
    return start


def _csv_cells(run: bytes) -> np.ndarray | None:
    """A run of one line's cells as a 1-D array; None when any of them is bad."""
    if b"\r" in run:
        return None  # a lone CR (the line's own was taken off)
    values = _loadtxt(run)
    if values is None or values.shape != (1, run.count(b",") + 1) or not np.isfinite(values).all():
        return None
    return values[0]


def _cell_problem(cell: str) -> str | None:
    """What is wrong with one cell, as np.loadtxt judges it; None if it is a finite number."""
    if _FINITE.fullmatch(cell):
        value = float(cell)
    elif "\r" in cell or "\n" in cell:
        return "is not a number"  # (numpy would read it as two lines)
    else:  # another spelling numpy may take (other whitespace, nan, inf): ask numpy
        try:
            value = float(np.loadtxt(io.StringIO(cell + ",0"), delimiter=",", dtype=np.float64, ndmin=2,
                                     comments=None, quotechar=None)[0, 0])
        except ValueError:
            return "is not a number"
    if math.isfinite(value):
        return None
    if _NON_FINITE.fullmatch(cell):
        return "is not a finite number (text carries finite numbers only; send NaN/inf in .npy or binary)"
    return "is out of range for a 64-bit float"


# ---------------------------------------------------------------- JSON Lines
#
# The same rule: the error of the first bad line, a line being bad when it is blank,
# not JSON, not numbers, a ragged record, or a record whose shape differs from line 1's.


def jsonlines(body: bytes, size: int | None = None) -> np.ndarray:
    """One JSON record a line -> a float64 array, one record per line."""
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
            array = _parsed_lines(piece, first, shape)
        if shape is None:
            shape = array.shape[1:]
        parts.append(array)
    return slices.stack(parts)


def _numeric_lines(piece: bytes) -> np.ndarray | None:
    """A slice of lines of numbers and lists in one parse (_numeric_list); None when it holds
    anything else (objects, strings, null, true/false, a blank line) or does not parse.
    A blank line needs no search of its own (a regex over the slice cost more than the
    parse): it leaves an empty element between two commas, which is not JSON."""
    if any(piece.find(byte) >= 0 for byte in _NOT_NUMERIC_JSON):
        return None
    array = _numeric_list(b"[" + piece.replace(b"\n", b",") + b"]")
    if array is None or len(array) != piece.count(b"\n") + 1:
        # (a line holding two values, "[1],[2]", makes a row too many: the
        # line-by-line parse says so)
        return None
    return array


def _long_numeric_line(line: bytes, size: int) -> np.ndarray | None:
    """A line longer than a slice that is one list of numbers and lists (bare, or the one
    member of an object under one of RECORD_KEYS), read a slice at a time as a sliced
    JSON document is (_numeric_records), as a batch of one record; None for any other
    line, which is parsed in one call (the limit in this module's header)."""
    found = _numeric_records(line, size)
    return None if found is None else found[1][np.newaxis]


def _parsed_lines(piece: bytes, first: int, shape: tuple | None) -> np.ndarray:
    """The slice's records, a line at a time; raises the error of its first bad line."""
    records = []
    for number, line in enumerate(piece.split(b"\n"), start=first):
        where = f"JSON Lines line {number}"
        try:
            record = _parse_line(line, number)
            if isinstance(record, dict):
                key = next((k for k in RECORD_KEYS if k in record), None)
                if key is None:
                    raise BadRequest(
                        f"{where}: an object record must hold the record (an array or a number) under "
                        + ", ".join(f"'{k}'" for k in RECORD_KEYS[:-1]) + f" or '{RECORD_KEYS[-1]}'"
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
    if not line.strip(_BLANK_BYTES):
        raise BadRequest(f"line {number} is empty: each line must be one record")
    return parse(line, f"JSON Lines line {number}")


# numpy's limit on an array's dimensions (NPY_MAXDIMS).
MAX_DIMS = 64


def too_deep(error: ValueError) -> bool:
    """Whether np.array refused nested lists for having more than MAX_DIMS levels, which
    is not the raggedness its other ValueErrors mean."""
    return "maximum number of dimension" in str(error)


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
            arrays[name] = _float64(column)
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


# ---------------------------------------------------------------- JSON


def parse(body: bytes, where: str = "request body"):
    """Strict JSON (RFC 8259: no NaN/Infinity, no number beyond float64) -> Python."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        if e.msg.startswith("str is not valid UTF-8"):
            raise BadRequest(f"{where} is not UTF-8 text") from None
        if "depth" in e.msg or "recursion" in e.msg:
            raise BadRequest(f"{where}: JSON nesting is too deep") from None
        hint = " (JSON numbers must fit a 64-bit float)" if "infinity" in e.msg else ""
        raise BadRequest(f"{where} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}{hint}") from None


def parse_document(body: bytes, where: str = "request body", size: int | None = None, c_tried: bool = False):
    """Like parse(), but a document that is only a non-empty list of numeric records
    (bare, or the one member of {"instances"|"inputs"|"features"|"data": [...]}) comes
    back with its records as one float64 array: flat records (or a flat list of
    numbers) straight from simdjson's C parser into C doubles (_c_doubles), other
    shapes parsed by orjson and converted at once, without a type check per record
    (the body's bytes show it holds no string, object, null or true/false). A body of
    SLICED_JSON_MIN_BYTES or more is parsed slice by slice.

    c_tried: c_records(body) already gave None, so its C parse is not run again.

    Limit: records holding any string, object, null or true/false (one `"` or letter
    is enough) are parsed in one call, as is a malformed or ragged body (to report its
    exact error); the payload limit bounds that call.
    """
    if len(body) >= SLICED_JSON_MIN_BYTES:
        found = _numeric_records(body, size or slices.TEXT_BYTES)
        if found is not None:
            return _under(*found)
        return parse(body, where)  # (no second whole-body C call: simple.py converts it in slices)
    if not c_tried:
        found = c_records(body)
        if found is not None:
            return found
    start = _records_start(body)
    document = parse(body, where)
    if start is None or any(body.find(byte, start[0]) >= 0 for byte in _NOT_NUMERIC_JSON):
        return document  # strings, objects, null or true/false: judged record by record
    found = _numeric_document(document, start[1])
    return document if found is None else found


def _records_start(body: bytes) -> tuple[int, str | None] | None:
    """Where a body's list of records opens (the offset of its '['), and the key it is
    under (None for a bare list); None when the body starts as no such list does."""
    start = _RECORDS_START.match(body)
    if start is None:
        return None
    return start.end() - 1, (start.group(1).decode() if start.group(1) else None)


def _under(key: str | None, array: np.ndarray):
    """The parsed document the records make: the array, or an object holding it."""
    return array if key is None else {key: array}


def c_records(body: bytes):
    """parse_document's answer for a body under SLICED_JSON_MIN_BYTES that is flat
    numeric records (or one flat list of numbers), bare or under one of RECORD_KEYS,
    taken by simdjson's C reader alone; None for any other body. The reader holds the
    GIL for all of its about 2 ms a MB, on whichever thread runs it."""
    start = _records_start(body)
    if start is None or len(body) >= SLICED_JSON_MIN_BYTES:
        return None
    opening, key = start
    array = _c_doubles(body, opening, key)
    return None if array is None else _under(key, array)


def _c_doubles(text: bytes, opening: int, key: str | None) -> np.ndarray | None:
    """The records of `text`, a JSON document that is a list of records opening at
    `opening` or an object holding only `key` with that list, as a float64 array:
    parsed by simdjson into C doubles with no Python object per number (for 256 x 64
    numbers about twice as fast as orjson.loads and the conversion). None when
    simdjson refuses the text, or the records are not numbers or flat records of one
    length: orjson's path then decides (it also reads integers beyond 64 bits, as
    floats, where simdjson stops), and names any error.

    simdjson is a strict RFC 8259 parser like orjson, and both round every number to
    the nearest double (integers too, ties to even), so an array taken here is the one
    orjson's path makes. as_buffer() refuses anything but numbers and flattens lists
    within lists, which says nothing of shape: every row is checked to be a list of
    the first row's length, and the count of '[' (one a row and the list's own) rules
    out lists within rows."""
    try:
        document = _parser(len(text)).parse(text)
        if key is None:
            values = document
        elif type(document) is simdjson.Object and len(document) == 1:
            values = document[key]  # (a repeated key makes two members)
        else:
            return None
        if type(values) is not simdjson.Array:
            return None
        rows = len(values)
        if not rows:
            return None  # {"inputs": []} is a KServe v2 request
        flat = np.frombuffer(values.as_buffer(of_type="d"), dtype=np.float64)
        brackets = np.count_nonzero(np.frombuffer(text, dtype=np.uint8, offset=opening) == ord("["))
        first = values[0]
        if type(first) is not simdjson.Array:
            return flat if brackets == 1 and flat.size == rows else None
        width = len(first)
        if not width or brackets != rows + 1 or flat.size != rows * width:
            return None
        for row in values:
            if type(row) is not simdjson.Array or len(row) != width:
                return None
        return flat.reshape(rows, width)
    except Exception:  # noqa: BLE001 - simdjson's own refusals: orjson's path judges the text
        return None


def _parser(size: int) -> simdjson.Parser:
    """This OS thread's simdjson parser, for a text of `size` bytes. A parser refuses
    a new text while proxies into its last document live; _c_doubles keeps none past
    its return (as_buffer() copies), and no call yields mid-way to another greenlet."""
    if size > _PARSER_REUSE_MAX_BYTES:
        return simdjson.Parser()
    parser = getattr(_parsers, "parser", None)
    if parser is None:
        parser = _parsers.parser = simdjson.Parser()
    return parser


def _numeric_list(text: bytes) -> np.ndarray | None:
    """A JSON list of numeric records as float64: simdjson's reader for flat records,
    orjson and the conversion for any other shape; None when it is neither."""
    array = _c_doubles(text, 0, None)
    if array is not None:
        return array
    try:
        return _float64(orjson.loads(text))
    except (orjson.JSONDecodeError, ValueError, TypeError, OverflowError):
        return None


def _numeric_document(document, key: str | None):
    """`document` (a list of records, or an object holding them under `key`, whose body
    holds no string, object, null or true/false after the key) with its records as one
    float64 array, or None when they are empty, ragged or too deep for numpy: the
    record-by-record path (simple.py) then judges them, and names the error. An empty
    list is left alone: {"inputs": []} is a KServe v2 request."""
    # With no '"' after the key, the object has no other member (orjson has parsed it).
    values = document if key is None else document[key]
    if type(values) is not list or not values:
        return None
    try:
        array = _float64(values)
    except (ValueError, TypeError, OverflowError):
        return None
    return array if key is None else {key: array}


def _float64(values: list) -> np.ndarray:
    """np.array(values, dtype=np.float64) (ValueError when ragged or not numbers), twice
    as fast for the usual records, flat lists of numbers of one length: struct packs
    each record's numbers into the array as C doubles, with Python's own float() rounding
    of integers, which is numpy's (both round to nearest, ties to even)."""
    if values and type(values[0]) is list and set(map(type, values)) == {list}:
        width = len(values[0])
        if width and set(map(len, values)) == {width}:
            out = np.empty((len(values), width), dtype=np.float64)
            pack = struct.Struct(f"={width}d").pack_into
            step = width * 8
            try:
                for at, record in enumerate(values):
                    pack(out, at * step, *record)
                return out
            except struct.error:
                pass  # a record holds lists: numpy judges the shape
    return np.array(values, dtype=np.float64)


def _numeric_records(body: bytes, size: int):
    start = _records_start(body)
    if start is None or body.find(b'"', start[0]) >= 0:
        return None
    opening, key = start
    bounds = _record_cuts(body, opening, size)
    if bounds is None:
        return None
    cuts, stop = bounds
    rest = body[stop + 1 :].strip(_WHITESPACE)
    if rest != (b"}" if key else b""):
        return None
    parts = []
    for a, b in zip(cuts, cuts[1:]):
        array = _numeric_list(b"[" + body[a + 1 : b] + b"]")
        if array is None:
            return None  # the one-shot parse names the error
        parts.append(array)
        if parts[-1].shape[1:] != parts[0].shape[1:]:
            return None
    return key, slices.stack(parts)


def _record_cuts(body: bytes, opening: int, size: int) -> tuple[list[int], int] | None:
    """Commas between records of the list opening at `opening`, about `size` bytes apart,
    and the position of its closing bracket; None if the list holds a byte no numeric
    record has. A vectorised bracket-depth scan, one bounded chunk at a time."""
    cuts = [opening]
    depth = 0
    pos = opening
    while pos < len(body):
        chunk = body[pos : pos + slices.SCAN_BYTES]
        if chunk.translate(None, _NUMERIC_JSON_BYTES):
            # Letters or quotes: not (only) numbers. After the list's end only the
            # closing brace may follow, which the caller checks.
            bad = len(chunk) - len(chunk.lstrip(_NUMERIC_JSON_BYTES))
        else:
            bad = len(chunk)
        raw = np.frombuffer(chunk, dtype=np.uint8)
        step = (raw == ord("[")).astype(np.int32)
        step -= raw == ord("]")
        levels = np.cumsum(step, dtype=np.int32)
        levels += depth
        closed = np.flatnonzero(levels == 0)
        end = int(closed[0]) if len(closed) else len(chunk)
        if bad < end:
            return None
        if len(levels) and int(levels[: end].max(initial=0)) > MAX_JSON_DEPTH:
            return None
        commas = np.flatnonzero((raw[:end] == ord(",")) & (levels[:end] == 1)) + pos
        i = int(np.searchsorted(commas, cuts[-1] + size))
        while i < len(commas):
            cuts.append(int(commas[i]))
            i = int(np.searchsorted(commas, cuts[-1] + size))
        if len(closed):
            stop = pos + end
            cuts.append(stop)
            return cuts, stop
        depth = int(levels[-1])
        pos += len(chunk)
    return None


# ---------------------------------------------------------------- types


def check_numbers(value, where: str) -> None:
    """Every leaf is a JSON number: null, true/false and "1" are refused, naming where."""
    if type(value) is list:
        if set(map(type, value)) <= {int, float}:
            return  # the common case, a row of numbers: no Python step per value
    elif type(value) in (int, float):
        return
    stack = [(value, [])]
    while stack:
        item, path = stack.pop()
        if type(item) is list:
            if len(path) >= MAX_JSON_DEPTH:
                raise BadRequest(f"{where}: JSON nesting is too deep")
            if set(map(type, item)) <= {int, float}:
                continue
            stack.extend((v, path + [i]) for i, v in reversed(list(enumerate(item))))
        elif type(item) not in (int, float):
            at = f", position {path}" if path else ""
            raise BadRequest(f"{where}{at}: {_describe(item)} is not a number (inputs must be JSON numbers)")


def _describe(value) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, str):
        return "the string " + orjson.dumps(value[:40]).decode()
    return "an object"

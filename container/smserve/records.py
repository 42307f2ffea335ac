"""Numeric records from CSV, JSON Lines and JSON request text, parsed in bounded slices.

Each parse works on about `slices.TEXT_BYTES` of text per C call (split at newlines, or
at record boundaries of a JSON list) so the event loop's thread gets the GIL between
slices; the result is the same array, and the same error, as one parse of the whole
body. Text carries finite numbers only (see simple.py's header for the rules).
"""

from __future__ import annotations

import io
import math
import re
import struct
from collections.abc import Iterator

import numpy as np
import orjson
import simdjson
from gevent import monkey

from . import slices
from .errors import BadRequest

RECORD_KEYS = ("instances", "inputs", "features", "data")
MAX_JSON_DEPTH = 100
# Bodies smaller than this are parsed in one call: slicing doubles the cost of a
# realistic batch (256 x 64 floats, 320 KB: 3.4 ms whole, 6.5 ms sliced), and one call
# on 1 MB holds the GIL for about 10 ms, well within /ping's budget.
SLICED_JSON_MIN_BYTES = 1024 * 1024

_WHITESPACE = b" \t\r\n\f\v"
# What a blank line holds.
_BLANK = " \t\r\f\v"
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
    """(slice, number of its first line): whole lines, about `size` bytes each, with
    the newline between slices dropped and trailing blank lines ignored."""
    end = len(body)
    while end:  # trailing whitespace, a bounded piece at a time
        chunk = body[max(0, end - 4096) : end]
        kept = len(chunk.rstrip(_WHITESPACE))
        end -= len(chunk) - kept
        if kept:
            break
    if not end:
        raise BadRequest("request body holds no records")
    size = size or slices.TEXT_BYTES
    pos, number = 0, 1
    while pos < end:
        cut = body.find(b"\n", pos + size, end) if pos + size < end else -1
        stop = end if cut < 0 else cut
        piece = body[pos:stop]
        yield piece, number
        number += piece.count(b"\n") + 1
        pos = stop + 1


# ---------------------------------------------------------------- CSV
#
# One rule for errors, whatever the slicing: a body's error is that of its first bad
# line, and a line's is the first of: not UTF-8, blank, wrong column count, then its
# first bad cell. A slice numpy reads cleanly holds no bad line; a slice it refuses is
# walked line by line, and every line is judged alone by the same test, so a sliced
# parse names the very line (and words) one parse of the whole body names.


def csv(body: bytes, size: int | None = None) -> np.ndarray:
    """CSV rows -> a 2-D float64 array, numpy's C reader one slice at a time."""
    parts: list[np.ndarray] = []
    columns = None
    for piece, first in lines(body, size or slices.CSV_TEXT_BYTES):
        if columns is None:
            columns = piece.split(b"\n", 1)[0].count(b",") + 1
        values = _csv_piece(piece, columns)
        if values is None:
            _csv_culprit(piece, first, columns)
        parts.append(values)
    return slices.stack(parts)


def _csv_piece(piece: bytes, columns: int) -> np.ndarray | None:
    """The slice's rows, or None when any of its lines is bad. A blank line needs no
    search of its own (a regex over every slice was a quarter of the decode): np.loadtxt
    skips it or refuses it, and either way the row count below or the parse fails."""
    if piece.count(b"\r") != piece.count(b"\r\n") + piece.endswith(b"\r"):
        return None  # a lone CR: np.loadtxt would take it as a line end
    try:
        values = np.loadtxt(io.StringIO(piece.decode("utf-8")), delimiter=",", dtype=np.float64, ndmin=2,
                            comments=None, quotechar=None)
    except (UnicodeDecodeError, ValueError):
        return None
    if values.shape != (piece.count(b"\n") + 1, columns) or not np.isfinite(values).all():
        return None
    return values


def _csv_culprit(piece: bytes, first: int, columns: int):
    """Raise the error of the slice's first bad line."""
    for number, raw in enumerate(piece.split(b"\n"), start=first):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest(f"body is not UTF-8 text (line {number})") from None
        if line.endswith("\r"):
            line = line[:-1]
        if not line.strip(_BLANK):
            raise BadRequest(f"line {number} is empty: each line must be one record")
        cells = line.split(",")
        if len(cells) != columns:
            raise BadRequest(
                f"CSV line {number} has {len(cells)} columns, line 1 has {columns}: "
                "every record needs the same number of columns"
            )
        for column, cell in enumerate(cells, start=1):
            problem = _cell_problem(cell)
            if problem:
                raise BadRequest(f"CSV line {number}, column {column}: {cell.strip()[:40]!r} {problem}")
    raise BadRequest("CSV body does not parse as numbers")  # not reached: some line above is bad


def _cell_problem(cell: str) -> str | None:
    """What is wrong with one cell, as np.loadtxt judges it; None if it is a finite number."""
    if _FINITE.fullmatch(cell):
        value = float(cell)
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
# not JSON, not numbers, or a record whose shape differs from line 1's.


def jsonlines(body: bytes, size: int | None = None) -> np.ndarray:
    """One JSON record a line -> a float64 array, one record per line."""
    parts: list[np.ndarray] = []
    shape = None  # line 1's record shape
    for piece, first in lines(body, size):
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


def _parsed_lines(piece: bytes, first: int, shape: tuple | None) -> np.ndarray:
    """The slice's records, a line at a time; raises the error of its first bad line."""
    records = []
    for number, line in enumerate(piece.split(b"\n"), start=first):
        where = f"JSON Lines line {number}"
        try:
            if not line.strip(_BLANK.encode()):
                raise BadRequest(f"line {number} is empty: each line must be one record")
            record = parse(line, where)
            if isinstance(record, dict):
                key = next((k for k in RECORD_KEYS if k in record), None)
                if key is None:
                    raise BadRequest(
                        f"{where}: an object record must hold its values under "
                        + " or ".join(f"'{k}'" for k in RECORD_KEYS)
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
            raise BadRequest(f"JSON Lines lines {first}-{first + len(records) - 1}: a record nests deeper than "
                             f"{MAX_DIMS - 1} levels (arrays have at most {MAX_DIMS} dimensions, one of them the "
                             "batch)") from None
        array = None
    if array is None or (shape is not None and array.shape[1:] != shape):
        _shape_culprit(records, first, shape)
        raise BadRequest(f"JSON Lines lines {first}-{first + len(records) - 1} are not numeric records")
    return array


# numpy's limit on an array's dimensions (NPY_MAXDIMS).
MAX_DIMS = 64


def too_deep(error: ValueError) -> bool:
    """Whether np.array refused nested lists for having more than MAX_DIMS levels, which
    is not the raggedness its other ValueErrors mean."""
    return "maximum number of dimension" in str(error)


def _shape_culprit(records: list, first: int, shape: tuple | None) -> None:
    """Raise for the first record whose shape differs from line 1's (`shape`, or the
    first record's when these are the body's first lines); None if none does."""
    if not records:
        return
    if shape is None:
        shape = np.shape(records[0]) if _rectangular(records[0]) else None
    for number, record in enumerate(records, start=first):
        if not _rectangular(record) or np.shape(record) != shape:
            raise BadRequest(f"JSON Lines line {number}: record shape differs from line 1's")


def _rectangular(value) -> bool:
    try:
        np.array(value, dtype=np.float64)
        return True
    except ValueError:
        return False


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

"""JSON request documents: strict parsing, and records of numbers read straight into float64.

A document that is only a list of numeric records (bare, or under one of RECORD_KEYS)
skips the per-record type check: flat records go from simdjson's C parser into C
doubles; other shapes through orjson and one conversion. A body of
SLICED_JSON_MIN_BYTES or more is parsed a slice of records at a time, so the event
loop's thread gets the GIL between slices; the result, and any error, is the same as
one parse of the whole body.
"""

from __future__ import annotations

import re
import struct

import numpy as np
import orjson
import simdjson
from gevent import monkey

from smserve.codecs import slices
from smserve.codecs.limits import MAX_JSON_DEPTH
from smserve.codecs.records.text import WHITESPACE
from smserve.errors import BadRequest

# Keys of a JSON object that hold the records, as the SageMaker and TF Serving
# conventions name them.
RECORD_KEYS = ("instances", "inputs", "features", "data")
# Bodies smaller than this are parsed in one call: for a realistic batch slicing costs
# more than it saves, and one call on this much holds the GIL well within /ping's
# budget (bench/RESULTS.md has the figures).
SLICED_JSON_MIN_BYTES = 1024 * 1024

# Bytes of a JSON text that holds only numbers, commas, brackets and whitespace.
_NUMERIC_JSON_BYTES = b"0123456789+-.eE,[]" + WHITESPACE
# Bytes only a string ("), an object ({) or null, true or false (n, t, f) holds: a JSON
# text orjson has parsed without any of them holds only lists and numbers.
NOT_NUMERIC_JSON = (b'"', b"{", b"n", b"t", b"f")
# simdjson's parser keeps its buffers (a copy of the text, the tape, the structural
# indexes: many times the text's size) for the next text, so each thread reuses one:
# allocating them for every body costs page faults every time, wherever the allocator
# hands freed memory back to the kernel (docs/performance.md). Only texts under
# SLICED_JSON_MIN_BYTES are parsed whole; a bigger one gets a parser that goes with it,
# so no thread keeps buffers sized for the largest body it ever saw.
PARSER_REUSE_MAX_BYTES = SLICED_JSON_MIN_BYTES
# Local to the OS thread, not to the greenlet: a worker patched by gevent makes
# threading.local greenlet-local, which would keep a parser (and its buffers) for every
# connection's greenlet. The loop's greenlets share one; none yields inside a parse.
_parsers = monkey.get_original("_thread", "_local")()

_RECORDS_START = re.compile(rb'\s*(?:\{\s*"(' + b"|".join(k.encode() for k in RECORD_KEYS) + rb')"\s*:\s*)?\[')


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
    numbers) straight from simdjson's C parser into C doubles (c_doubles), other
    shapes parsed by orjson and converted at once, without a type check per record
    (the body's bytes show it holds no string, object, null or true/false). A body of
    SLICED_JSON_MIN_BYTES or more is parsed slice by slice.

    c_tried: c_records(body) already gave None, so its C parse is not run again.

    Limit: records holding any string, object, null or true/false (one `"` or letter
    is enough) are parsed in one call, as is a malformed or ragged body (to report its
    exact error); the payload limit bounds that call.
    """
    if len(body) >= SLICED_JSON_MIN_BYTES:
        found = numeric_records(body, size or slices.TEXT_BYTES)
        if found is not None:
            return _records_document(*found)
        return parse(body, where)  # (no second whole-body C call: simple.py converts it in slices)
    if not c_tried:
        found = c_records(body)
        if found is not None:
            return found
    start = _records_start(body)
    document = parse(body, where)
    if start is None or any(body.find(byte, start[0]) >= 0 for byte in NOT_NUMERIC_JSON):
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


def _records_document(key: str | None, array: np.ndarray):
    """The parsed document the records make: the array, or an object holding it."""
    return array if key is None else {key: array}


def c_records(body: bytes):
    """parse_document's answer for a body under SLICED_JSON_MIN_BYTES that is flat
    numeric records (or one flat list of numbers), bare or under one of RECORD_KEYS,
    taken by simdjson's C reader alone; None for any other body. The reader holds the
    GIL for its whole run, on whichever thread runs it, hence the size bound."""
    start = _records_start(body)
    if start is None or len(body) >= SLICED_JSON_MIN_BYTES:
        return None
    opening, key = start
    array = c_doubles(body, opening, key)
    return None if array is None else _records_document(key, array)


def c_doubles(text: bytes, opening: int, key: str | None) -> np.ndarray | None:
    """The records of `text`, a JSON document that is a list of records opening at
    `opening` or an object holding only `key` with that list, as a float64 array:
    parsed by simdjson into C doubles with no Python object per number (faster than
    orjson.loads and the conversion: bench/RESULTS.md). None when
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
        document = thread_parser(len(text)).parse(text)
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


def thread_parser(size: int) -> simdjson.Parser:
    """This OS thread's simdjson parser, for a text of `size` bytes. A parser refuses
    a new text while proxies into its last document live; c_doubles keeps none past
    its return (as_buffer() copies), and no call yields mid-way to another greenlet."""
    if size > PARSER_REUSE_MAX_BYTES:
        return simdjson.Parser()
    parser = getattr(_parsers, "parser", None)
    if parser is None:
        parser = _parsers.parser = simdjson.Parser()
    return parser


def numeric_list(text: bytes) -> np.ndarray | None:
    """A JSON list of numeric records as float64: simdjson's reader for flat records,
    orjson and the conversion for any other shape; None when it is neither."""
    array = c_doubles(text, 0, None)
    if array is not None:
        return array
    try:
        return float64_records(orjson.loads(text))
    except (orjson.JSONDecodeError, ValueError, TypeError, OverflowError):
        return None


def _numeric_document(document, key: str | None):
    """`document` (a list of records, or an object holding them under `key`, whose body
    holds no string, object, null or true/false after the key) with its records as one
    float64 array, or None when they are empty, ragged or too deep for numpy: the
    record-by-record path (protocols/simple.py, fitting them to the model's inputs) then
    judges them, and names the error. An empty list is left alone: {"inputs": []} is a
    KServe v2 request."""
    # With no '"' after the key, the object has no other member (orjson has parsed it).
    values = document if key is None else document[key]
    if type(values) is not list or not values:
        return None
    try:
        array = float64_records(values)
    except (ValueError, TypeError, OverflowError):
        return None
    return array if key is None else {key: array}


def float64_records(values: list) -> np.ndarray:
    """np.array(values, dtype=np.float64) (ValueError when ragged or not numbers), faster
    for the usual records, flat lists of numbers of one length: struct packs
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


def numeric_records(body: bytes, size: int):
    start = _records_start(body)
    if start is None or body.find(b'"', start[0]) >= 0:
        return None
    opening, key = start
    bounds = _record_cuts(body, opening, size)
    if bounds is None:
        return None
    cuts, stop = bounds
    rest = body[stop + 1 :].strip(WHITESPACE)
    if rest != (b"}" if key else b""):
        return None
    parts = []
    for a, b in zip(cuts, cuts[1:]):
        array = numeric_list(b"[" + body[a + 1 : b] + b"]")
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


def too_deep(error: ValueError) -> bool:
    """Whether np.array refused nested lists for having more than MAX_DIMS levels, which
    is not the raggedness its other ValueErrors mean."""
    return "maximum number of dimension" in str(error)


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

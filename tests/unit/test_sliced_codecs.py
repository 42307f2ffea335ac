"""Codecs that work a bounded slice at a time give what one whole call gives.

Slices are made tiny here (a few bytes or values) so every boundary case is crossed:
the arrays, bytes and error messages must equal those of the one-shot path.
"""

from __future__ import annotations

import math

import orjson
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from smserve.codecs import records, slices, textout
from smserve.errors import BadRequest

WHOLE = 1 << 40  # a slice size no test body reaches: one call

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
tables = hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=6), elements=finite)
records_nd = hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4), elements=finite)
sizes = st.integers(min_value=1, max_value=64)


def outcome(fn, *args):
    try:
        return "ok", fn(*args)
    except BadRequest as e:
        return "error", e.message


def same(a, b):
    assert a[0] == b[0], (a, b)
    if a[0] == "ok":
        assert a[1].shape == b[1].shape and a[1].dtype == b[1].dtype
        np.testing.assert_array_equal(a[1], b[1])
    else:
        assert a[1] == b[1]


def csv_text(table: np.ndarray, crlf: bool) -> bytes:
    end = "\r\n" if crlf else "\n"
    return "".join(",".join(repr(float(v)) for v in row) + end for row in table).encode()


CSV_SPOILS = [b"", b"  ", b"1", b"x,1", b"nan", b"1e999", b"1_0", b"inf", b"\xa01", b"1\r", b"1\r2", b"\xff", b"1,,2"]


@settings(max_examples=300, deadline=None)
@given(tables, sizes, st.booleans(), st.data())
def test_csv_sliced_equals_whole(table, size, crlf, data):
    body = csv_text(table, crlf)
    # Spoil up to two lines (a bad cell, a blank line, a short row, nan, a stray CR, bad
    # UTF-8, or a valid "1"): the first bad line's error wins, however the body is sliced.
    spoils = data.draw(st.integers(0, 2))
    if spoils:
        lines = body.split(b"\n")
        for _ in range(spoils):
            at = data.draw(st.integers(0, len(lines) - 2))
            lines[at] = data.draw(st.sampled_from(CSV_SPOILS)) + (
                b"," * (table.shape[1] - 1) if data.draw(st.booleans()) else b"")
        body = b"\n".join(lines)
    same(outcome(records.csv, body, size), outcome(records.csv, body, WHOLE))
    if not spoils:
        whole = outcome(records.csv, body, WHOLE)
        assert whole[0] == "ok", whole
        np.testing.assert_array_equal(whole[1], table)


@settings(max_examples=300, deadline=None)
@given(st.lists(records_nd, min_size=1, max_size=6), sizes, st.data())
def test_jsonlines_sliced_equals_whole(arrays, size, data):
    lines = [orjson.dumps(a.tolist()) for a in arrays]
    # Records of other shapes, and up to two spoiled lines: the first bad line's error
    # wins, however the body is sliced.
    for _ in range(data.draw(st.integers(0, 2))):
        at = data.draw(st.integers(0, len(lines) - 1))
        lines[at] = data.draw(st.sampled_from([
            b'{"features": ' + lines[at] + b"}", b"null", b"[1, true]", b"", b"  ", b"[1] [2]", b"[1],[2]", b'"1"',
            b"[NaN]", b"[1e999]", b"\xff", b'{"x": 1}', b"[[1], [2, 3]]",
        ]))
    body = b"\n".join(lines) + b"\n"
    same(outcome(records.jsonlines, body, size), outcome(records.jsonlines, body, WHOLE))


NAMES = ("a", "b")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(records_nd, records_nd), min_size=1, max_size=6), sizes, st.data())
def test_named_jsonlines_sliced_equals_whole(pairs, size, data):
    """JSON Lines of several named inputs: the same arrays, or the same first bad line's
    error, however the body is sliced."""
    lines = [orjson.dumps({"a": a.tolist(), "b": b.tolist()}) for a, b in pairs]
    for _ in range(data.draw(st.integers(0, 2))):
        at = data.draw(st.integers(0, len(lines) - 1))
        lines[at] = data.draw(st.sampled_from([
            b'{"inputs": ' + lines[at] + b"}", b'{"a": [1], "b": null}', b'{"a": [1]}', b"[1, 2]", b"", b"  ",
            b'{"a": [1], "b": [2]} {"a": [1], "b": [2]}', b'{"a": [1], "b": [2]},{"a": [1], "b": [2]}',
            b'{"a": [[1], [2, 3]], "b": 1}', b'{"a": "1", "b": 1}', b'{"a": [NaN], "b": 1}', b"\xff",
            b'{"a": 1, "b": 2, "c": "other keys are ignored"}', b'{"a": [true], "b": 1}',
        ]))
    body = b"\n".join(lines) + b"\n"
    sliced = outcome(records.jsonlines_named, body, NAMES, size)
    whole = outcome(records.jsonlines_named, body, NAMES, WHOLE)
    assert sliced[0] == whole[0], (sliced, whole)
    if whole[0] == "error":
        assert sliced[1] == whole[1]
        return
    for name in NAMES:
        same(("ok", sliced[1][name]), ("ok", whole[1][name]))
        # Each input's array is what numpy makes of that input's values, line by line.
        values = [orjson.loads(line) for line in body.rstrip(b" \t\r\n\f\v").split(b"\n")]  # (trailing blanks: none)
        values = [v.get("inputs", v) for v in values]
        expected = np.array([v[name] for v in values], dtype=np.float64)
        same(("ok", whole[1][name]), ("ok", expected))


@pytest.mark.parametrize("blank", [b"", b" ", b"\t", b"\r", b" \r", b"\f", b"\v", b" \t\f\v\r"])
@pytest.mark.parametrize("at", [0, 1, 2])
def test_a_blank_json_line_is_named_whatever_it_holds(blank, at):
    """The numeric slice parse leaves a blank line to the line-by-line one, which names it."""
    lines = [b"[1, 2]", b"[3, 4]", b"[5, 6]"]
    lines.insert(at, blank)
    body = b"\n".join(lines) + b"\n"
    for size in (1, 4, WHOLE):
        with pytest.raises(BadRequest) as info:
            records.jsonlines(body, size)
        assert info.value.message == f"line {at + 1} is empty: each line must be one record"


@pytest.mark.parametrize("line, answer", [
    (b"null", "JSON Lines line 2: null is not a number"),
    (b"[1, true]", "JSON Lines line 2, position [1]: true is not a number"),
    (b"[false]", "JSON Lines line 2, position [0]: false is not a number"),
    (b'"1"', 'JSON Lines line 2: the string "1" is not a number'),
    (b"{}", "JSON Lines line 2: an object record must hold the record"),
    (b'{"features": [1, 2]}', [[1.0, 2.0], [1.0, 2.0]]),
    (b"[1, 2] x", "JSON Lines line 2 is not valid JSON"),
])
def test_a_line_that_is_not_lists_and_numbers_is_judged_on_its_own(line, answer):
    """Whatever the slice size, a line holding anything but lists and numbers is read
    as the line-by-line parse reads it: taken (a record under a key) or named."""
    for size in (1, 4, WHOLE):
        if isinstance(answer, list):
            assert records.jsonlines(b"[1, 2]\n" + line, size).tolist() == answer
            continue
        with pytest.raises(BadRequest) as info:
            records.jsonlines(b"[1, 2]\n" + line, size)
        assert info.value.message.startswith(answer)


@settings(max_examples=150, deadline=None)
@given(records_nd, sizes, st.sampled_from([None, "instances", "inputs"]), st.booleans())
def test_json_document_sliced_equals_whole(array, size, key, spaced):
    listed = array.tolist()
    document = listed if key is None else {key: listed}
    body = orjson.dumps(document, option=orjson.OPT_INDENT_2 if spaced else 0)
    original = records.SLICED_JSON_MIN_BYTES
    records.SLICED_JSON_MIN_BYTES = 0
    try:
        sliced = records.parse_document(body, size=size)
    finally:
        records.SLICED_JSON_MIN_BYTES = original
    got = sliced if key is None else sliced[key]
    assert isinstance(got, np.ndarray)  # the numeric-records path was taken
    np.testing.assert_array_equal(got, np.array(orjson.loads(body) if key is None else listed, dtype=np.float64))
    assert got.shape == array.shape


@pytest.mark.parametrize("body", [
    b'[[1, 2], [3, "4"]]', b"[[1, 2], [3, null]]", b"[[1, 2], [3]]", b"[[1, 2],, [3, 4]]", b'{"instances": [[1]], "x": 1}',
    b"[[1, 2], [3, 4]] [5]",
])
def test_json_documents_the_sliced_path_leaves_to_one_parse(body):
    original = records.SLICED_JSON_MIN_BYTES
    records.SLICED_JSON_MIN_BYTES = 0
    try:
        sliced = outcome(records.parse_document, body, "request body", 2)
    finally:
        records.SLICED_JSON_MIN_BYTES = original
    whole = outcome(records.parse, body)
    assert sliced[0] == whole[0] and (sliced[1] == whole[1])


any_arrays = hnp.arrays(st.sampled_from([np.float64, np.float32, np.int64, np.uint8, np.bool_]),
                        hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6))


@settings(max_examples=200, deadline=None)
@given(any_arrays, st.sampled_from([np.float32, np.float64, np.int32]), st.integers(1, 20), st.booleans())
def test_bounded_copies_equal_numpys_own(array, dtype, values, transposed):
    """slices.cast and slices.stack copy a bounded piece per call, also within one wide
    record, and give what np.ascontiguousarray and np.concatenate give."""
    if transposed:
        array = array.T  # not C-contiguous: copied by rows
    original = slices.VALUES
    slices.VALUES = values
    try:
        with np.errstate(all="ignore"):
            cast = slices.cast(array, dtype)
            expected = np.ascontiguousarray(array, dtype=dtype) if array.ndim else np.array(array, dtype=dtype)
        pieces = list(slices.pieces(array, values))
        if array.ndim:
            stacked = slices.stack([array, array[:1], array])
    finally:
        slices.VALUES = original
    assert cast.dtype == expected.dtype and cast.shape == expected.shape and cast.flags.c_contiguous
    np.testing.assert_array_equal(cast, expected)
    assert all(len(piece) <= max(values, array.size // max(1, len(array)) if array.ndim else 1) for _, piece in pieces)
    flat = np.concatenate([piece for _, piece in pieces]) if pieces else np.empty(0, array.dtype)
    np.testing.assert_array_equal(flat, array.reshape(-1))
    assert [offset for offset, _ in pieces] == [sum(len(p) for _, p in pieces[:i]) for i in range(len(pieces))]
    if array.ndim:
        np.testing.assert_array_equal(stacked, np.concatenate([array, array[:1], array]))


output_arrays = st.one_of(
    hnp.arrays(st.sampled_from([np.float32, np.float64]), hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=5)),
    hnp.arrays(st.sampled_from([np.int8, np.int64, np.uint16, np.bool_]), hnp.array_shapes(min_dims=1, max_dims=3, max_side=5)),
)


@settings(max_examples=200, deadline=None)
@given(output_arrays, st.integers(min_value=1, max_value=16))
def test_encoders_sliced_equal_whole(array, values):
    assert textout.array_json(array, values) == textout.array_json(array, WHOLE)
    assert textout.array_json(array, WHOLE) == orjson.dumps(array, option=orjson.OPT_SERIALIZE_NUMPY)
    assert textout.json_lines(array, values) == textout.json_lines(array, WHOLE)
    assert textout.json_lines(array, WHOLE) == b"".join(
        orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n" for row in array)
    if array.dtype.kind != "b":
        flat = array.reshape(len(array), math.prod(array.shape[1:]))  # -1 is ambiguous when empty
        assert textout.csv_rows(flat, values) == textout.csv_rows(flat, WHOLE)
        if flat.dtype.kind == "f":
            with np.errstate(invalid="ignore"):
                expected = [
                    b",".join(b"nan" if v != v else b"inf" if v == np.inf else b"-inf" if v == -np.inf
                              else orjson.dumps(v, option=orjson.OPT_SERIALIZE_NUMPY) for v in row)
                    for row in flat]
            assert textout.csv_rows(flat, WHOLE) == expected

"""The simple content types, as pure functions."""

import io
import json
import math

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from smserve.codecs import records, simple, v2
from smserve.codecs.records import jsondoc
from smserve.errors import BadRequest, NotAcceptable
from smserve.core.metadata import ModelMetadata, TensorSpec
from smserve.protocols.simple import decode_inputs, json_inputs, shape_inputs

from tests.helpers.client import npy

DIGITS = ModelMetadata(name="d", max_batch_size=8, inputs=(TensorSpec("pixels", "FP32", (4,)),),
                       outputs=(TensorSpec("p", "FP32", (2,)),))
IMAGES = ModelMetadata(name="i", max_batch_size=8, inputs=(TensorSpec("image", "UINT8", (2, 2)),))
TWO = ModelMetadata(name="t", max_batch_size=8, inputs=(TensorSpec("a", "FP32", (2,)), TensorSpec("b", "INT64", (1,))))


def decode(body, content_type, metadata=DIGITS):
    return decode_inputs(body, content_type, metadata)


@pytest.mark.parametrize("body", [
    b'{"instances": [[1, 2, 3, 4], [5, 6, 7, 8]]}',
    b'{"inputs": [[1, 2, 3, 4], [5, 6, 7, 8]]}',
    b'[[1, 2, 3, 4], [5, 6, 7, 8]]',
])
def test_json_forms(body):
    out = decode(body, "application/json; charset=utf-8")["pixels"]
    assert out.dtype == np.float32 and out.shape == (2, 4)


def test_a_single_record_gets_its_batch_dimension():
    assert decode(b"[1, 2, 3, 4]", "application/json")["pixels"].shape == (1, 4)


def test_csv_rows_are_reshaped_to_the_sample_shape_and_typed():
    out = decode_inputs(b"1,2,3,4\r\n5,6,7,8\r\n\r\n", "text/csv", IMAGES)["image"]
    assert out.dtype == np.uint8 and out.shape == (2, 2, 2)


def test_fractional_values_for_an_integer_input_are_refused():
    with pytest.raises(BadRequest, match="UINT8"):
        decode_inputs(b"1,2,3,4.5\n", "text/csv", IMAGES)


FLAGS = ModelMetadata(name="f", max_batch_size=8, inputs=(TensorSpec("on", "BOOL", (2,)),))
WIDE = ModelMetadata(name="w", max_batch_size=8, inputs=(TensorSpec("id", "INT64", (1,)),))
UNSIGNED = ModelMetadata(name="u", max_batch_size=8, inputs=(TensorSpec("id", "UINT64", (1,)),))


@pytest.mark.parametrize("body, content_type, metadata, words", [
    # Wrapped by the cast before: 300 -> 44, -1 -> 255, 1e10 -> 0, 2 -> True.
    (b"1,2,3,300\n", "text/csv", IMAGES, "input 'image': a value is out of range for UINT8"),
    (b"[[-1, 2, 3, 4]]", "application/json", IMAGES, "out of range for UINT8"),
    (b"[[1e10, 2, 3, 4]]", "application/json", IMAGES, "out of range for UINT8"),
    (b"[1,2,3,4]\n[1,2,3,256]\n", "application/jsonlines", IMAGES, "out of range for UINT8"),
    (npy(np.array([[1, 2, 3, 256]], dtype=np.int64)), "application/x-npy", IMAGES, "out of range for UINT8"),
    (npy(np.array([[1, 2, 3, -1]], dtype=np.int8)), "application/x-npy", IMAGES, "out of range for UINT8"),
    (b"[[0, 2]]", "application/json", FLAGS, "input 'on': a value is out of range for BOOL (0 or 1)"),
    (b"1,-1\n", "text/csv", FLAGS, "out of range for BOOL"),
    (b"[[9.3e18]]", "application/json", WIDE, "out of range for INT64"),  # past 2**63 - 1
    (npy(np.array([[2**63]], dtype=np.uint64)), "application/x-npy", WIDE, "out of range for INT64"),
    (npy(np.array([[-1]], dtype=np.int64)), "application/x-npy", UNSIGNED, "out of range for UINT64"),
    (b"[[1.9e19]]", "application/json", UNSIGNED, "out of range for UINT64"),  # past 2**64 - 1
])
def test_integers_an_input_cannot_hold_are_400_not_wrapped(body, content_type, metadata, words):
    with pytest.raises(BadRequest) as info:
        decode_inputs(body, content_type, metadata)
    assert info.value.status == 400 and words in info.value.message


@pytest.mark.parametrize("body, content_type, metadata, expected", [
    (b"0,255,0,255\n", "text/csv", IMAGES, [[[0, 255], [0, 255]]]),
    (b"[[1, 0]]", "application/json", FLAGS, [[True, False]]),
    (npy(np.array([[True, False]])), "application/x-npy", FLAGS, [[True, False]]),
    (npy(np.array([[2**63 - 1]], dtype=np.int64)), "application/x-npy", WIDE, [[2**63 - 1]]),
    (npy(np.array([[2**64 - 1]], dtype=np.uint64)), "application/x-npy", UNSIGNED, [[2**64 - 1]]),
    (npy(np.array([[-(2**63)]], dtype=np.int64)), "application/x-npy", WIDE, [[-(2**63)]]),
])
def test_integers_at_the_edges_of_their_type_are_taken(body, content_type, metadata, expected):
    out = next(iter(decode_inputs(body, content_type, metadata).values()))
    assert out.tolist() == expected


def test_jsonlines_accepts_arrays_and_feature_objects():
    out = decode(b'[1,2,3,4]\n{"features": [5,6,7,8]}\n', "application/jsonlines")["pixels"]
    np.testing.assert_array_equal(out, [[1, 2, 3, 4], [5, 6, 7, 8]])


def test_npy_round_trip_and_no_pickle():
    buffer = io.BytesIO()
    np.save(buffer, np.ones((3, 4), dtype=np.float64))
    assert decode(buffer.getvalue(), "application/x-npy")["pixels"].dtype == np.float32
    buffer = io.BytesIO()
    np.save(buffer, np.array([object()], dtype=object), allow_pickle=True)
    with pytest.raises(BadRequest, match="never unpickled"):
        decode(buffer.getvalue(), "application/x-npy")


def test_several_inputs_by_name():
    out = decode_inputs(b'{"inputs": {"a": [[1, 2]], "b": [[3]]}}', "application/json", TWO)
    assert out["a"].dtype == np.float32 and out["b"].dtype == np.int64
    out = decode_inputs(b'{"instances": [{"a": [1, 2], "b": [3]}, {"a": [4, 5], "b": [6]}]}', "application/json", TWO)
    assert out["a"].shape == (2, 2) and out["b"].shape == (2, 1)
    with pytest.raises(BadRequest, match="missing input 'b'"):
        decode_inputs(b'{"inputs": {"a": [[1, 2]]}}', "application/json", TWO)


@pytest.mark.parametrize("body, content_type, words", [
    (b"1,2,3,4\n1,2,3\n", "text/csv", "CSV line 2 has 3 columns"),
    (b"1,2,3,4\n1,2,x,4\n", "text/csv", "CSV line 2, column 3"),
    (b"1,2,3\n", "text/csv", "expected shape [-1, 4]"),
    (b"[1,2,3,4]\n[1,2]\n", "application/jsonlines", "line 2"),
    (b"[[1,2,3,4],[1]]", "application/json", "ragged"),
    (b"", "text/csv", "empty"),
    (b"\n\n", "text/csv", "no records"),
    (b"not json", "application/json", "not valid JSON"),
    (b"42", "application/json", "list of records"),
])
def test_bad_bodies(body, content_type, words):
    with pytest.raises(BadRequest, match=words.replace("[", r"\[").replace("]", r"\]")):
        decode(body, content_type)


OUT = {"p": np.array([[0.25, 0.75], [1.0, 0.0]], dtype=np.float32)}


def test_encodings_have_one_line_per_record():
    body, media = simple.encode(OUT, "text/csv")
    assert media == "text/csv" and body == b"0.25,0.75\n1.0,0.0\n"
    body, media = simple.encode(OUT, "application/jsonlines")
    assert body.decode().splitlines() == ["[0.25,0.75]", "[1.0,0.0]"]
    body, _ = simple.encode(OUT, "application/json")
    assert json.loads(body) == {"predictions": [[0.25, 0.75], [1.0, 0.0]]}
    body, _ = simple.encode(OUT, "application/x-npy")
    np.testing.assert_array_equal(np.load(io.BytesIO(body)), OUT["p"])


def test_several_outputs():
    outputs = {"p": OUT["p"], "label": np.array([1, 0])}
    assert json.loads(simple.encode(outputs, "application/json")[0]) == {
        "predictions": [{"p": [0.25, 0.75], "label": 1}, {"p": [1.0, 0.0], "label": 0}]}
    assert simple.encode(outputs, "text/csv")[0] == b"0.25,0.75,1\n1.0,0.0,0\n"
    with pytest.raises(NotAcceptable):
        simple.encode(outputs, "application/x-npy")


def test_npy_header_claiming_more_than_the_body_holds_allocates_nothing():
    import tracemalloc

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10**9, 4)})
    tracemalloc.start()
    with pytest.raises(BadRequest, match="bytes follow it"):
        decode(header.getvalue() + b"\0" * 32, "application/x-npy")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1 << 20


def test_npy_fortran_order_and_big_endian_arrays():
    for array in (np.asfortranarray(np.arange(8.0).reshape(2, 4)), np.arange(8, dtype=">i4").reshape(2, 4)):
        buffer = io.BytesIO()
        np.save(buffer, array)
        np.testing.assert_array_equal(decode(buffer.getvalue(), "application/x-npy")["pixels"], array)


# --------------------------------------------------------------------------------------
# Numbers: text carries finite numbers only; JSON outputs never hold NaN or Infinity


@pytest.mark.parametrize("body, content_type, words", [
    (b"[[1, 2, 3, null]]", "application/json", "record 1, position [3]: null is not a number"),
    (b'{"instances": [[1, 2, 3, 4], [1, true, 3, 4]]}', "application/json", "record 2, position [1]: true is not a number"),
    (b'[[1, 2, 3, "1"]]', "application/json", 'the string "1" is not a number'),
    (b"[1, 2, false, 4]", "application/json", "record 3: false is not a number"),
    (b"[[1, 2, 3, NaN]]", "application/json", "not valid JSON"),
    (b"[[1, 2, 3, 1e999]]", "application/json", "not valid JSON: number is infinity"),
    (b"[[1, 2, 3, " + b"1" * 5000 + b"]]", "application/json", "not valid JSON"),  # Python's 4,300-digit limit
    (b"[1,2,3,4]\n[1,2,null,4]\n", "application/jsonlines", "JSON Lines line 2, position [2]: null is not a number"),
    (b'{"features": [1, 2, 3, "4"]}\n', "application/jsonlines", "JSON Lines line 1, position [3]"),
    (b"[1,2,3,4]\n[1,2," + b"9" * 5000 + b",4]\n", "application/jsonlines", "JSON Lines line 2 is not valid JSON"),
    (b"[1,2,3,4]\n[1,2,NaN,4]\n", "application/jsonlines", "JSON Lines line 2 is not valid JSON"),
    (b"1,2,3,4\n1,2,3,nan\n", "text/csv", "CSV line 2, column 4: 'nan' is not a finite number"),
    (b"1,2,3,4\n-inf,2,3,4\n", "text/csv", "CSV line 2, column 1: '-inf' is not a finite number"),
    (b"1,2,3,4\n1,2,3,1e999\n", "text/csv", "CSV line 2, column 4: '1e999' is out of range"),
    (b"1,2,3," + b"9" * 5000 + b"\n", "text/csv", "CSV line 1, column 4"),
    (b"1,2,3,1_0\n", "text/csv", "CSV line 1, column 4: '1_0' is not a number"),
    (b"1,2,3,4\n1,2,3,1e39\n", "text/csv", "input 'pixels': a value is out of range for FP32"),
    (b"[[1, 2, 3, 1e39]]", "application/json", "out of range for FP32"),
    # Rectangular, but deeper than numpy's 64 dimensions: not "ragged".
    (b"[" * 65 + b"1" + b"]" * 65, "application/json", "records nest deeper than the 64 dimensions an array can have"),
    (b"[" * 64 + b"1" + b"]" * 64 + b"\n", "application/jsonlines", "JSON Lines lines 1-1: a record nests deeper than 63"),
    (b"[1,2,3,4]\n" + b"[" * 80 + b"1" + b"]" * 80 + b"\n", "application/jsonlines",
     "JSON Lines line 2: record shape differs from line 1's"),  # which it does
])
def test_non_numbers_and_non_finite_numbers_are_400(body, content_type, words):
    with pytest.raises(BadRequest) as info:
        decode(body, content_type)
    assert info.value.status == 400 and words in info.value.message


def test_several_inputs_name_the_input_and_record():
    with pytest.raises(BadRequest, match=r"input 'b', record 2: null is not a number"):
        decode_inputs(b'{"instances": [{"a": [1, 2], "b": [3]}, {"a": [4, 5], "b": null}]}', "application/json", TWO)


def test_a_record_without_one_of_several_inputs_is_named():
    with pytest.raises(BadRequest) as info:
        decode_inputs(b'{"instances": [{"a": [1, 2], "b": [3]}, {"a": [4, 5]}]}', "application/json", TWO)
    assert info.value.message == "record 2: missing input 'b'"


# --------------------------------------------------------------------------------------
# JSON Lines for a model of several inputs: one object a line, keyed by the input
# names (the record form simple JSON's instances take)

PEOPLE = ModelMetadata(name="p", max_batch_size=8,
                       inputs=(TensorSpec("age", "FP32", (1,)), TensorSpec("income", "INT64", (2,))))
PEOPLE_RECORDS = [{"age": [31], "income": [1000, 2]}, {"age": [42.5], "income": [3, 4]},
                  {"age": [0], "income": [-5, 6]}]


def jsonl(*records) -> bytes:
    return b"".join((r if isinstance(r, bytes) else orjson.dumps(r)) + b"\n" for r in records)


def assert_same_inputs(a: dict, b: dict):
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape
        np.testing.assert_array_equal(a[name], b[name])


def test_json_lines_take_one_record_of_named_inputs_a_line():
    out = decode_inputs(jsonl(*PEOPLE_RECORDS), "application/jsonlines", PEOPLE)
    assert_same_inputs(out, decode_inputs(orjson.dumps({"instances": PEOPLE_RECORDS}), "application/json", PEOPLE))
    assert out["age"].dtype == np.float32 and out["age"].tolist() == [[31], [42.5], [0]]
    assert out["income"].dtype == np.int64 and out["income"].tolist() == [[1000, 2], [3, 4], [-5, 6]]


def test_json_lines_named_records_may_sit_under_a_record_key_and_carry_other_keys():
    body = jsonl({"inputs": PEOPLE_RECORDS[0]}, {**PEOPLE_RECORDS[1], "id": "b-17"}, {"instances": PEOPLE_RECORDS[2]})
    assert_same_inputs(decode_inputs(body, "application/jsonlines", PEOPLE),
                       decode_inputs(jsonl(*PEOPLE_RECORDS), "application/jsonlines", PEOPLE))


def test_many_json_lines_of_named_inputs_equal_simple_json():
    rng = np.random.default_rng(7)
    rows = [{"age": [round(float(a), 3)], "income": [int(i), int(j)]}
            for a, i, j in zip(rng.random(20_000) * 90, rng.integers(0, 10**6, 20_000), rng.integers(-9, 9, 20_000))]
    assert_same_inputs(decode_inputs(jsonl(*rows), "application/jsonlines", PEOPLE),
                       decode_inputs(orjson.dumps({"instances": rows}), "application/json", PEOPLE))


@pytest.mark.parametrize("body, message", [
    (jsonl(PEOPLE_RECORDS[0], {"age": [4]}), "JSON Lines line 2: missing input 'income'"),
    (jsonl(PEOPLE_RECORDS[0], {"age": [4], "income": [5, None]}),
     "JSON Lines line 2, input 'income', position [1]: null is not a number (inputs must be JSON numbers)"),
    (jsonl(PEOPLE_RECORDS[0], {"age": [4], "income": "5,6"}),
     'JSON Lines line 2, input \'income\': the string "5,6" is not a number (inputs must be JSON numbers)'),
    (jsonl(PEOPLE_RECORDS[0], {"age": [4, 5], "income": [5, 6]}),
     "JSON Lines line 2, input 'age': shape [2] differs from line 1's [1]"),
    (jsonl({"age": [1], "income": [[2], 3]}),
     "JSON Lines line 1, input 'income': the value is ragged: its items differ in shape (it must be a number or "
     "an array whose rows all have one length)"),
    (jsonl([31, 1000, 2]), 'JSON Lines line 1: this model has several inputs (age, income): a record is one object '
                           'holding each of them by name, {"age": ..., "income": ...}'),
    (jsonl(PEOPLE_RECORDS[0], b"", PEOPLE_RECORDS[1]), "line 2 is empty: each line must be one record"),
    (jsonl(PEOPLE_RECORDS[0], orjson.dumps(PEOPLE_RECORDS[1]) + b" " + orjson.dumps(PEOPLE_RECORDS[2])),
     "JSON Lines line 2 is not valid JSON"),
    (jsonl(*PEOPLE_RECORDS, {"age": [1], "income": [2, 3.5]}),
     "input 'income' takes INT64 values; got a fractional number in record 4: 3.5"),
])
def test_json_lines_of_named_inputs_name_the_line_at_fault(body, message):
    with pytest.raises(BadRequest) as info:
        decode_inputs(body, "application/jsonlines", PEOPLE)
    assert info.value.status == 400 and info.value.message.startswith(message), info.value.message


def test_a_json_line_holding_objects_for_a_model_of_one_input_says_where_its_record_goes():
    with pytest.raises(BadRequest) as info:
        decode(b'{"tokens": [1, 2, 3, 4]}\n', "application/jsonlines")
    assert info.value.message == ("JSON Lines line 1: an object record must hold the record (an array or a number) "
                                  "under 'pixels', 'instances', 'inputs', 'features' or 'data'")


def test_a_json_line_may_name_the_one_input_as_a_model_of_several_does():
    """{"pixels": [...]} a line, the form a model of several inputs takes, is the
    record itself for a model whose one input is called pixels."""
    named = decode(b'{"pixels": [1, 2, 3, 4]}\n{"pixels": [5, 6, 7, 8]}\n', "application/jsonlines")["pixels"]
    bare = decode(b"[1, 2, 3, 4]\n[5, 6, 7, 8]\n", "application/jsonlines")["pixels"]
    assert named.dtype == np.float32 and np.array_equal(named, bare)


# --------------------------------------------------------------------------------------
# A ragged JSON Lines record is called ragged, wherever it is


@pytest.mark.parametrize("body, line", [
    (b"[[1,2],[3]]\n[1]\n", 1),
    (b"[1,[2]]\n", 1),
    (b"[[1, 2], [3, 4]]\n[[1], [2, 3]]\n", 2),
])
def test_a_ragged_json_lines_record_is_named_ragged(body, line):
    with pytest.raises(BadRequest) as info:
        decode(body, "application/jsonlines")
    assert info.value.message == (f"JSON Lines line {line}: the record is ragged: its items differ in shape (it must "
                                  "be a number or an array whose rows all have one length)")


# --------------------------------------------------------------------------------------
# A value an input's datatype cannot hold names the first record that holds it

IDS = ModelMetadata(name="ids", max_batch_size=8, inputs=(TensorSpec("ids", "INT64", (4,)),))


def _rows_with(record: int, bad: bytes, rows: int = 50_000, csv: bool = True) -> bytes:
    good = b"1,2,3,4" if csv else b"[1,2,3,4]"
    lines = [good] * rows
    lines[record - 1] = bad
    return b"\n".join(lines) + b"\n"


@pytest.mark.parametrize("body, content_type, metadata, message", [
    (_rows_with(41_235, b"1,2,3.5,4"), "text/csv", IDS,
     "input 'ids' takes INT64 values; got a fractional number in record 41235: 3.5"),
    (_rows_with(41_235, b"[1,2,3,300]", csv=False), "application/jsonlines", IMAGES,
     "input 'image': a value is out of range for UINT8 in record 41235: 300"),
    (_rows_with(3, b"1,2,3,1e39", rows=5), "text/csv", DIGITS,
     "input 'pixels': a value is out of range for FP32 in record 3: 1e+39"),
    (b"[[0, 1], [1, 2]]", "application/json", FLAGS, "input 'on': a value is out of range for BOOL (0 or 1) in record 2: 2"),
    (b"[[1], [2], [9.3e18]]", "application/json", WIDE, "input 'id': a value is out of range for INT64 in record 3: 9.3e+18"),
    (npy(np.array([[3], [-1]], dtype=np.int64)), "application/x-npy", UNSIGNED,
     "input 'id': a value is out of range for UINT64 in record 2: -1"),
    (npy(np.array([[1, 2, 3, 4], [1, 2, 3, np.nan]])), "application/x-npy", IDS,
     "input 'ids' takes INT64 values; got a non-finite number in record 2: nan"),
    # The first record at fault, whichever its fault: record 2's 300 before record 3's 2.5.
    (b"[1,2,3,4]\n[1,2,3,300]\n[1,2,2.5,4]\n", "application/jsonlines", IMAGES,
     "input 'image': a value is out of range for UINT8 in record 2: 300"),
    (b"[1,2,3,4]\n[1,2,2.5,4]\n[1,2,3,300]\n", "application/jsonlines", IMAGES,
     "input 'image' takes UINT8 values; got a fractional number in record 2: 2.5"),
])
def test_a_value_an_input_cannot_hold_names_its_record(body, content_type, metadata, message):
    with pytest.raises(BadRequest) as info:
        decode_inputs(body, content_type, metadata)
    assert info.value.status == 400 and info.value.message == message


def test_the_record_named_is_counted_along_dimension_0():
    one = np.ones((1, 3_000_000))
    one[0, 2_999_999] = 0.5
    many = np.ones((3_000_000, 1))
    many[2_999_999, 0] = 0.5
    spec = ModelMetadata(name="any", max_batch_size=8, inputs=(TensorSpec("x", "INT64", (-1,)),))
    for array, record in ((one, 1), (many, 3_000_000)):
        with pytest.raises(BadRequest) as info:
            shape_inputs(array, spec)
        assert info.value.message == f"input 'x' takes INT64 values; got a fractional number in record {record}: 0.5"


NON_FINITE = {"p": np.array([[np.nan, np.inf], [-np.inf, 0.1]], dtype=np.float32)}


def strict(body: bytes):
    return json.loads(body, parse_constant=lambda name: pytest.fail(f"{name} in a JSON answer"))


def test_json_outputs_write_non_finite_values_as_null():
    body, _ = simple.encode(NON_FINITE, "application/json")
    assert strict(body) == {"predictions": [[None, None], [None, 0.1]]}
    body, _ = simple.encode({**NON_FINITE, "label": np.array([1, 0])}, "application/json")
    assert strict(body)["predictions"][0] == {"p": [None, None], "label": 1}
    body, _ = simple.encode(NON_FINITE, "application/jsonlines")
    assert [strict(line) for line in body.splitlines()] == [[None, None], [None, 0.1]]
    body, _ = simple.encode({"p": NON_FINITE["p"].astype(np.float16)}, "application/json")
    assert strict(body) == {"predictions": [[None, None], [None, 0.1]]}


def test_csv_and_npy_carry_non_finite_values():
    assert simple.encode(NON_FINITE, "text/csv")[0] == b"nan,inf\n-inf,0.1\n"
    body, _ = simple.encode(NON_FINITE, "application/x-npy")
    np.testing.assert_array_equal(np.load(io.BytesIO(body)), NON_FINITE["p"])


def test_float32_outputs_keep_their_shortest_digits():
    values = np.array([[0.1, 1 / 3, 1e-8, 3.4028235e38, 16777216.0]], dtype=np.float32)
    body, _ = simple.encode({"p": values}, "application/json")
    assert body == b'{"predictions":[[0.1,0.33333334,1e-8,3.4028235e+38,16777216.0]]}'
    assert simple.encode({"p": values}, "text/csv")[0] == b"0.1,0.33333334,1e-8,3.4028235e+38,16777216.0\n"
    np.testing.assert_array_equal(np.array(strict(body)["predictions"], dtype=np.float32), values)


def test_npy_answer_is_what_np_save_writes():
    for array in (np.arange(12, dtype=np.float32).reshape(3, 4), np.zeros((), np.int64), np.arange(3) > 1):
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        assert simple.encode({"p": array}, "application/x-npy")[0] == buffer.getvalue()


def test_npy_request_is_a_view_on_the_body():
    buffer = io.BytesIO()
    np.save(buffer, np.arange(8, dtype=np.float32).reshape(2, 4))
    body = buffer.getvalue()
    out = decode(body, "application/x-npy")["pixels"]
    assert np.shares_memory(out, np.frombuffer(body, dtype=np.uint8))


@pytest.mark.parametrize("header", [
    b"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }",  # structured
    b"{'descr': '<U3', 'fortran_order': False, 'shape': (1,), }",
    b"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': __import__('os')}",
    b"{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }",
    b"{'descr': '<f4', 'fortran_order': False, 'shape': (" + b"9" * 5000 + b", 1), }",  # int()'s digit limit
    b"{'descr': '<f4', 'shape': (" + b"9" * 5000 + b", 1), 'fortran_order': False, }",  # numpy's own reader
    # True is an int to isinstance; 12 bytes are what (True, 3) float32 would hold.
    b"{'descr': '<f4', 'fortran_order': False, 'shape': (True, 3), }",
    b"{'shape': (True, 3), 'fortran_order': False, 'descr': '<f4', }",  # numpy's own reader
    b"{'shape': (1, False), 'fortran_order': False, 'descr': '<f4', }",
])
def test_npy_headers_outside_the_strict_form_are_refused_safely(header):
    header = header + b" " * (-(len(header) + 11) % 64) + b"\n"
    body = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\0" * 12
    with pytest.raises(BadRequest):
        decode(body, "application/x-npy")


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_])
@pytest.mark.parametrize("shape", [(0,), (0, 3), (2, 0), (2, 3), (3, 0, 2)])
def test_every_output_shape_and_dtype_encodes(shape, dtype):
    """Empty outputs, float16 beside another output: every media type answers."""
    array = np.arange(math.prod(shape)).reshape(shape).astype(dtype)
    label = np.arange(shape[0])
    for outputs in ({"p": array}, {"p": array, "label": label}):
        body, _ = simple.encode(outputs, "application/json")
        predictions = strict(body)["predictions"]
        assert len(predictions) == shape[0]
        if len(outputs) == 2 and shape[0]:
            assert predictions[-1]["label"] == shape[0] - 1
            np.testing.assert_array_equal(np.array(predictions[-1]["p"], dtype=dtype).reshape(shape[1:]), array[-1])
        lines = simple.encode(outputs, "application/jsonlines")[0].splitlines()
        assert [strict(line) for line in lines] == predictions
        csv = simple.encode(outputs, "text/csv")[0]
        assert csv.count(b"\n") == shape[0]
    body, _ = simple.encode({"p": array}, "application/x-npy")
    np.testing.assert_array_equal(np.load(io.BytesIO(body)), array)


# --------------------------------------------------------------------------------------
# JSON records of numbers only take a fast path (no type check per record, one
# conversion): its arrays and errors must be those of the record-by-record path.


def _any_shape(datatype):
    """One unbatched input that takes any shape, so the conversion alone is judged."""
    return ModelMetadata(name="any", inputs=(TensorSpec("x", datatype, ()),))


FAST_MODELS = [DIGITS, IMAGES, _any_shape("FP32"), _any_shape("FP64"), _any_shape("FP16"), _any_shape("INT64"),
               _any_shape("UINT8"), _any_shape("BOOL"), TWO]


def outcome(fn, *args):
    try:
        return "ok", fn(*args)
    except BadRequest as e:
        return "error", e.message


def record_by_record(body: bytes, metadata):
    """The path every JSON body took before the fast path: parse, then check and convert."""
    return json_inputs(records.parse(body), metadata)


def assert_same_as_record_by_record(body: bytes, metadata):
    fast = outcome(decode_inputs, body, "application/json", metadata)
    slow = outcome(record_by_record, body, metadata)
    assert fast[0] == slow[0], (body[:80], fast, slow)
    if fast[0] == "error":
        assert fast[1] == slow[1]
        return
    assert fast[1].keys() == slow[1].keys()
    for name, array in fast[1].items():
        assert array.dtype == slow[1][name].dtype and array.shape == slow[1][name].shape
        assert array.tobytes() == slow[1][name].tobytes()  # -0.0 and every bit alike


FAST_BODIES = [
    b"[[1, 2, 3, 4], [5, 6, 7, 8]]",
    b'{"instances": [[1, 2, 3, 4], [5, 6, 7, 8]]}',
    b' { "data" :\n[[1,2,3,4]] } ',
    b"[1, 2, 3, 4]",
    b"[[-0.0, -0, 0.0, 0]]",
    b"[[1e5, 1E+5, -2.5e-3, 1e-50]]",  # exponents; 1e-50 is 0 in FP32 and FP16
    b"[[3e38, -3.4028234663852886e38, 3.402823669209385e38, 1]]",  # FP32's largest, and one that rounds up to inf
    b"[[1e39, 2, 3, 4]]",
    b"[[-1e39, 2, 3, 4]]",
    b"[[1e308, 2, 3, 4]]",
    b"[[340282366920938463463374607431768211456, 2, 3, 4]]",  # 2**128: an integer beyond FP32
    b"[[18446744073709551615, 9223372036854775807, -9223372036854775808, 9007199254740993]]",
    b"[[18446744073709551616, -9223372036854775809, 1, 2]]",  # beyond 64 bits: orjson reads floats
    b"[[65504, 65520, 1, 2]]",  # FP16's largest, and one that rounds to inf
    b"[[1, 2, 3, 4.5]]",
    b"[[0, 1, 1, 0]]",
    b"[[1, 2], [3, 4]]",
    b"[[[1, 2], [3, 4]], [[5, 6], [7, 8]]]",
    b"[[[1, 2], [3, 4]]]",
    b"[[1, 2, 3, 4], [5, 6, 7]]",
    b"[[1, [2], 3, 4], [5, 6, 7, 8]]",
    b"[[1, 2, 3, 4], 5]",
    b"[5, [1, 2, 3, 4]]",
    b"[[], []]",
    b"[[]]",
    b"[]",
    b'{"instances": []}',
    b"[[1, 2, 3, 4], []]",
    # Shapes simdjson's flattening would hide: a list within a row of the right count,
    # a number among rows, ragged rows of the right total.
    b"[[1, [2], 3, 4], [5, 6, 7, 8]]",
    b"[[1, 2, 3, [4]], [5, 6, 7, 8]]",
    b"[[1, 2, 3, 4], 5, [[1, 2, 3, 4], 6, 7, 8]]",
    b"[[1, 2, 3, 4], [5, 6], [7, 8, 9, 10, 11, 12]]",
    b"[[[1, 2, 3, 4]], [5, 6, 7, 8]]",
    b"[1, 2, [3, 4]]",
    b"[[1, 2, 3, 4], [[]], [5, 6, 7, 8]]",
    # Texts simdjson reads and orjson refuses, or the reverse.
    b"\xef\xbb\xbf[[1, 2, 3, 4]]",
    b"[[1, 2, 3, 4]]\x00",
    b"[[1, 2, 3, 4]]\f",
    b"[[1,\v2, 3, 4]]",
    b'{"instances": [[1, 2, 3, 4]], "instances": [[5, 6, 7, 8]]}',
    b'{"instances": [[1, 2, 3, 4]]}}',
    b" \t\r\n[[1, 2, 3, 4]] \t\r\n",
    b"[[1.5e-320, 2.4703282292062327e-324, 2.4703282292062328e-324, 1e-400]]",  # subnormals, underflow
    b"[[0.1, 0.2, 0.30000000000000004, 1.7976931348623157e308]]",
    b"[[1.7976931348623159e308, 2, 3, 4]]",  # rounds past the largest double
    b"5",
    b'{"instances": 5}',
    b"[" * 70 + b"1" + b"]" * 70,
    b"[" * 120 + b"1" + b"]" * 120,
    # Not numbers only: the record-by-record path names the culprit.
    b"[[1, 2, 3, null]]",
    b"[[1, 2, true, 4]]",
    b"[[1, false, 3, 4]]",
    b'[[1, 2, 3, "4"]]',
    b"[[1, 2, 3, {}]]",
    b'{"instances": [[1, 2, 3, 4]], "data": [[1, 2, 3, 4]]}',
    b'{"x": 1, "instances": [[1, 2, 3, 4]]}',
    b'{"instances": [{}]}',
    b'{"inputs": {"a": [[1, 2]], "b": [[3]]}}',
    b'{"instances": [{"a": [1, 2], "b": [3]}]}',
    # Numeric-looking, but not JSON.
    b"[1,,2]",
    b"[01]",
    b"[1.]",
    b"[.5]",
    b"[+1]",
    b"[1e]",
    b"[-]",
    b"[NaN]",
    b"[1e999]",
    b"[[1, 2, 3, 4]] ]",
    b"[[1, 2, 3, 4]] [5]",
    b'{"instances": [[1, 2, 3, 4]], }',
    b'{"instances": [[1, 2, 3, 4]]',
]


@pytest.mark.parametrize("metadata", FAST_MODELS, ids=lambda m: f"{m.name}-{m.inputs[0].datatype}")
@pytest.mark.parametrize("body", FAST_BODIES)
def test_numeric_json_fast_path_matches_the_record_by_record_path(body, metadata):
    assert_same_as_record_by_record(body, metadata)


@pytest.mark.parametrize("body, array", [
    (b'{"instances": [[1, 2], [3, 4]]}', {"instances": [[1, 2], [3, 4]]}),
    (b"[[1, 2], [3, 4]]", [[1, 2], [3, 4]]),
    (b"[1, 2.5]", [1, 2.5]),
    (b"[[[1], [2]]]", [[[1], [2]]]),
])
def test_numeric_json_comes_back_as_one_array(body, array):
    document = simple.parse_json(body)
    got = document["instances"] if isinstance(document, dict) else document
    assert isinstance(got, np.ndarray) and got.dtype == np.float64
    np.testing.assert_array_equal(got, array["instances"] if isinstance(array, dict) else array)


@pytest.mark.parametrize("body", [
    b'{"inputs": []}',  # a KServe v2 request with no inputs, not simple JSON
    b"[]",
    b"[[1, 2], [3]]",
    b"[[1, null]]",
    b'{"instances": [[1, 2]], "data": 1}',
    b"[" * 70 + b"1" + b"]" * 70,  # deeper than numpy goes
])
def test_other_json_is_left_to_the_record_by_record_path(body):
    assert simple.parse_json(body) == records.parse(body)


def test_an_empty_inputs_list_is_still_a_v2_request():
    assert v2.is_v2_document(simple.parse_json(b'{"inputs": []}'))


def test_fp32_overflow_in_the_fast_path_is_the_usual_400():
    with pytest.raises(BadRequest, match=r"^input 'pixels': a value is out of range for FP32 in record 2: 1e\+39$"):
        decode(b'{"instances": [[1, 2, 3, 4], [5, 6, 7, 1e39]]}', "application/json")


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5),
                  elements=st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                                     st.integers(-(2**70), 2**70).map(float), st.sampled_from([-0.0, 1e39, 65520.0]))),
       st.sampled_from(FAST_MODELS), st.sampled_from([None, "instances", "features"]), st.booleans())
def test_numeric_json_fast_path_matches_on_any_records(array, metadata, key, as_ints):
    listed = array.tolist()
    if as_ints:  # integers as JSON integers where they are whole, as clients write them
        listed = json.loads(json.dumps(listed), parse_float=lambda s: int(float(s)) if float(s).is_integer() else float(s))
    body = json.dumps(listed if key is None else {key: listed}).encode()  # (orjson stops at 64-bit integers)
    assert_same_as_record_by_record(body, metadata)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.one_of(st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False, allow_infinity=False)),
                         min_size=3, max_size=3), min_size=1, max_size=4),
       st.sampled_from([_any_shape("FP64"), _any_shape("FP32"), _any_shape("INT64")]))
def test_numeric_json_integers_round_as_numpy_rounds_them(rows, metadata):
    """64-bit integers beyond 2**53 are rounded to a double by the fast path as numpy does."""
    assert_same_as_record_by_record(json.dumps(rows).encode(), metadata)


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=6),
                  elements=st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                                     st.integers(-(2**63), 2**63 - 1))),
       st.sampled_from([None, "instances", "data"]), st.sampled_from(["", " ", "\n\t "]))
def test_flat_numeric_records_are_read_into_c_doubles(array, key, space):
    """Flat records (and flat lists of numbers) take simdjson's reader, and it makes the
    very array orjson's path makes; it is not left for orjson."""
    listed = array.tolist()
    text = json.dumps(listed if key is None else {key: listed}, separators=("," + space, ":" + space)).encode()
    opening = text.index(b"[")
    got = jsondoc.c_doubles(text, opening, key)
    assert got is not None, text[:80]
    parsed = orjson.loads(text)
    expected = jsondoc.float64_records(parsed if key is None else parsed[key])
    assert got.dtype == np.float64 and got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("text", [
    b"[[18446744073709551616, 1]]",  # beyond 64 bits: orjson reads it as a float, simdjson stops
    b"[[1, [2]], [3, 4]]",
    b"[[1, 2], [3]]",
    b"[[1, 2], 3]",
    b"[[[1, 2]], [[3, 4]]]",  # records of more than one dimension: orjson's path
    b"[[]]",
    b"[]",
    b"[[1, null]]",
])
def test_c_doubles_leaves_other_records_to_orjson(text):
    assert jsondoc.c_doubles(text, 0, None) is None


def test_c_doubles_arrays_outlive_the_threads_next_parse():
    """Each thread reuses one simdjson parser: an array taken from one body must not
    change when the same parser reads the next body, a refused one, or a body too big
    to keep the parser's buffers for (which gets a parser of its own)."""
    first = jsondoc.c_doubles(b"[[1.5, 2.5], [3.5, 4.5]]", 0, None)
    kept = first.copy()
    assert jsondoc.c_doubles(b"[[9, 9, 9]]", 0, None).tolist() == [[9.0, 9.0, 9.0]]
    assert jsondoc.c_doubles(b'[[1, "x"]]', 0, None) is None
    assert jsondoc.c_doubles(b"[[1, 2], [3", 0, None) is None
    assert jsondoc.thread_parser(10) is jsondoc.thread_parser(10)
    big = b"[" + b",".join([b"[0.25, 0.5]"] * (jsondoc.PARSER_REUSE_MAX_BYTES // 10)) + b"]"
    assert jsondoc.thread_parser(len(big)) is not jsondoc.thread_parser(10)
    assert jsondoc.c_doubles(big, 0, None).shape == (jsondoc.PARSER_REUSE_MAX_BYTES // 10, 2)
    assert np.array_equal(first, kept)
    assert jsondoc.c_doubles(b"[[7, 8]]", 0, None).tolist() == [[7.0, 8.0]]


@pytest.mark.parametrize("body, taken", [
    (b'{"instances": [[1, 2], [3, 4]]}', True),
    (b"[1, 2, 3]", True),
    (b'{"data": [[1, 2]], "other": 1}', False),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}', False),
    (b'[[1, "2"]]', False),
    (b"[[1, 2], [3]]", False),
    (b'{"instances": [[1, 2]]', False),
])
def test_c_records_takes_flat_numeric_records_alone(body, taken):
    """What the JSON protocol reads on the event loop: flat numeric records under one
    key (or bare), exactly as parse_document gives them; every other body is left to
    parse_document on a codec thread, which then does not run the C reader again."""
    found = records.c_records(body)
    assert (found is not None) == taken
    if taken:
        expected = records.parse_document(body)
        got, want = (found, expected) if isinstance(found, np.ndarray) else (found["instances"], expected["instances"])
        assert np.array_equal(got, want)
    else:
        try:
            expected = records.parse_document(body)
        except BadRequest:
            with pytest.raises(BadRequest):
                records.parse_document(body, c_tried=True)
        else:
            again = records.parse_document(body, c_tried=True)
            assert type(again) is type(expected) and repr(again) == repr(expected)


def test_c_records_leaves_a_sliced_body_to_the_sliced_reader():
    body = b"[" + b",".join([b"[0.125, 1]"] * (records.SLICED_JSON_MIN_BYTES // 9)) + b"]"
    assert records.c_records(body) is None
    assert records.parse_document(body).shape == (records.SLICED_JSON_MIN_BYTES // 9, 2)


def test_c_doubles_parser_is_one_per_os_thread_in_a_gevent_patched_worker():
    """The worker runs under gevent's monkey patching, where threading.local is local to
    a greenlet: a parser a greenlet would keep one (and its buffers) per connection. The
    loop's greenlets must share one parser, and a real thread (a codec thread) have its
    own. Run in a child, so this process stays unpatched."""
    import subprocess
    import sys
    from pathlib import Path

    script = """
from gevent import monkey
monkey.patch_all(subprocess=False, os=False, signal=False)
import gevent, threading
from gevent.threadpool import ThreadPool
from smserve.codecs.records import jsondoc

a, b = gevent.spawn(jsondoc.thread_parser, 10), gevent.spawn(jsondoc.thread_parser, 10)
gevent.joinall([a, b])
pool = ThreadPool(1)
other = pool.apply(jsondoc.thread_parser, (10,))
again = pool.apply(jsondoc.thread_parser, (10,))
print(a.value is b.value, other is not a.value, other is again)
"""
    container = Path(jsondoc.__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True,
                         cwd=container, timeout=60)
    assert out.stdout.split() == ["True", "True", "True"], out.stdout + out.stderr


def test_a_bad_value_in_a_sample_sent_as_several_csv_lines_names_its_line():
    """Two CSV lines make one [2, 3] sample (reshaped to a batch of one): the error names
    the line that holds the value, as for any CSV body."""
    metadata = ModelMetadata(name="m", max_batch_size=8, inputs=(TensorSpec("x", "UINT8", (2, 3)),))
    with pytest.raises(BadRequest, match=r"^input 'x': a value is out of range for UINT8 in record 2: 300$"):
        decode_inputs(b"1,2,3\n4,5,300\n", "text/csv", metadata)
    metadata = ModelMetadata(name="m", max_batch_size=8, inputs=(TensorSpec("x", "FP32", (2, 3)),))
    with pytest.raises(BadRequest, match=r"out of range for FP32 in record 2: 1e\+39$"):
        decode_inputs(b"1,2,3\n4,5,1e39\n", "text/csv", metadata)

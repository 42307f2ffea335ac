"""The simple content types, as pure functions."""

import io
import json
import math

import numpy as np
import pytest

from smserve import simple
from smserve.errors import BadRequest, NotAcceptable
from smserve.metadata import ModelMetadata, TensorSpec

DIGITS = ModelMetadata(name="d", max_batch_size=8, inputs=(TensorSpec("pixels", "FP32", (4,)),),
                       outputs=(TensorSpec("p", "FP32", (2,)),))
IMAGES = ModelMetadata(name="i", max_batch_size=8, inputs=(TensorSpec("image", "UINT8", (2, 2)),))
TWO = ModelMetadata(name="t", max_batch_size=8, inputs=(TensorSpec("a", "FP32", (2,)), TensorSpec("b", "INT64", (1,))))


def decode(body, content_type, metadata=DIGITS):
    return simple.decode(body, content_type, metadata)


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
    out = simple.decode(b"1,2,3,4\r\n5,6,7,8\r\n\r\n", "text/csv", IMAGES)["image"]
    assert out.dtype == np.uint8 and out.shape == (2, 2, 2)


def test_fractional_values_for_an_integer_input_are_refused():
    with pytest.raises(BadRequest, match="UINT8"):
        simple.decode(b"1,2,3,4.5\n", "text/csv", IMAGES)


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
    out = simple.decode(b'{"inputs": {"a": [[1, 2]], "b": [[3]]}}', "application/json", TWO)
    assert out["a"].dtype == np.float32 and out["b"].dtype == np.int64
    out = simple.decode(b'{"instances": [{"a": [1, 2], "b": [3]}, {"a": [4, 5], "b": [6]}]}', "application/json", TWO)
    assert out["a"].shape == (2, 2) and out["b"].shape == (2, 1)
    with pytest.raises(BadRequest, match="missing input 'b'"):
        simple.decode(b'{"inputs": {"a": [[1, 2]]}}', "application/json", TWO)


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
])
def test_non_numbers_and_non_finite_numbers_are_400(body, content_type, words):
    with pytest.raises(BadRequest) as info:
        decode(body, content_type)
    assert info.value.status == 400 and words in info.value.message


def test_several_inputs_name_the_input_and_record():
    with pytest.raises(BadRequest, match=r"input 'b', record 2: null is not a number"):
        simple.decode(b'{"instances": [{"a": [1, 2], "b": [3]}, {"a": [4, 5], "b": null}]}', "application/json", TWO)


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

"""The simple content types, as pure functions."""

import io
import json

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

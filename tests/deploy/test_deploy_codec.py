"""deploy.codec alone: the parts the moto and real-server tests do not pin down."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from deploy import codec


@pytest.mark.parametrize(
    ("content_type", "size"),
    [
        ("application/vnd.sagemaker-triton.binary+json;json-header-size=146", 146),
        ("application/vnd.sagemaker-triton.binary+json; json-header-size=0", 0),
        ("application/json", None),
        ("text/csv; charset=utf-8", None),
    ],
)
def test_header_size(content_type, size):
    assert codec.header_size(content_type) == size


def test_binary_type_without_a_size_is_an_error():
    with pytest.raises(codec.CodecError, match="lacks json-header-size=N"):
        codec.header_size("application/vnd.sagemaker-triton.binary+json")


def test_v2_request_layout_by_hand():
    array = np.arange(6, dtype=np.int64).reshape(2, 3)
    body, content_type = codec.encode(array, codec.V2_BINARY, input_name="ids")
    size = codec.header_size(content_type)
    header = json.loads(body[:size])
    assert header["inputs"] == [{"name": "ids", "shape": [2, 3], "datatype": "INT64", "parameters": {"binary_data_size": 48}}]
    assert body[size:] == array.astype("<i8").tobytes()


def test_v2_response_in_json_is_read_as_tensors():
    body = json.dumps({"model_name": "m", "outputs": [{"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [0.25, 4.0]}]}).encode()
    decoded = codec.decode(body, "application/json")
    assert list(decoded) == ["y"]
    np.testing.assert_array_equal(decoded["y"], np.array([[0.25, 4.0]], dtype=np.float32))


def test_npy_round_trip_and_csv_of_one_record():
    array = np.array([1.5, -2.0, 3.25], dtype=np.float32)
    body, content_type = codec.encode(array, codec.NPY)
    np.testing.assert_array_equal(np.load(io.BytesIO(body), allow_pickle=False), array)
    body, _ = codec.encode(array.astype(np.float64), codec.CSV)
    assert body == b"1.5,-2.0,3.25\n"  # a 1-D array is one record
    np.testing.assert_array_equal(codec.decode(body, "text/csv"), [[1.5, -2.0, 3.25]])


def test_unsupported_and_unreadable():
    with pytest.raises(codec.CodecError, match="unsupported content type 'image/png'"):
        codec.encode(np.zeros(1), "image/png")
    with pytest.raises(codec.CodecError, match="cannot read the application/json response"):
        codec.decode(b"{not json", "application/json")
    with pytest.raises(codec.CodecError, match="text/csv carries 2-D arrays"):
        codec.encode(np.zeros((2, 2, 2)), codec.CSV)

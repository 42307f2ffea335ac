"""predict.sh --v2-binary's packing (local_test/v2_request.py, standard library only)
against numpy's and torch's own bytes for every datatype, and its shapes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from local_test import v2_request

NUMPY = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
         "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
         "FP32": np.float32, "FP64": np.float64}
CELLS = {"BOOL": ["1", "0", "true", "False"], "UINT64": ["0", str(2**64 - 1)], "INT64": [str(-2**63), str(2**53 + 1)],
         "INT8": ["-128", "127"], "FP16": ["0.1", "-65504", "1e-7"], "FP32": ["0.1", "3.4e38", "-0"],
         "FP64": ["0.1", "1e308"]}


@pytest.mark.parametrize("datatype", sorted(NUMPY))
def test_values_are_packed_as_numpy_lays_them_out(datatype):
    cells = CELLS.get(datatype, ["0", "1", "7"])
    values = [c.lower() == "true" or c == "1" for c in cells] if datatype == "BOOL" else [
        int(c) if datatype[0] in "IU" else float(c) for c in cells]
    expected = np.array(values, dtype=NUMPY[datatype]).astype("<" + np.dtype(NUMPY[datatype]).str[1:]).tobytes()
    assert v2_request.pack(datatype, cells, "x") == expected
    assert v2_request.unpack(datatype, expected) == np.frombuffer(expected, NUMPY[datatype]).tolist()


def test_bf16_rounds_as_torch_does():
    cells = ["0.1", "1.00390625", "1.01171875", "-3.3e38", "1e-40", "inf"]
    expected = torch.tensor([float(c) for c in cells], dtype=torch.bfloat16).view(torch.int16).numpy().tobytes()
    assert v2_request.pack("BF16", cells, "x") == expected
    assert v2_request.unpack("BF16", expected) == torch.frombuffer(bytearray(expected), dtype=torch.bfloat16).float().tolist()


def test_bytes_are_length_prefixed():
    packed = v2_request.pack("BYTES", ["ab", "", "é"], "x")
    assert packed == b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00" + b"\x02\x00\x00\x00\xc3\xa9"
    assert v2_request.unpack("BYTES", packed) == ["ab", "", "é"]


@pytest.mark.parametrize("cells, datatype, message", [
    (["1.5"], "INT32", "'1.5' is not a INT32 value"),
    (["300"], "UINT8", "does not fit UINT8"),
    (["yes"], "BOOL", "'yes' is not a BOOL value"),
    (["x"], "FP32", "'x' is not a FP32 value"),
])
def test_a_value_the_datatype_cannot_hold_is_named(cells, datatype, message):
    with pytest.raises(v2_request.Refused, match=message):
        v2_request.pack(datatype, cells, "x")


@pytest.mark.parametrize("declared, rows, columns, shape", [
    ([-1, 64], 3, 64, [3, 64]),        # a batching model: one row a sample
    ([-1, 8, 8], 2, 64, [2, 8, 8]),    # samples of a higher rank, one row each
    ([-1, -1], 2, 5, [2, 5]),          # a variable dimension deduced from the values
    ([3, 4], 3, 4, [3, 4]),            # no batch dimension: the CSV is the tensor
    ([-1], 1, 7, [7]),                 # "any shape": one row is a vector...
    ([-1], 2, 7, [2, 7]),              # ...several rows a matrix
])
def test_shapes(declared, rows, columns, shape):
    assert v2_request.shape_for(declared, rows, columns, "x") == shape


@pytest.mark.parametrize("declared", [[-1, 64], [3, 5], [-1, -1, -1]])
def test_values_that_do_not_fit_the_shape_are_refused(declared):
    with pytest.raises(v2_request.Refused, match="do not fit its shape"):
        v2_request.shape_for(declared, 3, 4, "x")


def test_a_binary_answer_is_decoded_into_json_data():
    probs = np.arange(6, dtype=np.float32).reshape(2, 3) / 8
    ids = np.array([[2**60], [-1]], dtype=np.int64)
    header = json.dumps({"model_name": "m", "outputs": [
        {"name": "p", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": probs.nbytes}},
        {"name": "j", "datatype": "INT64", "shape": [2], "data": [1, 2]},
        {"name": "i", "datatype": "INT64", "shape": [2, 1], "parameters": {"binary_data_size": ids.nbytes}},
    ]}).encode()
    answer = v2_request.decode_answer(header + probs.tobytes() + ids.tobytes(),
                                      f"{v2_request.SAGEMAKER_BINARY}{len(header)}")
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert outputs["p"]["data"] == probs.tolist() and "parameters" not in outputs["p"]
    assert outputs["j"]["data"] == [1, 2]
    assert outputs["i"]["data"] == ids.tolist()

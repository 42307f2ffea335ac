"""Every malformed v2 request is a BadRequest (400) naming what broke, never a 500.

Wording follows Triton (PROTOCOL.md) where Triton has a message; the tensor's name is
part of each message about a tensor.
"""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest
import tritonclient.http as httpclient
from hypothesis import given, settings
from hypothesis import strategies as st

from smserve.codecs import v2
from smserve.errors import BadRequest, ServerError
from smserve.core.metadata import ModelMetadata, TensorSpec

Client = httpclient.InferenceServerClient

MODEL = ModelMetadata(
    name="m",
    max_batch_size=8,
    inputs=(
        TensorSpec("pix", "FP32", (4,)),
        TensorSpec("ids", "INT64", (-1,)),
    ),
    outputs=(
        TensorSpec("probs", "FP32", (3,), labels=("a", "b", "c")),
        TensorSpec("half", "FP16", (3,)),
        TensorSpec("flag", "BOOL", (3,)),
    ),
)


def pix(**overrides) -> dict:
    tensor = {"name": "pix", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}
    tensor.update(overrides)
    return tensor


def ids(**overrides) -> dict:
    tensor = {"name": "ids", "shape": [1, 2], "datatype": "INT64", "data": [7, 8]}
    tensor.update(overrides)
    return tensor


def doc(inputs=None, **fields) -> bytes:
    body = {"inputs": [pix(), ids()] if inputs is None else inputs}
    body.update(fields)
    return json.dumps(body).encode()


def rejects(body: bytes, header_length: int | None = None, metadata: ModelMetadata = MODEL) -> str:
    with pytest.raises(BadRequest) as info:
        v2.decode_request(body, header_length, metadata)
    assert info.value.status == 400
    return info.value.message


def binary_body(header: dict, *blobs: bytes) -> tuple[bytes, int]:
    head = json.dumps(header).encode()
    return head + b"".join(blobs), len(head)


def test_the_valid_baseline_decodes():
    """The documents below differ from this one in one field each."""
    decoded = v2.decode_request(doc(), None, MODEL)
    assert decoded.inputs["pix"].shape == (1, 4) and decoded.inputs["ids"].tolist() == [[7, 8]]


# --------------------------------------------------------------------------------------
# Header lengths

PREFIX = v2.SAGEMAKER_BINARY_CONTENT_TYPE


@pytest.mark.parametrize(
    "content_type, message",
    [
        ("text/plain;" + PREFIX + "5", f"expect MIME type for binary data starts with '{PREFIX}', got: text/plain;{PREFIX}5"),
        (PREFIX + "abc", "Unable to parse inference header size, got: abc"),
        (PREFIX, "Unable to parse inference header size, got: "),
        (PREFIX + "99999999999", "Unable to parse inference header size, value is out of range, got: 99999999999"),
        (PREFIX + "-1", "inference header size should be in range (0, 50), got: -1"),
        (PREFIX + "51", "inference header size should be in range (0, 50), got: 51"),
    ],
)
def test_sagemaker_header_length_errors(content_type, message):
    with pytest.raises(BadRequest) as info:
        v2.sagemaker_header_length(content_type, 50)
    assert info.value.message == message


@pytest.mark.parametrize(
    "value, message",
    [
        ("x1", "Unable to parse Inference-Header-Content-Length, got: x1"),
        ("4294967296", "Unable to parse Inference-Header-Content-Length, value is out of range "
                       "[ -2147483648, 2147483647 ], got: 4294967296"),
        ("-3", "inference header size should be in range (0, 50), got: -3"),
        ("60", "inference header size should be in range (0, 50), got: 60"),
    ],
)
def test_inference_header_content_length_errors(value, message):
    with pytest.raises(BadRequest) as info:
        v2.header_length_from_header(value, 50)
    assert info.value.message == message


def test_header_length_past_the_body():
    assert rejects(b"{}", 10) == "unexpected size for request JSON, expecting 8 more bytes"


# --------------------------------------------------------------------------------------
# The JSON document


def test_invalid_json():
    assert rejects(b'{"inputs": [').startswith("failed to parse the request JSON buffer:")


def test_binary_appended_without_header_length_explains_itself():
    body, _ = binary_body({"inputs": [pix(data=None)]}, b"\x00" * 16)
    message = rejects(body, None)
    assert "Extra data" in message and "Inference-Header-Content-Length" in message


def test_invalid_utf8_json():
    assert "invalid UTF-8" in rejects(b'{"inputs": "\xff"}')


def test_document_nested_beyond_python_recursion():
    assert "nesting depth" in rejects(b"[" * 100_000 + b"]" * 100_000)


@pytest.mark.parametrize("body", [b"[1, 2]", b'"inputs"', b"null"])
def test_document_not_an_object(body):
    assert "must be a JSON object" in rejects(body)


@pytest.mark.parametrize("value", [7, None, ["a"]])
def test_id_must_be_a_string(value):
    assert rejects(doc(id=value)) == "Unable to parse 'id': attempt to access JSON non-string as string"


def test_reserved_triton_parameter():
    assert rejects(doc(parameters={"triton_enable_empty_final_response": True})) == (
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
    )


def test_binary_data_output_must_be_bool():
    assert rejects(doc(parameters={"binary_data_output": "yes"})) == "Unable to parse 'binary_data_output'"


@pytest.mark.parametrize("value", [[1], {"a": 1}, None])
def test_custom_parameter_of_invalid_type(value):
    assert rejects(doc(parameters={"mine": value})) == (
        "parameter 'mine' has invalid type. It should be either 'int', 'bool', or 'string'."
    )


def test_parameters_must_be_an_object():
    assert "parameters" in rejects(doc(parameters=[1]))


def test_inputs_missing():
    assert rejects(b'{"outputs": []}') == (
        "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"
    )


def test_inputs_not_a_list():
    assert rejects(b'{"inputs": {"name": "pix"}}') == "Unable to parse 'inputs': attempt to access JSON non-array as array"


def test_input_not_an_object():
    assert "each input must be a JSON object" in rejects(doc([pix(), 3]))


def test_input_without_name():
    tensor = pix()
    del tensor["name"]
    assert rejects(doc([tensor, ids()])).startswith("Unable to parse 'name'")


# --------------------------------------------------------------------------------------
# Inputs against the model


def test_duplicate_input_names():
    assert rejects(doc([pix(), pix(), ids()])) == "input 'pix' already exists in request"


def test_unknown_input():
    assert rejects(doc([pix(), ids(), pix(name="extra")])) == "unexpected inference input 'extra' for model 'm'"


def test_missing_input():
    message = rejects(doc([pix()]))
    assert message == (
        "expected 2 inputs but got 1 inputs for model 'm'. Got input(s) ['pix'], but missing required input(s) "
        "['ids']. Please provide all required input(s)."
    )


def test_datatype_mismatch():
    assert rejects(doc([pix(datatype="FP64"), ids()])) == (
        "inference input 'pix' data-type is 'FP64', but model 'm' expects 'FP32'"
    )


def test_unknown_datatype():
    assert rejects(doc([pix(datatype="FP8"), ids()])) == (
        "inference input 'pix' data-type is 'FP8', but model 'm' expects 'FP32'"
    )
    # Without a model's inputs to compare with, the name itself is refused.
    assert rejects(doc([pix(datatype="FP8")]), metadata=ModelMetadata()) == "invalid datatype for input pix"


def test_datatype_not_a_string():
    assert "'datatype'" in rejects(doc([pix(datatype=1), ids()])) and "'pix'" in rejects(doc([pix(datatype=1), ids()]))


@pytest.mark.parametrize("shape", [[1, -4], [1, 4.0], [1, True], "1,4", {"a": 1}])
def test_shape_not_unsigned_integers(shape):
    message = rejects(doc([pix(shape=shape), ids()]))
    assert message.startswith("Unable to parse 'shape'") and message.endswith("for input 'pix'")


def test_shape_missing():
    tensor = pix()
    del tensor["shape"]
    assert rejects(doc([tensor, ids()])) == (
        "Unable to parse 'shape': attempt to access non-existing object member 'shape' for input 'pix'"
    )


def test_shape_not_the_models():
    assert rejects(doc([pix(shape=[1, 5], data=[1] * 5), ids()])) == (
        "unexpected shape for input 'pix' for model 'm'. Expected [-1,4], got [1,5]"
    )
    assert rejects(doc([pix(shape=[4], data=[1] * 4), ids()])) == (
        "unexpected shape for input 'pix' for model 'm'. Expected [-1,4], got [4]"
    )


def test_batch_dimension_differs_between_inputs():
    message = rejects(doc([pix(), ids(shape=[2, 1])]))
    assert message.startswith("input 'ids' batch size does not match other inputs for 'm'")


FREE = ModelMetadata(name="free", inputs=(TensorSpec("t", "FP32", (-1, -1, -1)),), outputs=(TensorSpec("y", "FP32", (-1,)),))


def test_element_count_overflow():
    message = rejects(doc([{"name": "t", "shape": [2**40, 2**40, 2**40], "datatype": "FP32", "data": [1]}]), metadata=FREE)
    assert message == (
        "invalid shape for input 't': shape [1099511627776,1099511627776,1099511627776] causes total element count "
        "to exceed maximum size of 9223372036854775807"
    )


def test_element_count_overflow_hidden_behind_a_zero_dimension():
    message = rejects(doc([{"name": "t", "shape": [0, 2**62, 2**62], "datatype": "FP32", "data": []}]), metadata=FREE)
    assert message.startswith("invalid shape for input 't'")


def test_byte_size_overflow():
    message = rejects(doc([{"name": "t", "shape": [2**31, 2**31, 1], "datatype": "FP32", "data": [1]}]), metadata=FREE)
    assert message == (
        "byte size overflow for input 't': element count (4611686018427387904) * data type size (4) exceeds "
        "maximum allowed size (9223372036854775807)"
    )


def test_too_many_dimensions():
    free = ModelMetadata(name="free")
    message = rejects(doc([{"name": "t", "shape": [1] * 65, "datatype": "FP32", "data": [1]}]), metadata=free)
    assert "input 't'" in message and "dimensions" in message


# --------------------------------------------------------------------------------------
# Content fields


def test_input_with_neither_data_nor_binary():
    tensor = pix()
    del tensor["data"]
    assert rejects(doc([tensor, ids()])) == (
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
        "'shared_memory_region' in 'parameters'. But no field is set for input 'pix'"
    )


def test_input_with_data_and_binary():
    body, n = binary_body({"inputs": [pix(parameters={"binary_data_size": 16}), ids()]}, bytes(16))
    assert rejects(body, n) == (
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
        "'shared_memory_region' in 'parameters'. But set 'data' 'binary_data_size' for input 'pix'"
    )


def test_shared_memory_input():
    tensor = pix(parameters={"shared_memory_region": "r"})
    del tensor["data"]
    assert "input 'pix': shared memory is not supported" in rejects(doc([tensor, ids()]))


# --------------------------------------------------------------------------------------
# Binary inputs


def binary_pix(size, *blobs, shape=(1, 4)):
    tensor = pix(shape=list(shape), parameters={"binary_data_size": size})
    del tensor["data"]
    return binary_body({"inputs": [tensor, ids()]}, *blobs)


@pytest.mark.parametrize("size", [-1, 1.5, "16", True])
def test_binary_data_size_not_unsigned(size):
    assert rejects(*binary_pix(size, bytes(16))) == "Unable to parse 'binary_data_size' for input 'pix'"


def test_binary_input_too_few_bytes():
    assert rejects(*binary_pix(16, bytes(10))) == "unexpected size for input 'pix', expecting 6 additional bytes for model 'm'"


def test_binary_input_without_header_length():
    body, _ = binary_pix(16)
    message = rejects(body, None)
    assert "input 'pix' is sent as binary data" in message


def test_binary_input_leftover_bytes():
    assert rejects(*binary_pix(16, bytes(20))) == "unexpected additional input data for model 'm'"


def test_binary_input_size_not_shape_times_datatype():
    assert rejects(*binary_pix(12, bytes(12))) == (
        "input byte size mismatch for input 'pix' for model 'm'. Expected 16, got 12"
    )


def test_huge_shape_small_body_allocates_nothing_large():
    """A shape may claim anything; the bytes decide, before any array exists."""
    tensor = {"name": "t", "shape": [2**20, 2**20, 2**20], "datatype": "FP32", "parameters": {"binary_data_size": 8}}
    body, n = binary_body({"inputs": [tensor]}, bytes(8))
    json_tensor = {"name": "t", "shape": [2**20, 2**20, 2**20], "datatype": "FP32", "data": [1.0, 2.0]}
    bytes_tensor = dict(tensor, datatype="BYTES")
    bytes_body, bytes_n = binary_body({"inputs": [bytes_tensor]}, b"\x00" * 8)
    tracemalloc.start()
    try:
        assert "Expected 4611686018427387904, got 8" in rejects(body, n, FREE)
        assert rejects(doc([json_tensor]), metadata=FREE).startswith("Failed to parse 'data' field")
        free_bytes = ModelMetadata(name="free", inputs=(TensorSpec("t", "BYTES", (-1, -1, -1)),))
        assert "hold at most 2" in rejects(bytes_body, bytes_n, free_bytes)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_bool_bytes_other_than_zero_or_one():
    bools = ModelMetadata(name="b", inputs=(TensorSpec("f", "BOOL", (-1,)),))
    body, n = binary_body({"inputs": [{"name": "f", "shape": [3], "datatype": "BOOL", "parameters": {"binary_data_size": 3}}]},
                          b"\x01\x00\x02")
    assert "BOOL input 'f'" in rejects(body, n, bools)


# --------------------------------------------------------------------------------------
# BYTES inputs

TEXT = ModelMetadata(name="t", inputs=(TensorSpec("s", "BYTES", (-1,)),), outputs=(TensorSpec("y", "FP32", (-1,)),))


def text_body(count, blob):
    return binary_body(
        {"inputs": [{"name": "s", "shape": [count], "datatype": "BYTES", "parameters": {"binary_data_size": len(blob)}}]},
        blob,
    )


def test_bytes_length_prefix_runs_past_the_blob():
    blob = b"\x02\x00\x00\x00hi" + b"\x09\x00\x00\x00abc"
    assert rejects(*text_body(2, blob), metadata=TEXT) == (
        "element 1 of inference input 's' for model 't' declares 9 bytes but only 3 bytes remain"
    )


def test_bytes_incomplete_length_prefix():
    blob = b"\x02\x00\x00\x00hi" + b"\x01\x00"
    message = rejects(*text_body(2, blob), metadata=TEXT)
    assert message.startswith("incomplete string length indicator for inference input 's' for model 't'")


def test_bytes_fewer_elements_than_shape():
    blob = b"\x02\x00\x00\x00hi" + b"\x00\x00\x00\x00"
    assert rejects(*text_body(3, blob[:10]), metadata=TEXT) == (
        "expected 3 string elements for inference input 's' for model 't', but its 10 bytes hold at most 2"
    )
    assert rejects(*text_body(2, blob[:6] + b"\x00" * 2), metadata=TEXT).startswith("incomplete string length")
    assert rejects(*text_body(3, b"\x00" * 4 + b"\x04\x00\x00\x00abcd"), metadata=TEXT) == (
        "expected 3 string elements for inference input 's' for model 't', got 2"
    )


def test_bytes_more_elements_than_shape():
    blob = b"\x01\x00\x00\x00a" * 3
    assert rejects(*text_body(1, blob), metadata=TEXT) == (
        "unexpected number of string elements 3 for inference input 's' for model 't', expecting 1"
    )


# --------------------------------------------------------------------------------------
# JSON data


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_json_input(datatype):
    halves = ModelMetadata(name="h", inputs=(TensorSpec("h", datatype, (-1,)),))
    body = doc([{"name": "h", "shape": [2], "datatype": datatype, "data": [1.0, 2.0]}])
    assert rejects(body, metadata=halves) == (
        f"receiving {datatype} data via JSON is not supported. Please use the binary data format for input h"
    )


def test_fp16_json_input_from_tritonclient():
    """tritonclient sends FP16 as JSON numbers; the server is the one to refuse."""
    halves = ModelMetadata(name="h", inputs=(TensorSpec("h", "FP16", (-1,)),))
    tensor = httpclient.InferInput("h", [2], "FP16")
    tensor.set_data_from_numpy(np.ones(2, np.float16), binary_data=False)
    body, json_size = Client.generate_request_body([tensor])
    assert "receiving FP16 data via JSON is not supported" in rejects(body, json_size, halves)


def test_json_data_too_many_elements():
    assert rejects(doc([pix(data=[1, 2, 3, 4, 5]), ids()])) == (
        "Unable to parse 'data': Shape does not match true shape of 'data' field for input 'pix'"
    )


def test_json_data_too_few_elements():
    assert rejects(doc([pix(data=[1, 2, 3]), ids()])) == (
        "Failed to parse 'data' field: shape does not match true shape for input 'pix'"
    )


def test_json_data_nested_deeper_than_100():
    data = [1.0]
    for _ in range(100):
        data = [data]
    body = doc([{"name": "t", "shape": [1, 1, 1], "datatype": "FP32", "data": data}])
    assert rejects(body, metadata=FREE) == "JSON nesting depth exceeds maximum allowed limit (100) for input 't'"


def test_json_data_not_an_array():
    assert rejects(doc([pix(data=5), ids()])) == (
        "Unable to parse 'data': attempt to access JSON non-array as array for input 'pix'"
    )


@pytest.mark.parametrize(
    "name, datatype, data, needle",
    [
        ("b", "BOOL", [1, 0], "non-boolean as boolean"),
        ("i", "INT32", [1.0, 2], "non-signed-integer as signed-integer"),
        ("i", "INT32", [True, 2], "non-signed-integer as signed-integer"),
        ("u", "UINT16", [-1, 2], "non-unsigned-integer as unsigned-integer"),
        ("u", "UINT8", [256, 2], "out of range for UINT8"),
        ("i", "INT64", [2**63, 2], "out of range for INT64"),
        ("f", "FP32", ["1.0", 2], "non-number as double"),
        ("f", "FP64", [False, 2], "non-number as double"),
        ("s", "BYTES", [1, "a"], "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
    ],
)
def test_json_data_of_the_wrong_type(name, datatype, data, needle):
    typed = ModelMetadata(name="typed", inputs=(TensorSpec(name, datatype, (-1,)),))
    message = rejects(doc([{"name": name, "shape": [2], "datatype": datatype, "data": data}]), metadata=typed)
    assert needle in message and message.endswith(f"for input '{name}'")


@pytest.mark.parametrize(
    "datatype, data, needle",
    [
        ("FP64", [10**400, 2], "number is infinity"),  # beyond float64 (and Python's 4,300-digit int limit)
        ("INT64", ["DIGITS", 2], "number is infinity"),
        ("FP32", [float("nan"), 2], "unexpected character"),  # NaN is not JSON
        ("FP32", [float("inf"), 2], "unexpected character"),
        ("BYTES", ["\ud800", "a"], "no low surrogate"),  # not Unicode text
    ],
)
def test_json_data_that_is_not_strict_json(datatype, data, needle):
    typed = ModelMetadata(name="typed", inputs=(TensorSpec("x", datatype, (-1,)),))
    body = doc([{"name": "x", "shape": [2], "datatype": datatype, "data": data}])
    body = body.replace(b'"DIGITS"', b"1" * 5000)  # json.dumps cannot write an int this long
    message = rejects(body, metadata=typed)
    assert message.startswith("failed to parse the request JSON buffer:") and needle in message


@pytest.mark.parametrize(
    "content_type",
    [
        PREFIX + "1" * 5000,
        PREFIX + "12;" + PREFIX + "15",  # json-header-size twice
        PREFIX + "12,application/json",  # two Content-Type headers joined by ','
        PREFIX + "12," + PREFIX + "15",
    ],
)
def test_sagemaker_header_length_huge_or_ambiguous(content_type):
    with pytest.raises(BadRequest) as info:
        v2.sagemaker_header_length(content_type, 50)
    assert info.value.status == 400 and len(info.value.message) < 300
    assert ("ambiguous" in info.value.message) == ("," in content_type or content_type.count("size=") > 1)


@pytest.mark.parametrize("value", ["9" * 5000, "-" + "9" * 5000, "12,15", "12,12", "12, 15"])
def test_inference_header_content_length_huge_or_ambiguous(value):
    with pytest.raises(BadRequest) as info:
        v2.header_length_from_header(value, 50)
    message = info.value.message
    assert info.value.status == 400 and len(message) < 300
    if "," in value:
        assert message.startswith("ambiguous Inference-Header-Content-Length")
    else:
        assert "value is out of range" in message


def test_header_length_with_many_leading_zeros_is_its_value():
    assert v2.header_length_from_header("0" * 5000 + "12", 50) == 12
    assert v2.sagemaker_header_length(PREFIX + "0" * 5000 + "12", 50) == 12


def test_json_outputs_hold_no_nan_or_infinity():
    """NaN and infinities are not JSON: JSON outputs write null; binary carries them."""
    import orjson

    values = np.array([[np.nan, np.inf, -np.inf, 0.1]], dtype=np.float32)
    metadata = ModelMetadata(name="n", inputs=(TensorSpec("x", "FP32", (-1, 4)),),
                             outputs=(TensorSpec("y", "FP32", (-1, 4)),))
    request = v2.decode_request(doc([{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]),
                                None, metadata)
    body, header_length = v2.encode_response(v2.build_response(request, {"y": values}, metadata))
    assert header_length is None
    assert orjson.loads(body)["outputs"][0]["data"] == [None, None, None, 0.1]
    request.binary_output = True
    body, header_length = v2.encode_response(v2.build_response(request, {"y": values}, metadata))
    np.testing.assert_array_equal(np.frombuffer(body[header_length:], dtype="<f4"), values.reshape(-1))


# --------------------------------------------------------------------------------------
# Requested outputs


def test_duplicate_output_names():
    assert rejects(doc(outputs=[{"name": "probs"}, {"name": "probs"}])) == "output 'probs' already exists in request"


def test_unknown_output():
    assert rejects(doc(outputs=[{"name": "nope"}])) == "unexpected inference output 'nope' for model 'm'"


def test_output_binary_data_not_bool():
    assert rejects(doc(outputs=[{"name": "probs", "parameters": {"binary_data": 1}}])) == (
        "Unable to parse 'binary_data' for output 'probs'"
    )


@pytest.mark.parametrize("classes", [-1, 2.5, "3", True])
def test_output_classification_not_unsigned(classes):
    assert rejects(doc(outputs=[{"name": "probs", "parameters": {"classification": classes}}])) == (
        "Unable to set 'classification' for output 'probs'"
    )


@pytest.mark.parametrize("outputs", [{"name": "probs"}, [{"parameters": {}}], ["probs"]])
def test_outputs_malformed(outputs):
    assert "'outputs'" in rejects(doc(outputs=outputs))


def test_shared_memory_output():
    assert "output 'probs': shared memory" in rejects(doc(outputs=[{"name": "probs", "parameters": {"shared_memory_region": "r"}}]))


# --------------------------------------------------------------------------------------
# Responses

RESULTS = {
    "probs": np.array([[0.2, 0.5, 0.3]], np.float32),
    "half": np.ones((1, 3), np.float16),
    "flag": np.array([[True, False, True]]),
}


def response_for(outputs=None, parameters=None):
    fields = {}
    if outputs is not None:
        fields["outputs"] = outputs
    if parameters is not None:
        fields["parameters"] = parameters
    request = v2.decode_request(doc(**fields), None, MODEL)
    return v2.build_response(request, RESULTS, MODEL)


def test_fp16_output_as_json():
    with pytest.raises(BadRequest) as info:
        response_for()  # every output, JSON by default, and one is FP16
    assert info.value.message == (
        "sending FP16 data via JSON is not supported. Please use the binary data format for output 'half'"
    )
    assert response_for(parameters={"binary_data_output": True}).outputs[1].binary


def test_bf16_output_as_json():
    bf = ModelMetadata(name="bf", inputs=(TensorSpec("x", "FP32", (-1,)),), outputs=(TensorSpec("y", "BF16", (-1,)),))
    request = v2.decode_request(b'{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}', None, bf)
    with pytest.raises(BadRequest) as info:
        v2.build_response(request, {"y": np.ones(1, np.float32)}, bf)
    assert "sending BF16 data via JSON is not supported" in info.value.message and "'y'" in info.value.message


@pytest.mark.parametrize("name, datatype", [("half", "FP16"), ("flag", "BOOL")])
def test_classification_of_unsupported_type(name, datatype):
    with pytest.raises(BadRequest) as info:
        response_for(outputs=[{"name": name, "parameters": {"classification": 2, "binary_data": True}}])
    assert info.value.message == f"class result not available for output '{name}' due to unsupported type '{datatype}'"


def test_classification_too_large():
    big = ModelMetadata(name="big", inputs=(TensorSpec("x", "FP32", (-1,)),), outputs=(TensorSpec("y", "FP32", (-1,)),))
    body = b'{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}],"outputs":[{"name":"y","parameters":{"classification":1}}]}'
    request = v2.decode_request(body, None, big)
    with pytest.raises(BadRequest) as info:
        v2.build_response(request, {"y": np.zeros(1_000_001, np.float32)}, big)
    assert info.value.message == "classification output tensor too large for output 'y'"


def test_non_utf8_bytes_output_as_json():
    text = ModelMetadata(name="t", inputs=(TensorSpec("x", "FP32", (-1,)),), outputs=(TensorSpec("y", "BYTES", (-1,)),))
    request = v2.decode_request(b'{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}', None, text)
    with pytest.raises(BadRequest) as info:
        v2.build_response(request, {"y": np.array([b"\xff"], dtype=object)}, text)
    assert "output 'y'" in info.value.message and "binary_data" in info.value.message


def test_missing_model_output_is_a_server_fault():
    request = v2.decode_request(doc(outputs=[{"name": "probs"}]), None, MODEL)
    with pytest.raises(ServerError) as info:
        v2.build_response(request, {}, MODEL)
    assert info.value.status == 500 and "'probs'" in info.value.message


# --------------------------------------------------------------------------------------
# Raw binary requests


def test_raw_request_needs_one_input():
    assert rejects(bytes(16), 0) == (
        "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'm' model configuration"
    )


def test_raw_request_with_two_variable_dimensions():
    two = ModelMetadata(name="two", inputs=(TensorSpec("x", "FP32", (-1, -1)),))
    assert rejects(bytes(16), 0, two) == (
        "The shape of the raw input 'x' can not be deduced because there are more than one variable-sized dimension"
    )


def test_raw_bytes_request_needs_shape_one():
    text = ModelMetadata(name="t", inputs=(TensorSpec("s", "BYTES", (2,)),))
    assert rejects(b"hello", 0, text) == "For BYTE datatype raw input 's', the model must have input shape [1]"


def test_raw_request_byte_count_not_a_multiple():
    var = ModelMetadata(name="v", inputs=(TensorSpec("x", "FP32", (3, -1)),))
    assert rejects(bytes(16), 0, var) == (
        "input byte size mismatch for input 'x' for model 'v'. Expected a multiple of 12, got 16"
    )


def test_raw_request_byte_count_not_the_fixed_shape():
    digits = ModelMetadata(name="digits", max_batch_size=256, inputs=(TensorSpec("pixels", "FP32", (64,)),))
    assert rejects(bytes(255), 0, digits) == (
        "input byte size mismatch for input 'pixels' for model 'digits'. Expected 256, got 255"
    )


# --------------------------------------------------------------------------------------
# Fuzzing: whatever arrives, the answer is a decoded request or a BadRequest

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)


def decodes_or_refuses(body: bytes, header_length: int | None, metadata: ModelMetadata = MODEL) -> None:
    """A refusal is a 400 with a message; a request that decodes holds what the model
    declares and comes back unchanged when sent again as binary tensors."""
    try:
        request = v2.decode_request(body, header_length, metadata)
    except BadRequest as refused:
        assert refused.status == 400 and refused.message.strip()
        return
    declared = {spec.name: spec for spec in metadata.inputs}
    for name, array in request.inputs.items():
        if declared:
            assert name in declared and request.datatypes[name] == declared[name].datatype
        # Every element costs the body at least a byte: no shape outgrows what was sent.
        assert array.size <= max(len(body), 1)  # (a raw BYTES body is one element, empty or not)
    again = v2.decode_request(*resent(request), metadata)
    assert list(again.inputs) == list(request.inputs) and again.datatypes == request.datatypes
    for name, array in request.inputs.items():
        same = again.inputs[name]
        assert same.shape == array.shape and same.dtype == array.dtype
        if array.dtype.kind == "f":
            assert np.array_equal(same, array, equal_nan=True)
        else:
            assert same.tolist() == array.tolist()


def resent(request) -> tuple[bytes, int]:
    """The decoded request's inputs as one binary v2 request: (body, JSON header length)."""
    blobs = [v2.to_binary(request.inputs[name], request.datatypes[name]) for name in request.inputs]
    header = {"inputs": [{"name": name, "shape": list(request.inputs[name].shape), "datatype": request.datatypes[name],
                          "parameters": {"binary_data_size": blob.nbytes}}
                         for name, blob in zip(request.inputs, blobs)]}
    return binary_body(header, *(blob.tobytes() for blob in blobs))


@settings(max_examples=300, deadline=None)
@given(
    field=st.sampled_from(["name", "shape", "datatype", "data", "parameters"]),
    value=json_values,
    which=st.sampled_from(["pix", "ids"]),
)
def test_any_input_field_value(field, value, which):
    tensors = {"pix": pix(), "ids": ids()}
    tensors[which][field] = value
    decodes_or_refuses(doc(list(tensors.values())), None)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(["id", "parameters", "inputs", "outputs"]), value=json_values)
def test_any_request_field_value(field, value):
    decodes_or_refuses(doc(**{field: value}), None)


@settings(max_examples=300, deadline=None)
@given(
    output_parameters=st.dictionaries(st.sampled_from(["binary_data", "classification", "x"]), json_values, max_size=3),
    binary_data_size=json_values | st.integers(0, 64),
)
def test_any_binary_and_output_parameters(output_parameters, binary_data_size):
    tensor = pix(parameters={"binary_data_size": binary_data_size})
    del tensor["data"]
    body, n = binary_body(
        {"inputs": [tensor, ids()], "outputs": [{"name": "probs", "parameters": output_parameters}]}, bytes(16)
    )
    decodes_or_refuses(body, n)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_damaged_binary_bodies(data):
    """Valid binary requests, then cut, extended or overwritten anywhere."""
    blob = b"\x02\x00\x00\x00hi\x00\x00\x00\x00"
    body, n = binary_body(
        {"inputs": [{"name": "s", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": len(blob)}}]},
        blob,
    )
    body = bytearray(body)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(body) - 1))
        body[at] = data.draw(st.integers(0, 255))
    body = bytes(body[: data.draw(st.integers(0, len(body)))]) + data.draw(st.binary(max_size=8))
    header_length = data.draw(st.none() | st.integers(0, len(body)))
    decodes_or_refuses(body, header_length, TEXT)


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=64), shape=st.lists(st.integers(-1, 4), max_size=3), datatype=st.sampled_from(
    ["BOOL", "UINT8", "INT32", "FP16", "BF16", "FP64", "BYTES"]), max_batch=st.sampled_from([0, 4]))
def test_any_raw_body(body, shape, datatype, max_batch):
    raw = ModelMetadata(name="raw", max_batch_size=max_batch, inputs=(TensorSpec("x", datatype, tuple(shape)),))
    decodes_or_refuses(body, 0, raw)

"""The KServe v2 codec against tritonclient, the independent reference client.

Requests are built by tritonclient (InferInput + generate_request_body) and decoded by
our codec; responses are encoded by our codec and read back by tritonclient
(parse_response_body + as_numpy). Every datatype, binary and JSON where JSON can carry
it, with random shapes that include zero-size tensors and scalars.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from smserve.core import datatypes
from smserve.codecs import v2
from smserve.errors import BadRequest
from smserve.core.inference import InferenceRequest, RequestedOutput
from smserve.core.metadata import ModelMetadata, TensorSpec

Client = httpclient.InferenceServerClient

ALL_DATATYPES = list(datatypes.BY_NAME)
JSON_DATATYPES = [name for name, t in datatypes.BY_NAME.items() if t.json_ok]

shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


def array_of(datatype: str, shape: tuple[int, ...], *, utf8_only: bool = False) -> st.SearchStrategy[np.ndarray]:
    """Arrays as tritonclient takes them: BF16 as ml_dtypes.bfloat16, BYTES as objects."""
    if datatype == "BYTES":
        element = st.text().map(lambda s: s.encode("utf-8")) if utf8_only else st.binary(max_size=12)
        return hnp.arrays(np.object_, shape, elements=element)
    if datatype == "BF16":
        return hnp.arrays(np.float32, shape, elements=st.floats(width=32)).map(
            lambda a: a.astype(ml_dtypes.bfloat16)
        )
    return hnp.arrays(datatypes.BY_NAME[datatype].dtype, shape)


def model_for(datatype: str, ndim: int) -> ModelMetadata:
    """One input x and one output y of this datatype, every dimension variable."""
    return ModelMetadata(
        name="m",
        version="3",
        inputs=(TensorSpec("x", datatype, (-1,) * ndim),),
        outputs=(TensorSpec("y", datatype, (-1,) * ndim),),
    )


def expected_decoded(array: np.ndarray, datatype: str) -> np.ndarray:
    # BF16 arrives as float32 holding exactly the bfloat16 value.
    return array.astype(np.float32) if datatype == "BF16" else array


def assert_same(actual: np.ndarray, expected: np.ndarray, datatype: str) -> None:
    assert actual.shape == expected.shape
    if datatype == "BYTES":
        assert actual.dtype == np.object_
        assert actual.reshape(-1).tolist() == expected.reshape(-1).tolist()
    elif expected.size:
        assert actual.dtype == expected.dtype
        np.testing.assert_array_equal(actual, expected)  # NaN equals NaN here


def request(array: np.ndarray, datatype: str, binary: bool, outputs=None) -> tuple[bytes, int | None]:
    tensor = httpclient.InferInput("x", list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return Client.generate_request_body([tensor], outputs=outputs)


# --------------------------------------------------------------------------------------
# Round trips through tritonclient


@pytest.mark.parametrize("datatype", ALL_DATATYPES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_binary_request_round_trip(datatype, data):
    shape = data.draw(shapes)
    array = data.draw(array_of(datatype, shape))
    body, json_size = request(array, datatype, binary=True)
    assert json_size is not None
    metadata = model_for(datatype, len(shape))

    decoded = v2.decode_request(body, json_size, metadata)
    assert list(decoded.inputs) == ["x"] and decoded.datatypes == {"x": datatype}
    assert_same(decoded.inputs["x"], expected_decoded(array, datatype), datatype)

    # The SageMaker form carries the same length in the Content-Type.
    content_type = f"{v2.SAGEMAKER_BINARY_CONTENT_TYPE}{json_size}"
    header_length = v2.sagemaker_header_length(content_type, len(body))
    assert header_length == json_size
    again = v2.decode_request(memoryview(body), header_length, metadata)
    assert_same(again.inputs["x"], expected_decoded(array, datatype), datatype)

    # Fixed-size datatypes are views on the body, not copies.
    if datatype not in ("BYTES", "BF16") and array.size:
        assert np.shares_memory(decoded.inputs["x"], np.frombuffer(body, dtype=np.uint8))


@pytest.mark.parametrize("datatype", JSON_DATATYPES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_json_request_round_trip(datatype, data):
    shape = data.draw(shapes)
    array = data.draw(array_of(datatype, shape, utf8_only=True))
    body, json_size = request(array, datatype, binary=False)
    assert json_size is None  # tritonclient sends pure JSON
    metadata = model_for(datatype, len(shape))
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        # tritonclient writes NaN/Infinity, which is not JSON: refused, as Triton's
        # rapidjson refuses it (non-finite values travel in binary).
        with pytest.raises(BadRequest, match="failed to parse the request JSON buffer"):
            v2.decode_request(body, None, metadata)
        return
    decoded = v2.decode_request(body, None, metadata)
    assert_same(decoded.inputs["x"], array, datatype)


def response_round_trip(array: np.ndarray, datatype: str, binary: bool) -> np.ndarray:
    shape = array.shape
    metadata = model_for(datatype, len(shape))
    outputs = [httpclient.InferRequestedOutput("y", binary_data=binary)]
    body, json_size = request(np.zeros(shape, dtype=array.dtype) if datatype != "BYTES" else array, datatype, True, outputs)
    decoded = v2.decode_request(body, json_size, metadata)
    # What a model returns: BF16 as float32.
    result = array.astype(np.float32) if datatype == "BF16" else array
    response = v2.build_response(decoded, {"y": result}, metadata)
    encoded, header_length = v2.encode_response(response)
    parsed = Client.parse_response_body(encoded, header_length=header_length)
    got = parsed.get_response()
    assert got["model_name"] == "m" and got["model_version"] == "3"
    assert set(got) == {"model_name", "model_version", "outputs"}
    return parsed.as_numpy("y")


@pytest.mark.parametrize("datatype", ALL_DATATYPES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_binary_response_round_trip(datatype, data):
    shape = data.draw(shapes)
    array = data.draw(array_of(datatype, shape))
    got = response_round_trip(array, datatype, binary=True)
    if datatype == "BF16":
        assert got.shape == array.shape
        np.testing.assert_array_equal(got.astype(np.float32), array.astype(np.float32))
    else:
        assert_same(got, array, datatype)


@pytest.mark.parametrize("datatype", JSON_DATATYPES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_json_response_round_trip(datatype, data):
    shape = data.draw(shapes)
    array = data.draw(array_of(datatype, shape, utf8_only=True))
    got = response_round_trip(array, datatype, binary=False)
    if datatype == "BYTES":
        # JSON carries text: tritonclient gives str back.
        assert got.shape == array.shape
        assert got.reshape(-1).tolist() == [b.decode("utf-8") for b in array.reshape(-1).tolist()]
    else:
        if array.dtype.kind == "f":
            # JSON has no NaN or Infinity: they are written null, which reads back as NaN.
            array = np.where(np.isfinite(array), array, np.nan).astype(array.dtype)
        assert_same(got, array, datatype)


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(max_dims=1, max_side=64), elements=st.floats(width=32)))
def test_bf16_output_rounds_like_ml_dtypes(values):
    """A float32 the model returns for a BF16 output is rounded to nearest even."""
    got = v2.bf16_to_float32(v2.float32_to_bf16(values))
    np.testing.assert_array_equal(got, values.astype(ml_dtypes.bfloat16).astype(np.float32))


# --------------------------------------------------------------------------------------
# Decoding details


def test_nested_and_ragged_json_data_is_read_row_major():
    metadata = model_for("INT32", 2)
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "INT32", "data": [[1, [2, 3]], [4], 5, [[6]]]}]}
    ).encode()
    decoded = v2.decode_request(body, None, metadata)
    np.testing.assert_array_equal(decoded.inputs["x"], [[1, 2, 3], [4, 5, 6]])


def test_json_data_nested_100_deep_is_accepted():
    metadata = model_for("FP64", 1)
    data = [1.5]
    for _ in range(99):
        data = [data]
    body = json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "data": data}]}).encode()
    assert v2.decode_request(body, None, metadata).inputs["x"].tolist() == [1.5]


def test_float_input_accepts_integers_and_int_input_keeps_uint64_range():
    metadata = ModelMetadata(
        inputs=(TensorSpec("f", "FP32", (-1,)), TensorSpec("u", "UINT64", (-1,))),
        outputs=(TensorSpec("y", "FP32", (-1,)),),
    )
    body = json.dumps(
        {
            "inputs": [
                {"name": "f", "shape": [2], "datatype": "FP32", "data": [1, 2.5]},
                {"name": "u", "shape": [1], "datatype": "UINT64", "data": [2**64 - 1]},
            ]
        }
    ).encode()
    decoded = v2.decode_request(body, None, metadata)
    assert decoded.inputs["f"].dtype == np.float32 and decoded.inputs["f"].tolist() == [1.0, 2.5]
    assert decoded.inputs["u"].tolist() == [2**64 - 1]


def test_request_fields_are_kept():
    metadata = model_for("FP32", 1)
    body = json.dumps(
        {
            "id": "req-7",
            "parameters": {"binary_data_output": True, "custom": "v", "n": 3},
            "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
            "outputs": [{"name": "y", "parameters": {"binary_data": True, "classification": 2}}],
        }
    ).encode()
    decoded = v2.decode_request(body, None, metadata)
    assert decoded.id == "req-7"
    assert decoded.binary_output is True
    assert decoded.parameters == {"custom": "v", "n": 3}
    assert decoded.outputs == [RequestedOutput("y", binary=True, classification=2)]
    assert decoded.raw is False


def test_empty_outputs_list_means_every_output():
    metadata = model_for("FP32", 1)
    body = json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], "outputs": []})
    assert v2.decode_request(body.encode(), None, metadata).outputs is None


def test_batching_model_inputs_share_the_batch_dimension():
    metadata = ModelMetadata(
        max_batch_size=8,
        inputs=(TensorSpec("a", "FP32", (2,)), TensorSpec("b", "INT64", (-1,))),
        outputs=(TensorSpec("y", "FP32", (1,)),),
    )
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    b = np.arange(12, dtype=np.int64).reshape(3, 4)
    inputs = []
    for name, arr in (("a", a), ("b", b)):
        t = httpclient.InferInput(name, list(arr.shape), datatypes.from_numpy(arr.dtype).name)
        t.set_data_from_numpy(arr)
        inputs.append(t)
    body, json_size = Client.generate_request_body(inputs)
    decoded = v2.decode_request(body, json_size, metadata)
    np.testing.assert_array_equal(decoded.inputs["a"], a)
    np.testing.assert_array_equal(decoded.inputs["b"], b)
    assert list(decoded.inputs) == ["a", "b"]
    assert decoded.binary_output is True  # tritonclient asks for binary when it lists no outputs


# --------------------------------------------------------------------------------------
# Raw binary requests (header length 0)


def raw_model(datatype: str, shape: tuple[int, ...], max_batch_size: int = 0) -> ModelMetadata:
    return ModelMetadata(
        name="raw",
        max_batch_size=max_batch_size,
        inputs=(TensorSpec("x", datatype, shape),),
        outputs=(TensorSpec("y", "FP32", (-1,)),),
    )


@pytest.mark.parametrize(
    "datatype, model_shape, max_batch, n_bytes, expected_shape",
    [
        ("FP32", (64,), 256, 256, (1, 64)),  # the digits model: a batch of one
        ("FP32", (64,), 0, 256, (64,)),
        ("FP32", (-1,), 0, 40, (10,)),
        ("INT16", (3, -1), 0, 24, (3, 4)),
        ("FP64", (-1, 2), 4, 48, (1, 3, 2)),
        ("UINT8", (-1,), 0, 0, (0,)),
        ("BF16", (-1,), 0, 6, (3,)),
        ("BOOL", (2, 2), 0, 4, (2, 2)),
    ],
)
def test_raw_request_shape_is_deduced(datatype, model_shape, max_batch, n_bytes, expected_shape):
    dt = datatypes.BY_NAME[datatype]
    body = bytes(n_bytes) if datatype != "BOOL" else bytes([1, 0, 1, 1])
    decoded = v2.decode_request(body, 0, raw_model(datatype, model_shape, max_batch))
    x = decoded.inputs["x"]
    assert x.shape == expected_shape
    assert x.dtype == dt.dtype
    assert decoded.raw is True and decoded.outputs is None
    if datatype == "FP32" and n_bytes:
        assert np.shares_memory(x, np.frombuffer(body, dtype=np.uint8))


def test_raw_request_values_are_the_body():
    values = np.linspace(0, 16, 64, dtype=np.float32)
    decoded = v2.decode_request(values.tobytes(), 0, raw_model("FP32", (64,), 256))
    np.testing.assert_array_equal(decoded.inputs["x"], values.reshape(1, 64))


def test_raw_bytes_request_is_one_bare_element():
    body = b"\xff\x00not a length prefix"
    decoded = v2.decode_request(body, 0, raw_model("BYTES", (1,), 8))
    assert decoded.inputs["x"].shape == (1, 1)
    assert decoded.inputs["x"][0, 0] == body


def test_empty_body_is_a_raw_request():
    decoded = v2.decode_request(b"", None, raw_model("FP32", (-1,)))
    assert decoded.raw and decoded.inputs["x"].shape == (0,)


def test_raw_request_gets_every_output_in_binary():
    metadata = ModelMetadata(
        inputs=(TensorSpec("x", "FP32", (-1,)),),
        outputs=(TensorSpec("a", "FP32", (-1,)), TensorSpec("b", "BYTES", (-1,))),
    )
    decoded = v2.decode_request(np.ones(2, np.float32).tobytes(), 0, metadata)
    response = v2.build_response(
        decoded, {"b": np.array([b"hi"], dtype=object), "a": np.ones(2, np.float32)}, metadata
    )
    assert [(t.name, t.binary) for t in response.outputs] == [("a", True), ("b", True)]
    body, header_length = v2.encode_response(response)
    # Triton's test reads a BYTES output's value right after its 4-byte length.
    assert body[header_length + 8 :] == b"\x02\x00\x00\x00hi"


# --------------------------------------------------------------------------------------
# Header lengths


@pytest.mark.parametrize(
    "content_type, expected",
    [
        ("application/json", None),
        ("text/csv", None),
        ("application/vnd.sagemaker-triton.binary+json; json-header-size=12", None),  # a space: not the form
        (v2.SAGEMAKER_BINARY_CONTENT_TYPE + "12", 12),
        (v2.SAGEMAKER_BINARY_CONTENT_TYPE + "0", 0),
        (v2.SAGEMAKER_BINARY_CONTENT_TYPE + " +7;charset=utf-8", 7),  # stoi: space, sign, trailing text
        (v2.SAGEMAKER_BINARY_CONTENT_TYPE + "100", 100),  # the whole body
    ],
)
def test_sagemaker_header_length(content_type, expected):
    assert v2.sagemaker_header_length(content_type, 100) == expected


def test_sagemaker_header_length_absent_content_type():
    assert v2.sagemaker_header_length(None, 10) is None


@pytest.mark.parametrize("value, expected", [(None, None), ("0", 0), ("15", 15), ("  15abc", 15), ("20", 20)])
def test_inference_header_content_length(value, expected):
    assert v2.header_length_from_header(value, 20) == expected


# --------------------------------------------------------------------------------------
# Responses


def simple_model(max_batch_size: int = 0) -> ModelMetadata:
    """Triton's `simple` model shape: two INT32 inputs, two INT32 outputs."""
    return ModelMetadata(
        name="simple",
        version="1",
        max_batch_size=max_batch_size,
        inputs=(TensorSpec("INPUT0", "INT32", (16,)), TensorSpec("INPUT1", "INT32", (16,))),
        outputs=(TensorSpec("OUTPUT0", "INT32", (16,)), TensorSpec("OUTPUT1", "INT32", (16,))),
    )


def simple_request(outputs=None, parameters=None) -> InferenceRequest:
    doc = {
        "inputs": [
            {"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(1, 17))} for n in ("INPUT0", "INPUT1")
        ]
    }
    if outputs is not None:
        doc["outputs"] = outputs
    if parameters is not None:
        doc["parameters"] = parameters
    return v2.decode_request(json.dumps(doc).encode(), None, simple_model(8))


SIMPLE_RESULTS = {
    "OUTPUT0": np.arange(2, 34, 2, dtype=np.int32).reshape(1, 16),
    "OUTPUT1": np.zeros((1, 16), dtype=np.int32),
}


def kinds(request: InferenceRequest) -> list[tuple[str, bool]]:
    response = v2.build_response(request, SIMPLE_RESULTS, simple_model(8))
    return [(t.name, t.binary) for t in response.outputs]


def test_output_kind_matrix_follows_triton():
    """Triton's L0_http curl matrix: listed outputs default to JSON, unlisted follow
    binary_data_output."""
    assert kinds(simple_request()) == [("OUTPUT0", False), ("OUTPUT1", False)]
    assert kinds(
        simple_request([{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}])
    ) == [("OUTPUT0", True), ("OUTPUT1", False)]
    assert kinds(simple_request(parameters={"binary_data_output": True})) == [("OUTPUT0", True), ("OUTPUT1", True)]
    assert kinds(
        simple_request(
            [{"name": "OUTPUT0", "parameters": {"binary_data": False}}, {"name": "OUTPUT1"}],
            parameters={"binary_data_output": True},
        )
    ) == [("OUTPUT0", False), ("OUTPUT1", False)]


def test_only_requested_outputs_in_requested_order():
    request = simple_request([{"name": "OUTPUT1"}, {"name": "OUTPUT0"}])
    assert kinds(request) == [("OUTPUT1", False), ("OUTPUT0", False)]
    request = simple_request([{"name": "OUTPUT1"}])
    assert kinds(request) == [("OUTPUT1", False)]


def test_json_response_is_compact_and_exact():
    body, header_length = v2.encode_response(v2.build_response(simple_request(), SIMPLE_RESULTS, simple_model(8)))
    assert header_length is None
    assert body == (
        b'{"model_name":"simple","model_version":"1","outputs":['
        b'{"name":"OUTPUT0","datatype":"INT32","shape":[1,16],"data":[2,4,6,8,10,12,14,16,18,20,22,24,26,28,30,32]},'
        b'{"name":"OUTPUT1","datatype":"INT32","shape":[1,16],"data":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]}]}'
    )


def test_binary_response_layout():
    request = simple_request(
        [{"name": "OUTPUT1", "parameters": {"binary_data": True}}, {"name": "OUTPUT0", "parameters": {"binary_data": True}}]
    )
    request.id = "abc"
    body, header_length = v2.encode_response(v2.build_response(request, SIMPLE_RESULTS, simple_model(8)))
    header = json.loads(body[:header_length])
    assert list(header) == ["id", "model_name", "model_version", "outputs"]
    assert header["id"] == "abc"
    assert [o["parameters"] for o in header["outputs"]] == [{"binary_data_size": 64}, {"binary_data_size": 64}]
    assert "data" not in header["outputs"][0]
    # Blobs follow the JSON in the order of the outputs array.
    assert body[header_length:] == SIMPLE_RESULTS["OUTPUT1"].tobytes() + SIMPLE_RESULTS["OUTPUT0"].tobytes()


def test_zero_size_binary_output_has_no_blob_and_plain_json():
    metadata = model_for("FP32", 2)
    decoded = v2.decode_request(
        json.dumps({"inputs": [{"name": "x", "shape": [0, 2], "datatype": "FP32", "data": []}],
                    "parameters": {"binary_data_output": True}}).encode(),
        None,
        metadata,
    )
    body, header_length = v2.encode_response(v2.build_response(decoded, {"y": np.empty((0, 2), np.float32)}, metadata))
    assert header_length is None
    assert json.loads(body)["outputs"][0] == {
        "name": "y", "datatype": "FP32", "shape": [0, 2], "parameters": {"binary_data_size": 0}
    }


def test_zero_size_output_beside_a_real_one_counts_zero_bytes():
    metadata = ModelMetadata(
        inputs=(TensorSpec("x", "FP32", (-1,)),),
        outputs=(TensorSpec("e", "INT64", (-1,)), TensorSpec("f", "FP64", (-1,))),
    )
    decoded = v2.decode_request(b'{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}],'
                                b'"parameters":{"binary_data_output":true}}', None, metadata)
    results = {"e": np.empty(0, np.int64), "f": np.array([0.5, 2.0])}
    body, header_length = v2.encode_response(v2.build_response(decoded, results, metadata))
    parsed = Client.parse_response_body(body, header_length=header_length)
    assert parsed.as_numpy("e").size == 0
    np.testing.assert_array_equal(parsed.as_numpy("f"), [0.5, 2.0])
    assert len(body) == header_length + 16


def test_model_output_is_cast_to_its_declared_datatype():
    metadata = model_for("FP32", 1)
    decoded = v2.decode_request(b'{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}', None, metadata)
    response = v2.build_response(decoded, {"y": np.array([0.25], dtype=np.float64)}, metadata)
    assert response.outputs[0].datatype == "FP32" and response.outputs[0].data.dtype == np.float32


def classify(values: np.ndarray, k: int, *, batching: bool, labels=None, datatype: str = "FP32", binary: bool = False):
    spec_shape = values.shape[1:] if batching else values.shape
    metadata = ModelMetadata(
        name="c",
        max_batch_size=8 if batching else 0,
        inputs=(TensorSpec("x", "FP32", (-1,)),),
        outputs=(TensorSpec("y", datatype, tuple(spec_shape), labels=labels),),
    )
    x_shape = [1, 1] if batching else [1]
    doc = {
        "inputs": [{"name": "x", "shape": x_shape, "datatype": "FP32", "data": [0]}],
        "outputs": [{"name": "y", "parameters": {"binary_data": binary, "classification": k}}],
    }
    decoded = v2.decode_request(json.dumps(doc).encode(), None, metadata)
    body, header_length = v2.encode_response(v2.build_response(decoded, {"y": values}, metadata))
    parsed = Client.parse_response_body(body, header_length=header_length)
    assert parsed.get_output("y")["datatype"] == "BYTES"
    return parsed.as_numpy("y")


def test_classification_top_k_with_labels_per_sample():
    probs = np.array([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3]], dtype=np.float32)
    got = classify(probs, 2, batching=True, labels=("zero", "one", "two"))
    assert got.tolist() == [["0.700000:1:one", "0.200000:2:two"], ["0.500000:0:zero", "0.300000:2:two"]]


def test_classification_binary_and_k_larger_than_classes():
    got = classify(np.array([3.3, 1.0], dtype=np.float64), 5, batching=False, datatype="FP64", binary=True)
    assert got.tolist() == [b"3.300000:0", b"1.000000:1"]


def test_classification_integers_ties_keep_lower_index_first_and_labels_may_run_short():
    got = classify(np.array([[4, 9, 4, 1]], dtype=np.int32), 3, batching=True, labels=("a",), datatype="INT32")
    assert got.tolist() == [["9:1", "4:0:a", "4:2"]]


def test_classification_of_the_digits_model_shape():
    """The example model: batch of 2, 10 probabilities, labels "0".."9", top 3."""
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(10), size=2).astype(np.float32)
    got = classify(probs, 3, batching=True, labels=tuple(str(i) for i in range(10)))
    assert got.shape == (2, 3)
    for row, expected in zip(got, probs):
        top = np.argsort(-expected, kind="stable")[:3]
        assert [s.split(":") for s in row] == [[f"{expected[i]:f}", str(i), str(i)] for i in top]


def test_error_body_is_compact():
    assert v2.encode_error('bad "x"') == b'{"error":"bad \\"x\\""}'
    assert json.loads(v2.encode_error("caf\u00e9 \ud800")) == {"error": "caf\u00e9 \ud800"}


def test_response_headers_say_where_the_json_ends():
    assert v2.response_headers(None, sagemaker=True) == {"Content-Type": "application/json"}
    assert v2.response_headers(None, sagemaker=False) == {"Content-Type": "application/json"}
    assert v2.response_headers(42, sagemaker=True) == {
        "Content-Type": "application/vnd.sagemaker-triton.binary+json;json-header-size=42"
    }
    assert v2.response_headers(42, sagemaker=False) == {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": "42",
    }


def test_request_id_is_echoed_even_when_not_ascii():
    metadata = model_for("FP32", 1)
    tensor = httpclient.InferInput("x", [1], "FP32")
    tensor.set_data_from_numpy(np.ones(1, np.float32))
    body, json_size = Client.generate_request_body([tensor], request_id="r\u00e9q \U0001F600")
    decoded = v2.decode_request(body, json_size, metadata)
    encoded, header_length = v2.encode_response(v2.build_response(decoded, {"y": np.ones(1, np.float32)}, metadata))
    parsed = Client.parse_response_body(encoded, header_length=header_length)
    assert parsed.get_response()["id"] == "r\u00e9q \U0001F600"
    assert list(parsed.get_response()) == ["id", "model_name", "model_version", "outputs"]


def test_outputs_the_metadata_does_not_list_are_answered_too():
    """A TorchScript model's derived metadata names only output__0; the model returned a
    tuple of two. Unrequested, every output comes back, the declared ones first."""
    metadata = ModelMetadata(name="ts", inputs=(TensorSpec("x", "FP32", None),),
                             outputs=(TensorSpec("output__0", "FP32", None),))
    request = v2.decode_request(json.dumps({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
                                                        "data": [1, 2, 3, 4, 5, 6]}]}).encode(), None, metadata)
    results = {"output__1": np.array([6.0, 15.0], dtype=np.float32),
               "output__0": np.arange(6, dtype=np.float32).reshape(2, 3)}
    response = v2.build_response(request, results, metadata)
    assert [(t.name, t.datatype) for t in response.outputs] == [("output__0", "FP32"), ("output__1", "FP32")]

"""KServe v2 and Triton's binary extension over HTTP, with tritonclient as the client."""

from __future__ import annotations

import gzip
import json
import zlib

import ml_dtypes
import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.http import InferenceServerClient, InferInput, InferRequestedOutput

from tests.helpers.server import worker_pids

SAGEMAKER_CT = "application/vnd.sagemaker-triton.binary+json;json-header-size="
DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "BF16", "FP32", "FP64", "BYTES"]
JSON_OK = [d for d in DATATYPES if d not in ("FP16", "BF16")]

# An echo model: each input IN_<T> comes back as OUT_<T>. It needs no weights, only hooks.
ECHO_HOOKS = '''
def model_fn(model_dir):
    return None


def predict_fn(data, model):
    return {"OUT_" + name[3:]: value for name, value in data.items()}
'''


def sample(datatype: str, shape=(2, 3), utf8: bool = False) -> np.ndarray:
    rng = np.random.default_rng(7)
    n = int(np.prod(shape))
    if datatype == "BOOL":
        return rng.integers(0, 2, n).astype(bool).reshape(shape)
    if datatype == "BYTES":
        first = b"zero\x00byte" if utf8 else b"\xff\x00bin"  # JSON carries only UTF-8
        return np.array([first, "caf\u00e9".encode()] * (n // 2) + [b""] * (n % 2), dtype=object).reshape(shape)
    if datatype == "BF16":
        return rng.normal(size=n).astype(ml_dtypes.bfloat16).reshape(shape)
    dtype = httpclient.triton_to_np_dtype(datatype)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True).reshape(shape)
    return rng.normal(size=n).astype(dtype).reshape(shape)


@pytest.fixture(scope="module")
def typed_echo_server(tmp_path_factory):
    from tests.helpers.server import ServerProcess

    model_dir = tmp_path_factory.mktemp("echo")
    (model_dir / "code").mkdir()
    (model_dir / "code" / "inference.py").write_text(ECHO_HOOKS)
    metadata = {
        "name": "echo",
        "max_batch_size": 0,
        "inputs": [{"name": f"IN_{d}", "datatype": d, "shape": [-1, -1]} for d in DATATYPES],
        "outputs": [{"name": f"OUT_{d}", "datatype": d, "shape": [-1, -1]} for d in DATATYPES],
    }
    (model_dir / "metadata.json").write_text(json.dumps(metadata))
    server = ServerProcess(model_dir, log_path=model_dir.parent / "echo.log")
    with server.start():
        yield server


def echo_inputs(under_test: str, binary: bool) -> list[InferInput]:
    """Every input the echo model requires; the one under test in the chosen encoding."""
    inputs = []
    for datatype in DATATYPES:
        tensor = InferInput(f"IN_{datatype}", [2, 3], datatype)
        tensor.set_data_from_numpy(sample(datatype, utf8=not binary), binary_data=binary if datatype == under_test else True)
        inputs.append(tensor)
    return inputs


def invoke_sagemaker(url: str, inputs, outputs=None, **kwargs):
    """tritonclient's request body, posted the way SageMaker forwards it."""
    body, json_size = InferenceServerClient.generate_request_body(inputs, outputs=outputs, **kwargs)
    content_type = "application/json" if json_size is None else f"{SAGEMAKER_CT}{json_size}"
    response = requests.post(url + "/invocations", data=body, headers={"Content-Type": content_type})
    assert response.status_code == 200, response.text
    returned = response.headers["Content-Type"]
    header_length = int(returned[len(SAGEMAKER_CT):]) if returned.startswith(SAGEMAKER_CT) else None
    if header_length is None:
        assert returned == "application/json"
    return InferenceServerClient.parse_response_body(response.content, header_length=header_length), header_length


# FP16 and BF16 travel only in binary.
ENCODINGS = [(d, i, o) for d in DATATYPES for i in (True, False) for o in (True, False) if (i and o) or d in JSON_OK]


@pytest.mark.parametrize("datatype, binary_in, binary_out", ENCODINGS)
def test_every_datatype_round_trips_through_invocations(typed_echo_server, datatype, binary_in, binary_out):
    array = sample(datatype, utf8=not (binary_in and binary_out))
    requested = [InferRequestedOutput(f"OUT_{datatype}", binary_data=binary_out)]
    result, header_length = invoke_sagemaker(typed_echo_server.url, echo_inputs(datatype, binary_in and binary_out), requested)
    assert (header_length is not None) == binary_out
    returned = result.as_numpy(f"OUT_{datatype}")
    if datatype == "BYTES":
        # JSON carries text: tritonclient gives str elements back for it.
        returned = np.vectorize(lambda v: v if isinstance(v, bytes) else str(v).encode(), otypes=[object])(returned)
    assert returned.shape == array.shape
    np.testing.assert_array_equal(returned, array)


def test_non_utf8_bytes_as_json_is_400(typed_echo_server):
    inputs = echo_inputs("BYTES", True)
    inputs[-1] = InferInput("IN_BYTES", [1, 1], "BYTES")
    inputs[-1].set_data_from_numpy(np.array([[b"\xff\xfe"]], dtype=object), binary_data=True)
    body, json_size = InferenceServerClient.generate_request_body(
        inputs, outputs=[InferRequestedOutput("OUT_BYTES", binary_data=False)])
    response = requests.post(typed_echo_server.url + "/invocations", data=body,
                             headers={"Content-Type": f"{SAGEMAKER_CT}{json_size}"})
    assert response.status_code == 400
    assert "OUT_BYTES" in response.json()["error"]


def test_tritonclient_infer_against_v2_unmodified(typed_echo_server):
    client = InferenceServerClient(typed_echo_server.url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("echo")
    metadata = client.get_model_metadata("echo")
    assert {i["name"] for i in metadata["inputs"]} == {f"IN_{d}" for d in DATATYPES}
    result = client.infer("echo", echo_inputs("FP32", False), request_id="req-42")
    assert result.get_response()["id"] == "req-42"
    for datatype in DATATYPES:
        np.testing.assert_array_equal(result.as_numpy(f"OUT_{datatype}"), sample(datatype, utf8=datatype != "FP32"))


def test_unknown_model_is_404(typed_echo_server):
    response = requests.get(typed_echo_server.url + "/v2/models/nope")
    assert response.status_code == 404
    assert response.json() == {"error": "Request for unknown model: 'nope' is not found"}
    response = requests.post(typed_echo_server.url + "/v2/models/nope/infer", json={"inputs": []})
    assert response.status_code == 404


def test_every_infer_path_answers_as_the_model_route(example_server):
    """The worker answers v2 inference without Flask's router; every path shape must
    still mean what Flask's routes make it mean."""
    url = example_server.url
    body = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}
    answers = []
    for path in ("/v2/models/digits/infer", "/v2/models/digits/versions/1/infer",
                 "/v2/models/dig%69ts/infer"):  # Flask's router decodes a percent-encoded name, as before
        response = requests.post(url + path, json=body)
        assert response.status_code == 200, (path, response.text)
        assert response.headers["Content-Type"] == "application/json"
        answers.append(response.json()["outputs"][0]["data"])
    assert answers[0] == answers[1] == answers[2] and len(answers[0]) == 10
    response = requests.post(url + "/v2/models/digits/versions/7/infer", json=body)
    assert response.status_code == 404
    assert response.json() == {"error": "Request for unknown model: 'digits' version 7 is not found"}
    for path in ("/v2/models//infer", "/v2/models/digits/versions//infer", "/v2/models/digits/extra/infer",
                 "/v2/models/digits/versions/1/2/infer"):
        response = requests.post(url + path, json=body)
        assert response.status_code in (404, 405), (path, response.status_code)
        assert "error" in response.json(), path


def test_server_metadata_and_health(typed_echo_server):
    meta = requests.get(typed_echo_server.url + "/v2").json()
    assert "binary_tensor_data" in meta["extensions"] and meta["name"]
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/echo/ready", "/v2/models/echo/versions/1/ready"):
        response = requests.get(typed_echo_server.url + path)
        assert response.status_code == 200 and response.content == b"", path


# ------------------------------------------------------------ the example classifier


def test_digits_over_sagemaker_binary_with_classification(example_server, digits):
    x, y = digits
    tensor = InferInput("pixels", [20, 64], "FP32")
    tensor.set_data_from_numpy(x[:20], binary_data=True)
    outputs = [InferRequestedOutput("probabilities", binary_data=True),
               InferRequestedOutput("probabilities", binary_data=False, class_count=3)]
    body, json_size = InferenceServerClient.generate_request_body([tensor], outputs=outputs[:1], request_id="a")
    response = requests.post(example_server.url + "/invocations", data=body,
                             headers={"Content-Type": f"{SAGEMAKER_CT}{json_size}"})
    assert response.status_code == 200, response.text
    header_length = int(response.headers["Content-Type"][len(SAGEMAKER_CT):])
    result = InferenceServerClient.parse_response_body(response.content, header_length=header_length)
    assert (result.as_numpy("probabilities").argmax(axis=1) == y[:20]).mean() >= 0.95

    classified, _ = invoke_sagemaker(example_server.url, [tensor], outputs[1:])
    top = classified.as_numpy("probabilities")
    assert top.shape == (20, 3)
    best = [(v.decode() if isinstance(v, bytes) else v).split(":") for v in top[:, 0]]
    for score, index, name in best:
        assert int(index) == int(name)
        assert float(score) > 0.3
    assert sum(int(index) == label for (_, index, _), label in zip(best, y[:20])) >= 19


def test_digits_raw_binary_request(example_server, digits):
    x, y = digits
    body = x[0].astype("<f4").tobytes()
    response = requests.post(example_server.url + "/invocations", data=body,
                             headers={"Content-Type": SAGEMAKER_CT + "0"})
    assert response.status_code == 200, response.text
    header_length = int(response.headers["Content-Type"][len(SAGEMAKER_CT):])
    header = json.loads(response.content[:header_length])
    assert header["outputs"][0]["shape"] == [1, 10]
    probabilities = np.frombuffer(response.content[header_length:], dtype="<f4")
    assert probabilities.argmax() == y[0]


def test_digits_v2_json_on_invocations(example_server, digits):
    x, y = digits
    request = {"id": "j1", "inputs": [{"name": "pixels", "shape": [2, 64], "datatype": "FP32", "data": x[:2].tolist()}]}
    response = requests.post(example_server.url + "/invocations", json=request)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"] == "j1" and body["model_name"] == "digits"
    probabilities = np.array(body["outputs"][0]["data"]).reshape(body["outputs"][0]["shape"])
    assert (probabilities.argmax(axis=1) == y[:2]).all()


def test_digits_v2_binary_with_octet_stream_and_header(example_server, digits):
    x, y = digits
    tensor = InferInput("pixels", [4, 64], "FP32")
    tensor.set_data_from_numpy(x[:4], binary_data=True)
    body, json_size = InferenceServerClient.generate_request_body([tensor])
    response = requests.post(example_server.url + "/invocations", data=body,
                             headers={"Content-Type": "application/octet-stream",
                                      "Inference-Header-Content-Length": str(json_size)})
    assert response.status_code == 200, response.text
    header_length = int(response.headers["Content-Type"][len(SAGEMAKER_CT):])
    result = InferenceServerClient.parse_response_body(response.content, header_length=header_length)
    assert (result.as_numpy("probabilities").argmax(axis=1) == y[:4]).all()


def _digits_request(x):
    tensor = InferInput("pixels", [1, 64], "FP32")
    tensor.set_data_from_numpy(x[:1], binary_data=True)
    return InferenceServerClient.generate_request_body([tensor])


ERROR_CASES = [
    # (name, content type, body maker, status, words)
    ("prefix not first", lambda b, n: ("text/plain; " + SAGEMAKER_CT + str(n), b), 400, "starts with"),
    ("header size not a number", lambda b, n: (SAGEMAKER_CT + "abc", b), 400, "Unable to parse inference header size"),
    ("header size beyond body", lambda b, n: (SAGEMAKER_CT + str(len(b) + 1), b), 400, "should be in range"),
    ("negative header size", lambda b, n: (SAGEMAKER_CT + "-1", b), 400, "should be in range"),
    ("too few bytes", lambda b, n: (SAGEMAKER_CT + str(n), b[:-4]), 400, "pixels"),
    ("leftover bytes", lambda b, n: (SAGEMAKER_CT + str(n), b + b"\0\0\0\0"), 400, "unexpected additional input data"),
    ("binary without header length", lambda b, n: ("application/json", b), 400, "give the header's length"),
]


@pytest.mark.parametrize("name, make, status, words", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_binary_protocol_errors_are_4xx_and_the_server_keeps_serving(example_server, digits, name, make, status, words):
    x, _ = digits
    body, json_size = _digits_request(x)
    content_type, payload = make(body, json_size)
    response = requests.post(example_server.url + "/invocations", data=payload, headers={"Content-Type": content_type})
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/json"
    assert response.content.startswith(b'{"error":"')
    assert words in response.json()["error"]
    good = requests.post(example_server.url + "/invocations", data=body,
                         headers={"Content-Type": SAGEMAKER_CT + str(json_size)})
    assert good.status_code == 200


@pytest.mark.parametrize("request_json, words", [
    ({"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32"}]}, "Input must set only one"),
    ({"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [1.0] * 63}]}, "shape does not match"),
    ({"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [1.0] * 65}]}, "Shape does not match"),
    ({"inputs": [{"name": "pixels", "shape": [-1, 64], "datatype": "FP32", "data": [1.0] * 64}]}, "shape"),
    ({"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP16", "data": [1.0] * 64}]}, "FP16"),
    ({"inputs": [{"name": "nope", "shape": [1, 64], "datatype": "FP32", "data": [1.0] * 64}]}, "nope"),
    ({"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [1.0] * 64}],
      "outputs": [{"name": "probabilities"}, {"name": "probabilities"}]}, "already exists"),
    ({"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [1.0] * 64}],
      "outputs": [{"name": "logits"}]}, "logits"),
    ({"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [[[[1.0]]]] * 65}]}, "Shape does not match"),
    ({"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "INT32", "data": [1] * 64}]}, "data-type is 'INT32'"),
    ({"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [1.0] * 64}],
      "parameters": {"triton_x": 1}}, "reserved"),
])
def test_v2_json_errors_on_v2_infer(example_server, request_json, words):
    response = requests.post(example_server.url + "/v2/models/digits/infer", json=request_json)
    assert response.status_code == 400, response.text
    assert words in response.json()["error"]
    assert requests.get(example_server.url + "/v2/health/ready").status_code == 200


def test_nesting_deeper_than_100_is_400(example_server):
    data = 1.0
    for _ in range(150):
        data = [data]
    request = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": data}]}
    response = requests.post(example_server.url + "/v2/models/digits/infer", data=json.dumps(request),
                             headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert "nesting" in response.json()["error"]


def test_huge_declared_shape_with_a_tiny_body_is_400(example_server):
    request = {"inputs": [{"name": "pixels", "shape": [2**40, 64], "datatype": "FP32", "parameters": {"binary_data_size": 8}}]}
    header = json.dumps(request).encode()
    response = requests.post(example_server.url + "/invocations", data=header + b"\0" * 8,
                             headers={"Content-Type": SAGEMAKER_CT + str(len(header))})
    assert response.status_code == 400
    assert "pixels" in response.json()["error"]


def test_chunked_binary_request_without_content_length(example_server, digits):
    x, y = digits
    body, json_size = _digits_request(x)
    # A generator makes requests send Transfer-Encoding: chunked, with no Content-Length.
    response = requests.post(example_server.url + "/invocations", data=(body[i:i + 100] for i in range(0, len(body), 100)),
                             headers={"Content-Type": SAGEMAKER_CT + str(json_size)})
    assert response.status_code == 200, response.text
    header_length = int(response.headers["Content-Type"][len(SAGEMAKER_CT):])
    result = InferenceServerClient.parse_response_body(response.content, header_length=header_length)
    assert result.as_numpy("probabilities").argmax() == y[0]


# ------------------------------------------------------------ compressed request bodies


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_request_compression(typed_echo_server, algorithm):
    """tritonclient compresses the body when asked and says so in Content-Encoding, as
    Triton's HTTP front end takes it; the answer is the uncompressed request's."""
    client = InferenceServerClient(typed_echo_server.url.removeprefix("http://"))
    result = client.infer("echo", echo_inputs("FP32", True), request_compression_algorithm=algorithm)
    for datatype in DATATYPES:
        np.testing.assert_array_equal(result.as_numpy(f"OUT_{datatype}"), sample(datatype))


@pytest.mark.parametrize("path", ["/v2/models/digits/infer", "/v2/models/dig%69ts/infer"],
                         ids=["worker-route", "flask-route"])
def test_a_gzip_v2_body_on_either_v2_route(example_server, digits, path):
    x, y = digits
    tensor = InferInput("pixels", [8, 64], "FP32")
    tensor.set_data_from_numpy(x[:8], binary_data=True)
    body, json_size = InferenceServerClient.generate_request_body([tensor])
    response = requests.post(example_server.url + path, data=gzip.compress(body),
                             headers={"Content-Type": "application/octet-stream", "Content-Encoding": "gzip",
                                      "Inference-Header-Content-Length": str(json_size)})
    assert response.status_code == 200, response.text
    header_length = int(response.headers["Inference-Header-Content-Length"])
    result = InferenceServerClient.parse_response_body(response.content, header_length=header_length)
    assert (result.as_numpy("probabilities").argmax(axis=1) == y[:8]).all()


@pytest.mark.parametrize("content_type, encode", [
    ("application/json", lambda x: json.dumps({"instances": x.tolist()}).encode()),
    ("text/csv", lambda x: "\n".join(",".join(map(str, row)) for row in x.tolist()).encode()),
], ids=["json", "csv"])
@pytest.mark.parametrize("coding, pack", [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_compressed_simple_bodies_on_invocations(example_server, digits, content_type, encode, coding, pack):
    x, y = digits
    plain = requests.post(example_server.url + "/invocations", data=encode(x[:16]),
                          headers={"Content-Type": content_type, "Accept": "application/json"})
    packed = requests.post(example_server.url + "/invocations", data=pack(encode(x[:16])),
                           headers={"Content-Type": content_type, "Accept": "application/json",
                                    "Content-Encoding": coding})
    assert packed.status_code == 200, packed.text
    assert packed.content == plain.content


def test_compressed_bodies_that_break_the_rules_are_4xx_and_the_worker_lives(example_server, digits):
    url = example_server.url
    workers = worker_pids(example_server)
    x, _ = digits
    body = json.dumps({"instances": x[:2].tolist()}).encode()
    cases = [
        ("br", body, 415, "Content-Encoding 'br' is not supported"),
        ("gzip", body, 400, "not valid gzip data"),
        ("gzip", gzip.compress(body)[:-12], 400, "ends before its gzip stream does"),
        # 200 MB of zeros in 200 KB: refused at the payload limit, never inflated whole.
        ("gzip", gzip.compress(b"0" * (200 << 20), compresslevel=9), 413, "Decompressed data size exceeds"),
    ]
    for coding, payload, status, words in cases:
        response = requests.post(url + "/invocations", data=payload,
                                 headers={"Content-Type": "application/json", "Content-Encoding": coding})
        assert response.status_code == status, (coding, response.text)
        assert response.headers["Content-Type"] == "application/json"
        assert words in response.json()["error"], response.text
    assert requests.get(url + "/ping").status_code == 200
    assert worker_pids(example_server) == workers

"""invoke through boto3's sagemaker-runtime against moto.

moto answers InvokeEndpoint with scripted results; its recorder shows the request as
it went over the wire. So each test checks both directions: the body and headers the
tool built (parsed here by hand, not by the tool's codec), and how it printed the
scripted response.

moto reads request bodies as UTF-8 and keeps scripted response bodies as text, so the
v2 binary bodies here hold only FP32 values whose bytes are ASCII: 0 and powers of 4
such as 0.5 (00 00 00 3f) and 2.0 (00 00 00 40). npy bodies start with byte 0x93 and
cannot pass through moto at all: they, and arbitrary binary bodies, are exercised
against the real server in test_invoke_codec.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

ENDPOINT = "digits-ep"
PREFIX = "application/vnd.sagemaker-triton.binary+json;json-header-size="


@pytest.fixture
def endpoint(aws_env, boto):
    sagemaker = boto("sagemaker")
    sagemaker.create_model(ModelName="digits", ExecutionRoleArn="arn:aws:iam::123456789012:role/r",
                           PrimaryContainer={"Image": "image", "ModelDataUrl": "s3://b/model.tar.gz"})
    sagemaker.create_endpoint_config(EndpointConfigName="cfg", ProductionVariants=[
        {"VariantName": "AllTraffic", "ModelName": "digits", "InstanceType": "ml.m5.large", "InitialInstanceCount": 1}])
    sagemaker.create_endpoint(EndpointName=ENDPOINT, EndpointConfigName="cfg")
    return aws_env


def sent_request(moto) -> dict:
    [request] = [r for r in moto.recorded() if r["url"].endswith(f"/endpoints/{ENDPOINT}/invocations")]
    return request


def scripted(body: str, content_type: str) -> dict:
    return {"Body": body, "ContentType": content_type, "InvokedProductionVariant": "AllTraffic", "CustomAttributes": ""}


def test_v2_binary_request_and_response(endpoint, cli):
    probabilities = np.array([[0.5, 2.0, 0.0], [8.0, 0.125, 32.0]], dtype="<f4")
    blob = probabilities.tobytes()
    assert max(blob) < 0x80
    header = json.dumps({"model_name": "digits", "outputs": [
        {"name": "probabilities", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": len(blob)}}]})
    endpoint.script_invocations(scripted(header + blob.decode("ascii"), f"{PREFIX}{len(header)}"))
    endpoint.start_recording()

    pixels = [[0, 0.5, 2], [8, 32, 128]]
    status, out, err = cli("invoke", "--endpoint-name", ENDPOINT, "--array", json.dumps(pixels),
                           "--content-type", "application/vnd.sagemaker-triton.binary+json", "--input-name", "pixels")
    assert status == 0, err

    request = sent_request(endpoint)
    content_type = request["headers"]["Content-Type"]
    assert content_type.startswith(PREFIX)
    size = int(content_type.removeprefix(PREFIX))
    sent_header = json.loads(request["raw"][:size])
    [tensor] = sent_header["inputs"]
    assert (tensor["name"], tensor["datatype"], tensor["shape"]) == ("pixels", "FP32", [2, 3])
    assert tensor["parameters"]["binary_data_size"] == 24
    assert sent_header["parameters"]["binary_data_output"] is True
    assert request["raw"][size:] == np.array(pixels, dtype="<f4").tobytes()

    printed = json.loads(out)
    assert printed == {"outputs": {"probabilities": {"shape": [2, 3], "dtype": "float32", "data": probabilities.tolist()}}}


@pytest.mark.parametrize(
    ("content_type", "expected_body"),
    [
        ("application/json", b'{"instances": [[1.0, 2.0], [3.0, 4.5]]}'),
        ("application/jsonlines", b"[1.0, 2.0]\n[3.0, 4.5]\n"),
        ("text/csv", b"1.0,2.0\n3.0,4.5\n"),
    ],
)
def test_simple_encodings_on_the_wire(endpoint, cli, content_type, expected_body):
    endpoint.script_invocations(scripted('{"predictions": []}', "application/json"))
    endpoint.start_recording()
    status, _, err = cli("invoke", "--endpoint-name", ENDPOINT, "--array", "[[1, 2], [3, 4.5]]", "--content-type", content_type)
    assert status == 0, err
    request = sent_request(endpoint)
    assert request["headers"]["Content-Type"] == content_type
    assert request["raw"] == expected_body


def test_file_is_sent_verbatim_with_its_type(endpoint, cli, tmp_path):
    records = b'{"pixels": [1, 2]}\n{"pixels": [3, 4]}\n'
    (tmp_path / "records.jsonl").write_bytes(records)
    endpoint.script_invocations(scripted('[0.5]\n[0.25]\n', "application/jsonlines"))
    endpoint.start_recording()
    status, out, err = cli("invoke", "--endpoint-name", ENDPOINT, "--input", str(tmp_path / "records.jsonl"))
    assert status == 0, err
    request = sent_request(endpoint)
    assert request["headers"]["Content-Type"] == "application/jsonlines"
    assert request["raw"] == records
    assert out.splitlines() == ["[0.5]", "[0.25]"]


def test_v2_needs_the_input_name(endpoint, cli):
    status, out, err = cli("invoke", "--endpoint-name", ENDPOINT, "--array", "[[1]]",
                           "--content-type", "application/vnd.sagemaker-triton.binary+json")
    assert (status, out) == (1, "")
    assert err == "error: the v2 binary content type needs the model's input name (--input-name)\n"

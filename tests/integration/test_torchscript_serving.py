"""A TorchScript model.pt without metadata.json, served by the real server.

README step 1 offers `torch.jit.save(...)` as model.pt, and step 2 says the server
derives what it needs without metadata.json. TorchScript keeps no shapes, so the
derived shapes are "not known": a batch of records (CSV, JSON, JSON Lines, .npy,
KServe v2 JSON and binary) reaches the model as sent, each request one forward pass.
The same holds for the metadata.json that `make new-model` writes for it.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import requests
import torch
from tritonclient.http import InferenceServerClient, InferInput, InferRequestedOutput

from tests.helpers.client import npy
from tests.helpers.server import ServerProcess, logged
from model import init

SAGEMAKER_CT = "application/vnd.sagemaker-triton.binary+json;json-header-size="
X = (np.arange(3 * 64, dtype=np.float32).reshape(3, 64) % 17) / 4  # 3 records of 64, as digits.csv


def build(directory, kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 3), torch.nn.Softmax(-1)).eval()
    directory.mkdir(parents=True)
    scripted = torch.jit.trace(net, torch.zeros(2, 64)) if kind == "trace" else torch.jit.script(net)
    torch.jit.save(scripted, str(directory / "model.pt"))
    if kind == "script+new-model":
        assert init.main([str(directory)]) == 0  # make new-model: metadata.json with null shapes
    return net


KINDS = ["script", "trace", "script+new-model"]


@pytest.fixture(scope="module", params=KINDS)
def served(request, tmp_path_factory):
    """(server, expected answers, net) of one kind. Module-scoped: pytest runs a kind's
    tests together, with one server, and under xdist a process starts only the kinds
    its tests use."""
    kind = request.param
    model_dir = tmp_path_factory.mktemp("torchscript") / kind
    net = build(model_dir, kind)
    with torch.no_grad():
        expected = net(torch.from_numpy(X)).numpy()
    with ServerProcess(model_dir, log_path=model_dir.parent / "server.log") as server:
        yield server, expected, net


def test_csv_records_get_one_answer_line_each(served):
    server, expected, _ = served
    body = "".join(",".join(f"{v:g}" for v in row) + "\n" for row in X)
    response = requests.post(server.url + "/invocations", data=body,
                             headers={"Content-Type": "text/csv", "Accept": "text/csv"})
    assert response.status_code == 200, response.text
    lines = response.text.splitlines()
    assert len(lines) == 3
    np.testing.assert_allclose([[float(v) for v in line.split(",")] for line in lines], expected, rtol=1e-5)


@pytest.mark.parametrize("key", ["instances", "inputs", None])
def test_json_records(served, key):
    """The answer takes the request's form: wrapped records, {"predictions": ...}; a bare
    list, the bare list (as AWS's PyTorch containers answer)."""
    server, expected, _ = served
    response = requests.post(server.url + "/invocations", json={key: X.tolist()} if key else X.tolist())
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()["predictions"] if key else response.json(), expected, rtol=1e-5)


def test_json_lines(served):
    server, expected, _ = served
    body = "".join(json.dumps(row) + "\n" for row in X.tolist())
    response = requests.post(server.url + "/invocations", data=body,
                             headers={"Content-Type": "application/jsonlines", "Accept": "application/jsonlines"})
    assert response.status_code == 200, response.text
    np.testing.assert_allclose([json.loads(line) for line in response.text.splitlines()], expected, rtol=1e-5)


@pytest.mark.parametrize("shape", [(3, 64), (2, 3, 64), (64,)])
def test_npy_of_any_rank_the_model_takes(served, shape):
    server, _, net = served
    x = np.resize(X, shape).astype(np.float32)
    response = requests.post(server.url + "/invocations", data=npy(x),
                             headers={"Content-Type": "application/x-npy", "Accept": "application/x-npy"})
    assert response.status_code == 200, response.text
    with torch.no_grad():
        np.testing.assert_allclose(np.load(io.BytesIO(response.content)), net(torch.from_numpy(x)).numpy(), rtol=1e-5)


def test_kserve_v2_json_and_binary(served):
    server, expected, _ = served
    client = InferenceServerClient(server.url.removeprefix("http://"))
    for binary in (False, True):
        tensor = InferInput("input", [3, 64], "FP32")
        tensor.set_data_from_numpy(X, binary_data=binary)
        result = client.infer("model", [tensor], outputs=[InferRequestedOutput("output__0", binary_data=binary)])
        np.testing.assert_allclose(result.as_numpy("output__0"), expected, rtol=1e-5)
    # SageMaker's form, on /invocations.
    tensor = InferInput("input", [3, 64], "FP32")
    tensor.set_data_from_numpy(X, binary_data=True)
    body, n = InferenceServerClient.generate_request_body([tensor], outputs=[InferRequestedOutput("output__0")])
    response = requests.post(server.url + "/invocations", data=body, headers={"Content-Type": f"{SAGEMAKER_CT}{n}"})
    assert response.status_code == 200, response.text
    length = int(response.headers["Content-Type"][len(SAGEMAKER_CT):])
    result = InferenceServerClient.parse_response_body(response.content, header_length=length)
    np.testing.assert_allclose(result.as_numpy("output__0"), expected, rtol=1e-5)


def test_a_raw_binary_body_is_a_400_that_says_the_shape_is_not_known(served):
    server, _, _ = served
    response = requests.post(server.url + "/invocations", data=X.tobytes(),
                             headers={"Content-Type": "application/octet-stream"})
    assert response.status_code == 400
    assert "can not be deduced" in response.json()["error"] and "metadata.json" in response.json()["error"]


def test_a_record_of_the_wrong_width_gets_the_models_own_error(served):
    server, _, _ = served
    response = requests.post(server.url + "/invocations", data="1,2,3\n", headers={"Content-Type": "text/csv"})
    assert response.status_code == 500  # nothing to check it against: the model says what is wrong
    assert "model failed" in response.json()["error"]


def test_the_log_says_what_was_derived_and_how_to_change_it(served, request):
    server, _, _ = served
    # The worker writes its lines from a thread of its own: /ping may say ready first.
    assert logged(server, "worker 0 ready"), server.log()
    log = server.log()
    if request.node.callspec.params["served"] == "script+new-model":
        assert "derived from model.pt" not in log  # metadata.json is there
        return
    assert "derived from model.pt: inputs input (FP32, any shape)" in log
    assert "max_batch_size 0" in log and "make new-model" in log
    assert "worker 0 ready" in log and "max batch 0" in log

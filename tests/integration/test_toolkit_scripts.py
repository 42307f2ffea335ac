"""Models and scripts written for AWS's SageMaker PyTorch inference containers, served
unchanged by real gunicorns (issue 38). The fixtures follow the toolkit's contract
(aws/sagemaker-pytorch-inference-toolkit, sagemaker-inference's transformer.py), not
this server's habits: an entry_point named otherwise (SAGEMAKER_PROGRAM), hooks whose
context is one trailing parameter of any name, pre_model_fn and model_warmup_fn,
transform_fn, a lone TorchScript `.pth` with no script, and the answers its users'
clients read (a bare JSON array for a bare array, .npy or CSV in). Bodies are made as
the SageMaker SDK's serializers make them (JSONSerializer: json.dumps of the list;
NumpySerializer: np.save; CSVSerializer: one row a line)."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import torch

from tests.helpers.client import invoke, npy
from tests.helpers.lazy_servers import LazyServers, started
from tests.helpers.server import ServerProcess, worker_pids, logged
from tests.helpers.models import echo_hooks, model_dir_with

JSON, CSV, NPY = "application/json", "text/csv", "application/x-npy"
ROWS = 5  # records a request (the toolkit's MNIST test sends 300 of 1x28x28)

# The toolkit's hooks, each taking its context as one more parameter, named as users do
# (not `context`): model_fn and pre_model_fn read system_properties at load.
CONTEXT_SCRIPT = '''
import io
import json
import os

import numpy as np
import torch

SEEN = {}


def pre_model_fn(model_dir, ctx):
    SEEN["pre_model_fn"] = dict(ctx.system_properties)


def model_fn(model_dir, ctx):
    SEEN["model_fn"] = dict(ctx.system_properties)
    return torch.jit.load(os.path.join(model_dir, "mnist.pth"))


def model_warmup_fn(model_dir, model):
    SEEN["model_warmup_fn"] = model_dir


def input_fn(request_body, request_content_type, ctx):
    SEEN["input_fn"] = ctx.system_properties["model_dir"]
    if request_content_type == "application/x-npy":
        return torch.from_numpy(np.load(io.BytesIO(request_body)))
    return torch.tensor(json.loads(request_body), dtype=torch.float32)


def predict_fn(data, model, ctx):
    with torch.no_grad():
        return model(data)


def output_fn(prediction, accept, ctx):
    return json.dumps({"shape": list(prediction.shape), "seen": SEEN, "gpu_id": ctx.system_properties["gpu_id"],
                       "custom_attributes": ctx.custom_attributes}), accept
'''

# transform_fn does all three steps; with the context, and without (answering a str,
# whose type is the request's Accept).
TRANSFORM_SCRIPT = '''
import json


def model_fn(model_dir):
    return 2


def transform_fn(model, request_body, content_type, accept, context):
    values = json.loads(request_body)
    return json.dumps({"y": [v * model for v in values], "content_type": content_type, "accept": accept,
                       "model_dir": context.system_properties["model_dir"]}), "application/json"
'''
TRANSFORM_NO_CONTEXT = '''
def model_fn(model_dir):
    return "m"


def transform_fn(model, request_body, content_type, accept):
    return "transformed " + str(len(request_body)) + " bytes for " + accept
'''


# The toolkit's call_model_fn_once check: model_fn once per worker process, never per
# request; bytes pass through input_fn, predict_fn and output_fn untouched.
ONCE_SCRIPT = '''
import os


def model_fn(model_dir):
    mark = os.path.join(model_dir, "model_fn.{}".format(os.getpid()))
    if os.path.exists(mark):
        raise RuntimeError("model_fn called twice in one process")
    open(mark, "a").close()
    return "model"


def input_fn(data, content_type):
    return data


def predict_fn(data, model):
    return b"output"


def output_fn(prediction, accept):
    return prediction
'''


class Mnist(torch.nn.Module):
    """The shape of the toolkit's MNIST model: (N, 1, 28, 28) in, 10 scores out."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(28 * 28, 10)

    def forward(self, x):
        return self.fc(x.reshape(x.shape[0], -1))


def traced(path: Path) -> Path:
    torch.manual_seed(0)
    torch.jit.save(torch.jit.trace(Mnist().eval(), torch.zeros(1, 1, 28, 28)), str(path))
    return path


def folder(root: Path, name: str, script: str | None = None, script_name: str = "inference.py",
           weights: str | None = None) -> Path:
    path = root / name
    path.mkdir()
    if weights:
        traced(path / weights)
    if script is not None:
        (path / "code").mkdir()
        (path / "code" / script_name).write_text(script)
    return path


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("toolkit")
    logs = tmp_path_factory.mktemp("toolkit-logs")
    models = root / "models"
    models.mkdir()
    folder(models, "mnist", CONTEXT_SCRIPT, "mnist.py", weights="mnist.pth")
    folder(models, "traced", weights="traced_resnet18.pt")
    # name: (model folder, environment); each server is started when a test first asks for it.
    made = {
        # The SDK sets SAGEMAKER_PROGRAM to the entry_point's file name.
        "context": (folder(root, "context", CONTEXT_SCRIPT, "mnist.py", weights="mnist.pth"), {
            "SAGEMAKER_PROGRAM": "mnist.py", "SAGEMAKER_SUBMIT_DIRECTORY": "/opt/ml/model/code",
            "SAGEMAKER_TS_MIN_WORKERS": "1", "SAGEMAKER_TS_BATCH_SIZE": "4", "SMSERVE_MAX_BATCH_SIZE": "8",
            "SAGEMAKER_TS_MAX_BATCH_DELAY": "20"}),
        "transform": (folder(root, "transform", TRANSFORM_SCRIPT, "serve_it.py"), {"SAGEMAKER_PROGRAM": "serve_it.py"}),
        "plain_transform": (folder(root, "plain_transform", TRANSFORM_NO_CONTEXT), {}),
        # No script at all: the toolkit's default model_fn takes the folder's only .pth.
        "lone": (folder(root, "lone", weights="model.pth"), {}),
        "once": (folder(root, "once", ONCE_SCRIPT, "call_model_fn_once.py"), {
            "SAGEMAKER_PROGRAM": "call_model_fn_once.py", "SAGEMAKER_MODEL_SERVER_WORKERS": "2"}),
        # The PyTorch containers' response timeout: a 1 s answer deadline.
        "deadline": (model_dir_with(root, echo_hooks(), "deadline"), {"SAGEMAKER_TS_RESPONSE_TIMEOUT": "1"}),
        "mme": (root / "none", {"SAGEMAKER_MULTI_MODEL": "true", "SMSERVE_MODELS_ROOT": str(models),
                                "SAGEMAKER_PROGRAM": "mnist.py"}),
    }
    servers = LazyServers({name: lambda path=path, env=env, name=name: started(
        ServerProcess(path, env, log_path=logs / f"{name}.log")) for name, (path, env) in made.items()}, models=models)
    yield servers
    servers.stop()


def batch(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((ROWS, 1, 28, 28)).astype(np.float32)


# ---------------------------------------------------------------- item 1: the script SageMaker names


def test_the_script_sagemaker_program_names_serves_and_the_log_says_which_hooks_it_gave(servers):
    server = servers["context"]
    r = invoke(server, json.dumps(batch().tolist()).encode(), JSON, JSON)
    assert r.status_code == 200, r.text
    assert r.json()["shape"] == [ROWS, 10]
    log = server.log()
    assert ("hooks: model_fn, input_fn, predict_fn, output_fn, pre_model_fn, model_warmup_fn from code/mnist.py "
            "(model_fn, input_fn, predict_fn, output_fn, pre_model_fn with context)") in log


def test_a_multi_model_endpoint_reads_each_models_script_of_that_name(servers):
    server, models = servers["mme"], servers["models"]
    r = requests.post(server.url + "/models", json={"model_name": "mnist", "url": str(models / "mnist")}, timeout=120)
    assert r.status_code == 200, r.text
    try:
        r = requests.post(server.url + "/models/mnist/invoke", data=npy(batch()),
                          headers={"Content-Type": NPY}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["shape"] == [ROWS, 10]
        assert r.json()["seen"]["model_fn"]["model_dir"] == str(models / "mnist")
    finally:
        requests.delete(server.url + "/models/mnist", timeout=60)


# ---------------------------------------------------------------- item 2: the hook contract


def test_model_fn_runs_once_per_worker_and_bytes_pass_through(servers):
    server = servers["once"]
    for _ in range(6):  # new connections: both workers answer
        with requests.Session() as session:
            r = session.post(server.url + "/invocations", data=b"input", timeout=60,
                             headers={"Content-Type": NPY, "Accept": NPY})
        assert r.status_code == 200 and r.content == b"output", r.text
    assert len(list(Path(server.env["SM_MODEL_DIR"]).glob("model_fn.*"))) == 2


def test_every_hook_gets_the_context_by_arity_with_the_toolkits_system_properties(servers):
    server = servers["context"]
    r = invoke(server, npy(batch()), NPY, JSON, headers={"X-Amzn-SageMaker-Custom-Attributes": "k=v"})
    assert r.status_code == 200, r.text
    answer = r.json()
    model_dir = str(Path(server.env["SM_MODEL_DIR"]))
    properties = {"model_dir": model_dir, "gpu_id": None}  # a CPU worker: no GPU, as the toolkit says it
    assert answer["seen"] == {"pre_model_fn": properties, "model_fn": properties, "model_warmup_fn": model_dir,
                              "input_fn": model_dir}
    assert answer["gpu_id"] is None and answer["custom_attributes"] == "k=v"


def test_transform_fn_answers_each_request_with_its_content_type_and_accept(servers):
    server = servers["transform"]
    r = invoke(server, b"[1, 2, 3]", JSON, "text/csv")
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == JSON
    assert r.json() == {"y": [2, 4, 6], "content_type": JSON, "accept": "text/csv",
                        "model_dir": server.env["SM_MODEL_DIR"]}
    # No Accept (or */*): the default one, as the toolkit hands it.
    assert invoke(server, b"[1]", JSON, "*/*").json()["accept"] == JSON
    assert logged(server, "batching: off: transform_fn"), server.log()


def test_a_transform_fn_without_context_answers_in_the_accepted_type(servers):
    server = servers["plain_transform"]
    r = invoke(server, b"abcd", "application/octet-stream", "text/plain")
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/plain")
    assert r.text == "transformed 4 bytes for text/plain"


# ---------------------------------------------------------------- items 3 and 4: loading, JSON answers


def test_a_lone_torchscript_pth_serves_without_a_script_and_json_answers_in_the_requests_form(servers):
    server = servers["lone"]
    data = batch()
    torch.manual_seed(0)  # the traced file's weights
    expected = Mnist().eval()(torch.from_numpy(data)).detach().numpy()
    bare = invoke(server, json.dumps(data.tolist()).encode(), JSON, JSON)
    assert bare.status_code == 200, bare.text
    assert np.asarray(bare.json()).shape == (ROWS, 10)  # what the SDK's JSONDeserializer users read
    np.testing.assert_allclose(np.asarray(bare.json()), expected, rtol=1e-4, atol=1e-5)
    wrapped = invoke(server, json.dumps({"instances": data.tolist()}).encode(), JSON, JSON)
    assert wrapped.json() == {"predictions": bare.json()}
    # .npy and CSV in, JSON out: bare, as the toolkit's test_serve_npy and test_serve_csv read it.
    assert np.asarray(invoke(server, npy(data), NPY, JSON).json()).shape == (ROWS, 10)
    rows = "\n".join(",".join(str(v) for v in row) for row in data.reshape(ROWS, -1).tolist())
    flat = invoke(server, rows.encode(), CSV, JSON)
    assert flat.status_code == 200 and np.asarray(flat.json()).shape == (ROWS, 10), flat.text
    assert np.load(io.BytesIO(invoke(server, npy(data), NPY, NPY).content)).shape == (ROWS, 10)
    assert logged(server, "model.pth"), server.log()


# ---------------------------------------------------------------- item 5: its settings


def test_the_toolkits_settings_are_said_at_start(servers):
    log = servers["context"].log()
    assert ("SAGEMAKER_TS_BATCH_SIZE=4 is overridden by SMSERVE_MAX_BATCH_SIZE=8 (both are set: SMSERVE_MAX_BATCH_SIZE "
            "wins)") in log
    assert "SAGEMAKER_TS_MAX_BATCH_DELAY=20 sets SMSERVE_MAX_BATCH_DELAY_MS's setting" in log
    assert "SAGEMAKER_TS_MIN_WORKERS is not used by this server; instead: SAGEMAKER_MODEL_SERVER_WORKERS" in log


def test_past_the_response_timeout_the_client_gets_a_504_and_the_worker_goes_on(servers):
    server = servers["deadline"]
    workers = worker_pids(server)
    started = time.monotonic()
    late = invoke(server, json.dumps({"x": [1], "sleep": 2.5}).encode(), JSON)
    waited = time.monotonic() - started
    assert late.status_code == 504, late.text
    assert "did not answer within 1 s" in late.json()["error"] and waited < 2.0, waited
    time.sleep(2)  # the late pass ends on the inference thread meanwhile
    r = invoke(server, json.dumps({"x": [1, 2]}).encode(), JSON)
    assert r.status_code == 200 and r.json() == [2.0, 4.0], r.text
    assert requests.get(server.url + "/ping", timeout=5).status_code == 200
    assert worker_pids(server) == workers


# ---------------------------------------------------------------- item 7: multi-model answers


def test_multi_model_answers_as_the_toolkits_server(servers):
    server, models = servers["mme"], servers["models"]
    r = requests.post(server.url + "/models", json={"model_name": "banana", "url": str(models / "banana")}, timeout=60)
    assert r.status_code == 404 and "error" in r.json()
    r = requests.post(server.url + "/models", json={"model_name": "traced", "url": str(models / "traced")}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json() == {"status": 'Model "traced" Version: 1.0 registered with 1 initial workers'}
    # Loaded already: 409 whatever the url says (the toolkit's test sends a relative one).
    r = requests.post(server.url + "/models", json={"model_name": "traced", "url": "traced"}, timeout=60)
    assert r.status_code == 409, r.text
    r = requests.post(server.url + "/models/traced/invoke", data=npy(batch()), headers={"Content-Type": NPY},
                      timeout=60)
    assert r.status_code == 200 and np.asarray(r.json()).shape == (ROWS, 10), r.text
    r = requests.delete(server.url + "/models/traced", timeout=60)
    assert r.status_code == 200 and r.json() == {"status": 'Model "traced" unregistered'}
    assert requests.delete(server.url + "/models/traced", timeout=60).status_code == 404

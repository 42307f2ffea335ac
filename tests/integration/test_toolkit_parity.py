"""Scripts written for AWS's PyTorch containers, served unchanged by real gunicorns, answer
what those containers answer for the same bytes (issue 47): each answer is compared with
the toolkit's own handler run in-process on the same script (tests/helpers/
toolkit_reference.py), not with an answer written here. Where this server differs on
purpose (a failing hook is a 4xx/5xx with a JSON {"error": ...} naming it), the test says
so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.helpers.lazy_servers import LazyServers, started
from tests.helpers.server import ServerProcess
from tests.helpers.toolkit_reference import Toolkit

JSON, CSV, NPY = "application/json", "text/csv", "application/x-npy"

# Item 1: the body's type, as scripts use it: lines of a CSV body, words of a JSON one.
TEXTS = '''
import json
import re


def model_fn(model_dir):
    return "model"


def input_fn(request_body, request_content_type):
    kind = type(request_body).__name__
    if request_content_type == "text/csv":
        return {"type": kind, "rows": [line.split(",") for line in request_body.splitlines()]}
    if request_content_type == "application/json":
        return {"type": kind, "words": re.findall(r"[a-z]+", request_body)}
    return {"type": kind, "size": len(request_body)}


def predict_fn(data, model):
    return data


def output_fn(prediction, accept):
    return json.dumps(prediction)
'''

# Item 3: what output_fn may return; the request names which.
ANSWERS = '''
import json

ANSWERS = {"dict": {"label": "cat", "score": 0.5}, "list": [1, 2.5], "number": 3.5, "none": None, "str": "h\\u00e9llo",
           "bytes": b"\\x00\\x01", "tuple": ('{"a": 1}', "application/x-custom"),
           "tuple_dict": ({"a": 1}, "application/vnd.custom+json")}


def model_fn(model_dir):
    return "model"


def input_fn(request_body, request_content_type):
    return json.loads(request_body)


def predict_fn(data, model):
    return data


def output_fn(prediction, accept):
    return ANSWERS[prediction]
'''

# Item 3: a predict_fn answering one number (or a list of them), with no output_fn.
SCALAR = '''
import torch


def model_fn(model_dir):
    model = torch.nn.Sequential(torch.nn.Linear(2, 1), torch.nn.Flatten(0))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, 2.0]]))
        model[0].bias.fill_(0.5)
    return model


def predict_fn(data, model):
    out = model(data.float()).detach().numpy()
    return out[0] if len(out) == 1 else out.tolist()
'''

# Item 2: model_fn hands back a model in training mode (dropout), and no predict_fn.
DROPOUT = '''
import torch


def model_fn(model_dir):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.5))
'''

# Item 4: a script built on the toolkit's own package, its decoder reading the str body.
USES_TOOLKIT = '''
import torch
from sagemaker_inference import content_types, decoder, default_inference_handler, encoder, errors


class Handler(default_inference_handler.DefaultInferenceHandler):
    pass


def model_fn(model_dir):
    return torch.nn.Identity()


def input_fn(input_data, content_type):
    if content_type not in (content_types.JSON, content_types.CSV):
        raise errors.GenericInferenceToolkitError(415, "send JSON or CSV")
    return torch.from_numpy(decoder.decode(input_data, content_type)).float()


def predict_fn(data, model):
    with torch.no_grad():
        return model(data) * 2


def output_fn(prediction, accept):
    return encoder.encode(prediction.numpy(), accept), accept
'''

# Issue 45, item 19: a transform_fn-only script's failures, named after it.
TRANSFORM = '''
import json


def model_fn(model_dir):
    return "model"


def transform_fn(model, request_body, content_type, accept):
    request = json.loads(request_body)
    if request == "raise":
        raise ValueError("no such thing")
    if request == "set":
        return {1, 2}
    if request == "short":
        return ("only",)
    return {"echo": request}
'''


def model(root: Path, name: str, script: str, program: str) -> Path:
    path = root / name
    (path / "code").mkdir(parents=True)
    (path / "code" / program).write_text(script)
    return path


SCRIPTS = {"texts": (TEXTS, "texts_script.py"), "answers": (ANSWERS, "answers_script.py"),
           "scalar": (SCALAR, "scalar_script.py"), "dropout": (DROPOUT, "dropout_script.py"),
           "uses_toolkit": (USES_TOOLKIT, "uses_toolkit_script.py"), "transform": (TRANSFORM, "transform_script.py"),
           "texts_in_processes": (TEXTS, "texts_script.py")}
# Where the hooks run in processes of their own, those decode the body.
ENV = {"texts_in_processes": {"SMSERVE_HOOK_PROCESSES": "1"}}


class Served:
    """served[name]: (that script's server, started when a test first asks for it, and the
    toolkit's handler on the same script)."""

    def __init__(self, servers: LazyServers, toolkits: dict[str, Toolkit]):
        self.servers, self.toolkits = servers, toolkits

    def __getitem__(self, name: str) -> tuple[ServerProcess, Toolkit]:
        return self.servers[name], self.toolkits[name]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    logs = tmp_path_factory.mktemp("parity-logs")
    makers, toolkits = {}, {}
    for name, (script, program) in SCRIPTS.items():
        path = model(root, name, script, program)
        env = {"SAGEMAKER_PROGRAM": program, **ENV.get(name, {})}
        makers[name] = lambda path=path, env=env, name=name: started(ServerProcess(path, env, log_path=logs / f"{name}.log"))
        toolkits[name] = Toolkit(path, program)
    servers = LazyServers(makers)
    yield Served(servers, toolkits)
    servers.stop()


def ours(server: ServerProcess, body: bytes, content_type: str, accept: str | None = None) -> requests.Response:
    headers = {"Content-Type": content_type, **({"Accept": accept} if accept else {})}
    return requests.post(server.url + "/invocations", data=body, headers=headers, timeout=60)


def same_answer(served, name: str, body: bytes, content_type: str, accept: str | None = None,
                json_only: bool = False) -> requests.Response:
    """The server's answer, checked against the toolkit's: the same bytes, or (json_only:
    the built-in encoder's, whose JSON is compact, in float32's shortest digits) the
    same JSON."""
    server, toolkit = served[name]
    expected = toolkit.answer(body, content_type, accept)
    r = ours(server, body, content_type, accept)
    if json_only:
        assert (r.status_code, r.json()) == (expected.status, json.loads(expected.body)), (r.text, expected)
    else:
        assert (r.status_code, r.content) == (expected.status, expected.body), (r.text, expected)
    assert r.headers["Content-Type"].split(";")[0] == expected.content_type
    return r


@pytest.mark.parametrize("texts", ["texts", "texts_in_processes"])
def test_input_fn_gets_a_str_for_json_and_csv_and_bytes_otherwise(served, texts):
    assert same_answer(served, texts, b"a,b\nc,d\n", CSV, JSON).json() == {"type": "str",
                                                                              "rows": [["a", "b"], ["c", "d"]]}
    assert same_answer(served, texts, b'{"text": "the cat sat"}', JSON).json()["type"] == "str"
    assert same_answer(served, texts, b"\x00\x01\x02", "application/octet-stream").json() == {"type": "bytes",
                                                                                                 "size": 3}
    # With a parameter, the type is not one the toolkit decodes: bytes, as there.
    assert same_answer(served, texts, b'{"text": "x"}', "application/json; charset=utf-8").json()["type"] == "bytes"


@pytest.mark.parametrize("texts", ["texts", "texts_in_processes"])
def test_a_json_or_csv_body_that_is_not_utf8_is_a_400_naming_the_body(served, texts):
    server, _ = served[texts]
    r = ours(server, b'{"text": "\xff\xfe"}', JSON)
    assert r.status_code == 400 and "not UTF-8" in r.json()["error"] and "input_fn" in r.json()["error"], r.text


def test_what_output_fn_returns_is_written_as_torchserve_writes_it(served):
    for kind in ("dict", "list", "number", "none", "str", "bytes", "tuple", "tuple_dict"):
        for accept in (JSON, CSV):
            same_answer(served, "answers", json.dumps(kind).encode(), JSON, accept)


def test_a_predict_fn_answering_one_number_without_output_fn_answers_it(served):
    assert same_answer(served, "scalar", b"[[1.0, 2.0]]", JSON, JSON).content == b"5.5"
    assert same_answer(served, "scalar", b"[[1.0, 2.0], [2.0, 4.0]]", JSON, JSON, json_only=True).json() == [5.5, 10.5]


def test_without_predict_fn_the_model_runs_in_eval_mode_as_the_toolkits_default(served):
    server, toolkit = served["dropout"]
    body = json.dumps([list(np.linspace(-1, 1, 64))]).encode()
    first, second = ours(server, body, JSON, JSON), ours(server, body, JSON, JSON)
    assert first.status_code == second.status_code == 200, first.text
    assert first.json() == second.json()  # dropout off: the same answer twice
    expected = toolkit.answer(body, JSON, JSON)
    np.testing.assert_allclose(np.asarray(first.json()), np.asarray(json.loads(expected.body)), rtol=1e-5, atol=1e-6)


def test_a_script_importing_sagemaker_inference_serves_and_its_errors_status_is_answered(served):
    same_answer(served, "uses_toolkit", b"[[1.0, 2.5]]", JSON, JSON)
    same_answer(served, "uses_toolkit", b"1.0,2.5\n3.0,4.0\n", CSV, CSV)
    server, toolkit = served["uses_toolkit"]
    r = ours(server, b"\x00", "application/octet-stream", JSON)
    assert r.status_code == toolkit.answer(b"\x00", "application/octet-stream", JSON).status == 415, r.text
    assert r.json()["error"] == "input_fn: send JSON or CSV"


@pytest.mark.parametrize("request_", ["raise", "set", "short"])
def test_a_transform_fn_scripts_failures_are_named_after_transform_fn(served, request_):
    server, toolkit = served["transform"]
    body = json.dumps(request_).encode()
    r = ours(server, body, JSON)
    assert r.status_code == 500 and toolkit.answer(body, JSON).status >= 500, r.text  # a server error there too
    assert r.json()["error"].startswith("transform_fn failed: "), r.text
    same_answer(served, "transform", b'"fine"', JSON)
    r = ours(server, b'"\xff"', JSON)
    assert r.status_code == 400 and "transform_fn" in r.json()["error"], r.text
    assert not any(word in server.log() for word in ("predict_fn failed", "output_fn failed", "internal error"))


def test_sagemaker_program_naming_a_missing_script_stops_serve_naming_it_and_what_code_holds(tmp_path):
    path = model(tmp_path, "missing", TEXTS, "inference.py")
    (path / "code" / "helpers.py").write_text("")
    server = ServerProcess(path, {"SAGEMAKER_PROGRAM": "predictor.py"}, log_path=tmp_path / "serve.log")
    server.start(wait=False)
    try:
        assert server.proc.wait(timeout=120) == 2
    finally:
        server.terminate(timeout=10)
    log = server.log()
    assert "SAGEMAKER_PROGRAM=predictor.py" in log and "holds helpers.py, inference.py" in log, log

"""The SageMaker contract against a real gunicorn process serving the example model."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import requests

from tests.helpers.models import ECHO_HOOKS, model_dir_with
from tests.helpers.server import SERVE, ServerProcess, copy_model, pending_requests, wait_until, logged

JSON, CSV, JSONL, NPY = "application/json", "text/csv", "application/jsonlines", "application/x-npy"


def encode(x: np.ndarray, content_type: str) -> bytes:
    if content_type == JSON:
        return json.dumps({"instances": x.tolist()}).encode()
    if content_type == CSV:
        return "".join(",".join(str(v) for v in row) + "\n" for row in x.tolist()).encode()
    if content_type == JSONL:
        return "".join(json.dumps(row) + "\n" for row in x.tolist()).encode()
    buffer = io.BytesIO()
    np.save(buffer, x)
    return buffer.getvalue()


def decode(response: requests.Response, wrapped: bool = False) -> np.ndarray:
    """wrapped: the request wrapped its records ({"instances": ...}), so a JSON answer
    wraps them too ({"predictions": ...}); any other request's is the bare array."""
    kind = response.headers["Content-Type"].split(";")[0]
    if kind == JSON:
        return np.array(response.json()["predictions"] if wrapped else response.json())
    if kind == CSV:
        return np.array([[float(v) for v in line.split(",")] for line in response.text.splitlines()])
    if kind == JSONL:
        return np.array([json.loads(line) for line in response.text.splitlines()])
    assert kind == NPY, kind
    return np.load(io.BytesIO(response.content), allow_pickle=False)


def assert_error(response: requests.Response, status: int, *words: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/json"
    message = response.json()["error"]
    for word in words:
        assert word in message, message
    return message


def test_ping_is_200_with_empty_body(example_server):
    response = requests.get(example_server.url + "/ping")
    assert response.status_code == 200
    assert response.content == b""


def test_execution_parameters(example_server):
    params = requests.get(example_server.url + "/execution-parameters").json()
    assert params["BatchStrategy"] == "MULTI_RECORD"
    assert params["MaxConcurrentTransforms"] >= 1 and params["MaxPayloadInMB"] >= 1
    assert params["MaxConcurrentTransforms"] * params["MaxPayloadInMB"] <= 100


@pytest.mark.parametrize("content_type", [JSON, CSV, JSONL, NPY])
@pytest.mark.parametrize("accept", [JSON, CSV, JSONL, NPY])
def test_every_content_type_and_accept_gives_the_right_classes(example_server, digits, content_type, accept):
    x, y = digits
    x, y = x[:40], y[:40]
    response = requests.post(
        example_server.url + "/invocations",
        data=encode(x, content_type),
        headers={"Content-Type": content_type, "Accept": accept},
    )
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].split(";")[0] == accept
    probabilities = decode(response, wrapped=content_type == JSON)
    assert probabilities.shape == (40, 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1, rtol=1e-4)
    assert (probabilities.argmax(axis=1) == y).mean() >= 0.95


def test_one_record_without_batch_dimension(example_server, digits):
    x, y = digits
    response = requests.post(example_server.url + "/invocations", json=x[0].tolist())
    assert response.status_code == 200, response.text
    assert np.argmax(response.json()[0]) == y[0]  # a bare list answers the bare list


def test_csv_and_jsonlines_give_one_line_per_record(example_server, digits):
    x, _ = digits
    for content_type in (CSV, JSONL):
        body = encode(x[:7], content_type).replace(b"\n", b"\r\n") + b"\n\n"
        response = requests.post(example_server.url + "/invocations", data=body,
                                 headers={"Content-Type": content_type, "Accept": content_type})
        assert response.status_code == 200, response.text
        assert response.text.endswith("\n")
        assert len(response.text.splitlines()) == 7


@pytest.mark.parametrize(
    "accept, expected",
    [
        ("text/csv;q=0.5, application/jsonlines;q=0.9", JSONL),
        ("application/json;q=0.1, application/x-npy", NPY),
        ("*/*", JSON),
        ("text/*", CSV),
        ("image/png, text/csv;q=0.2", CSV),
        ("application/json; charset=utf-8", JSON),
        ("text/csv; header=present", CSV),
    ],
)
def test_accept_negotiation_honours_q_values(example_server, digits, accept, expected):
    x, _ = digits
    response = requests.post(example_server.url + "/invocations", json={"instances": x[:2].tolist()},
                             headers={"Accept": accept})
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].split(";")[0] == expected


def test_unacceptable_accept_is_406(example_server, digits):
    x, _ = digits
    response = requests.post(example_server.url + "/invocations", json=x[:1].tolist(),
                             headers={"Accept": "image/png"})
    assert_error(response, 406, "image/png", "application/json")


def test_unknown_content_type_is_415(example_server):
    response = requests.post(example_server.url + "/invocations", data=b"<x/>",
                             headers={"Content-Type": "application/xml"})
    assert_error(response, 415, "application/xml", "text/csv")


def _pickled_npy() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    return buffer.getvalue()


BAD_REQUESTS = [
    ("malformed JSON", JSON, b'{"instances": [[1, 2,', "not valid JSON"),
    ("ragged CSV", CSV, b"1,2,3\n4,5\n", "line 2"),
    ("non-numeric CSV", CSV, b"1,2\n3,abc\n", "line 2"),
    ("pickled npy", NPY, _pickled_npy(), "never unpickled"),
    ("truncated npy", NPY, b"\x93NUMPY\x01\x00", "npy"),
    ("wrong shape", JSON, json.dumps({"instances": [[1.0] * 63]}).encode(), "pixels"),
    ("ragged JSON", JSON, json.dumps({"instances": [[1.0] * 64, [1.0] * 3]}).encode(), "ragged"),
    ("strings in JSON", JSON, json.dumps({"instances": [["a"] * 64]}).encode(), "numbers"),
    ("JSON object without records", JSON, b'{"foo": 1}', "instances"),
    ("bad JSON Lines record", JSONL, b"[1,2]\n{oops\n", "line 2"),
    ("empty body", JSON, b"", "empty"),
    ("blank line inside CSV", CSV, b"1,2\n\n3,4\n", "line 2"),
    ("integer too large for a float", JSON, b"[[" + b"1" * 400 + b"]]", "numbers"),
    ("npy header cut short", NPY, b"\x93NUMPY\x01\x00\x76\x00{'descr': '<f4', 'fortran_order': False, 'shape': (1, 64),",
     "npy"),
    ("npy with a negative dimension", NPY,
     b"\x93NUMPY\x01\x00\x76\x00" + b"{'descr': '<f4', 'fortran_order': False, 'shape': (-1, -256), }".ljust(117) + b"\n"
     + b"\0" * 1024, "shape"),
    ("not UTF-8", CSV, b"\xff\xfe1,2\n", "UTF-8"),
]


@pytest.mark.parametrize("name, content_type, body, word", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_input_is_400_and_the_server_keeps_serving(example_server, digits, name, content_type, body, word):
    response = requests.post(example_server.url + "/invocations", data=body, headers={"Content-Type": content_type})
    assert_error(response, 400, word)
    x, y = digits
    good = requests.post(example_server.url + "/invocations", json={"instances": x[:5].tolist()})
    assert good.status_code == 200
    assert (np.argmax(good.json()["predictions"], axis=1) == y[:5]).all()


def test_unknown_path_and_method_are_json_errors(example_server):
    assert_error(requests.get(example_server.url + "/nope"), 404)
    assert_error(requests.get(example_server.url + "/invocations"), 405)


@pytest.mark.serial
def test_ping_answers_while_a_cpu_bound_predict_fn_runs(make_server, tmp_path):
    server = make_server(model_dir_with(tmp_path, ECHO_HOOKS, "echo"))
    result = {}

    def invoke():
        # predict_fn holds the GIL in pure Python for 1.5 s (20 pings take about 1 s)
        result["response"] = requests.post(server.url + "/invocations", json={"x": [1, 2], "spin": 1.5})

    worker = threading.Thread(target=invoke)
    worker.start()
    assert wait_until(lambda: pending_requests(server) == 1, timeout=15, interval=0.05)  # inside predict_fn
    pings = []
    while worker.is_alive() and len(pings) < 20:
        started = time.monotonic()
        status = requests.get(server.url + "/ping", timeout=5).status_code
        pings.append((status, time.monotonic() - started, worker.is_alive()))
        time.sleep(0.05)
    worker.join()
    answered_during = [p for p in pings if p[2]]
    assert answered_during, "no ping completed while the slow request was in flight"
    assert all(status == 200 for status, _, _ in answered_during)
    assert result["response"].status_code == 200
    assert result["response"].json() == [2.0, 4.0]


# Every step a hook of its own; model_fn and predict_fn start processes, as model code
# may (one server for the tests of both).
HOOKS = '''
import ctypes.util
import json
import os
import subprocess
import sys

import torch


def model_fn(model_dir):
    # What CUDA builds of torch do on import (ldconfig via find_library), on the
    # inference thread, away from gevent's loop.
    ctypes.util.find_library("dl")
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    # What torch.compile's compiler workers do: a process whose output is captured, then
    # another one (under gevent's os.close patch the second waited forever on its pipe).
    for _ in range(2):
        assert subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True).stdout.strip() == b"1"
    program = torch.export.load(os.path.join(model_dir, "model.pt2"))
    return program.module()


def input_fn(body, content_type):
    if content_type != "application/json":
        raise ValueError("this model takes JSON only")
    return torch.tensor(json.loads(body)["pixels"], dtype=torch.float32)


def predict_fn(data, model):
    for _ in range(2):
        subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, check=True)
    with torch.inference_mode():
        return model(data).argmax(dim=1)


def output_fn(prediction, accept):
    return json.dumps({"digits": prediction.tolist()}), "application/json"
'''


@pytest.fixture(scope="module")
def hooks_server(example_model_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("hooks")
    with ServerProcess(copy_model(example_model_dir, work / "model", HOOKS), log_path=work / "server.log") as server:
        yield server


def test_sagemaker_hooks_replace_each_step(hooks_server, digits):
    server = hooks_server
    x, y = digits
    response = requests.post(server.url + "/invocations", json={"pixels": x[:10].tolist()})
    assert response.status_code == 200, response.text
    assert response.json() == {"digits": y[:10].tolist()}
    rejected = requests.post(server.url + "/invocations", data=b"1,2", headers={"Content-Type": "text/csv"})
    assert_error(rejected, 400, "JSON only")
    assert requests.post(server.url + "/invocations", json={"pixels": x[:1].tolist()}).status_code == 200


def test_torchscript_model(make_server, tmp_path, example_model_dir, digits):
    import torch

    from model.digits import DigitsClassifier

    program = torch.export.load(str(example_model_dir / "model.pt2"))
    net = DigitsClassifier()
    net.load_state_dict({k: v for k, v in program.state_dict.items()})
    model_dir = tmp_path / "ts"
    model_dir.mkdir()
    torch.jit.trace(net.eval(), torch.zeros(2, 64)).save(str(model_dir / "model.pt"))
    (model_dir / "metadata.json").write_text((example_model_dir / "metadata.json").read_text())
    server = make_server(model_dir)
    x, y = digits
    response = requests.post(server.url + "/invocations", data=encode(x, CSV), headers={"Content-Type": CSV})
    assert response.status_code == 200, response.text
    expected = program.module()(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(decode(response), expected, rtol=1e-4, atol=1e-6)
    assert (decode(response).argmax(axis=1) == y).mean() >= 0.95


def test_a_model_that_fails_to_load_makes_ping_500(make_server, tmp_path):
    model_dir = tmp_path / "broken"
    model_dir.mkdir()
    (model_dir / "model.pt2").write_bytes(b"not a model")
    server = make_server(model_dir, wait=False)
    def settled():
        try:
            response = requests.get(server.url + "/ping", timeout=2)
        except requests.ConnectionError:
            return None
        # (In a list: requests makes a 5xx response false, and wait_until waits for true.)
        return [response] if response.status_code != 503 else None

    found = wait_until(settled, timeout=60, interval=0.2)
    assert found, "/ping still says loading"
    (response,) = found
    assert_error(response, 500, "failed to load")
    assert logged(server, "model failed to load"), server.log()


def test_serve_train_exits_nonzero_with_its_reason():
    result = subprocess.run([sys.executable, str(SERVE), "train"], capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert "train" in result.stderr and "serve" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "variable, value",
    [
        ("SAGEMAKER_MODEL_SERVER_WORKERS", "zero"),
        ("SAGEMAKER_BIND_TO_PORT", "99999"),
        ("SAGEMAKER_BATCH", "maybe"),
        ("SAGEMAKER_BATCH_STRATEGY", "ALL_AT_ONCE"),
        ("SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT", "image/png"),
    ],
)
def test_an_invalid_setting_stops_serve_naming_the_variable(example_model_dir, variable, value):
    env = {"SM_MODEL_DIR": str(example_model_dir), variable: value, "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, str(SERVE), "serve"], capture_output=True, text=True, env=env, timeout=30)
    assert result.returncode != 0
    assert variable in result.stderr


def test_model_code_may_start_processes_while_loading(hooks_server, digits):
    """HOOKS' model_fn and predict_fn start processes, as CUDA builds of torch and
    torch.compile do: the model loads and answers."""
    x, y = digits
    response = requests.post(hooks_server.url + "/invocations", json={"pixels": x[:5].tolist()})
    assert response.status_code == 200, response.text
    assert response.json() == {"digits": y[:5].tolist()}


INPUT_FN_ONLY = '''
import numpy as np
import torch


def input_fn(body, content_type):
    # An "image" format of our own: 64 bytes of pixel values.
    if content_type != "application/x-digit":
        raise ValueError(f"unexpected {content_type}")
    return torch.from_numpy(np.frombuffer(body, dtype=np.uint8).astype(np.float32).reshape(-1, 64))
'''


def test_input_fn_alone_takes_its_own_content_type_and_the_rest_is_built_in(make_server, model_copy, digits):
    server = make_server(model_copy(INPUT_FN_ONLY))
    x, y = digits
    body = x[:4].astype(np.uint8).tobytes()
    for accept, parse in ((CSV, decode), (JSON, decode)):
        response = requests.post(server.url + "/invocations", data=body,
                                 headers={"Content-Type": "application/x-digit", "Accept": accept})
        assert response.status_code == 200, response.text
        assert (parse(response).argmax(axis=1) == y[:4]).all()
    response = requests.post(server.url + "/invocations", data=body,
                             headers={"Content-Type": "application/x-digit", "Accept": "image/png"})
    assert_error(response, 406, "image/png")

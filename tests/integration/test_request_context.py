"""The hooks' request context (issue 22 item 2) and caller-chosen WebSocket paths (item
4), in real gunicorns of 2 workers: each request's own context under concurrent load,
batched models included; custom attributes sent back (streamed answers too); the
target model of a multi-model invoke; a session on a path and query the caller chose
(on a server of one worker: a WebSocket session is the accepting worker's alone, and a
second would prove nothing more).
Each server is started when a test first asks for it.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from websockets.sync.client import connect as ws_connect

from tests.helpers.client import post
from tests.helpers.lazy_servers import LazyServers, started
from tests.helpers.server import ServerProcess, wait_until, ws_url
from tests.helpers.models import echo_hooks, model_dir_with
from tests.integration.ws_raw import Conn

WORKERS = {"SAGEMAKER_MODEL_SERVER_WORKERS": "2"}
ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
PIXELS = [[float(i % 17) for i in range(64)]]

# Every hook takes the context: input_fn and predict_fn note what they saw, output_fn
# echoes it all and sets the response's custom attributes. {"stream": n} streams n
# items (the attributes set before the first item, or after it with "late").
CONTEXT_HOOKS = '''
import json
import time


def model_fn(model_dir):
    return "context"


def input_fn(body, content_type, context):
    data = json.loads(body)
    data["input_saw"] = context.custom_attributes
    return data


def predict_fn(data, model, context):
    time.sleep(float(data.get("sleep", 0)))
    data["predict_saw"] = context.custom_attributes
    if data.get("stream"):
        return _items(data, context)
    return data


def _items(data, context):
    if not data.get("late"):
        context.response_custom_attributes = "streamed=" + (context.custom_attributes or "")
    for i in range(data["stream"]):
        yield {"item": i}
        context.response_custom_attributes = "too-late"


def output_fn(prediction, accept, context):
    if "item" in prediction:
        return json.dumps({**prediction, "attributes": context.custom_attributes}) + "\\n"
    context.response_custom_attributes = "echo=" + (context.custom_attributes or "")
    return json.dumps({
        "input_saw": prediction["input_saw"],
        "predict_saw": prediction["predict_saw"],
        "output_saw": context.custom_attributes,
        "inference_id": context.inference_id,
        "target_model": context.target_model,
        "path": context.path,
        "query": context.query,
        "x_test": context.headers.get("x-test"),
        "has_x_test": "X-Test" in context.headers,
    }), "application/json"
'''

# The example model with a predict_fn that takes the context (keyword-only, too): in a
# batched model it gets None (a pass holds many requests); unbatched, the request's.
PREDICT_WITH_CONTEXT = '''
import torch


def predict_fn(data, model, *, context):
    batched = {batched}
    if batched and context is not None:
        raise RuntimeError("a batched pass got a request's context")
    if not batched:
        context.response_custom_attributes = "predict=" + (context.custom_attributes or "")
    with torch.inference_mode():
        return model(data)
'''

# A stream_fn that tells what its context holds, then echoes.
STREAM_FN_HOOKS = '''
def model_fn(model_dir):
    return "sessions"


def stream_fn(messages, model, context):
    yield {"path": context.path, "query": context.query, "query_string": context.query_string,
           "custom_attributes": context.custom_attributes, "x_test": context.headers.get("X-Test"),
           "peer": bool(context.peer), "device": str(context.device),
           "system_properties": context.system_properties}
    for message in messages:
        yield context.path + ":" + message
'''


def example_with(parent: Path, example_model_dir: Path, name: str, hooks: str, max_batch_size: int) -> Path:
    folder = parent / name
    shutil.copytree(example_model_dir, folder)
    metadata = json.loads((folder / "metadata.json").read_text())
    metadata["max_batch_size"] = max_batch_size
    if max_batch_size == 0:  # whole tensors: the batch dimension is the shapes' own
        for spec in metadata["inputs"] + metadata["outputs"]:
            spec["shape"] = [-1, *spec["shape"]]
    (folder / "metadata.json").write_text(json.dumps(metadata))
    (folder / "code").mkdir()
    (folder / "code" / "inference.py").write_text(hooks)
    return folder


@pytest.fixture(scope="module")
def servers(tmp_path_factory, example_model_dir):
    root = tmp_path_factory.mktemp("context")
    context_model = model_dir_with(root, CONTEXT_HOOKS, "context")
    sessions_model = model_dir_with(root, STREAM_FN_HOOKS, "sessions")
    models = root / "mme"
    models.mkdir()
    model_dir_with(models, CONTEXT_HOOKS, "ctx")
    model_dir_with(models, echo_hooks(), "plain")
    example_with(models, example_model_dir, "batched", PREDICT_WITH_CONTEXT.format(batched=True), 64)
    example_with(models, example_model_dir, "whole", PREDICT_WITH_CONTEXT.format(batched=False), 0)
    logs = tmp_path_factory.mktemp("context-logs")

    def loaded(mme):
        for name in ("ctx", "plain", "batched", "whole"):
            r = requests.post(mme.url + "/models", json={"model_name": name, "url": str(models / name)}, timeout=120)
            assert r.status_code == 200, r.text

    servers = LazyServers({
        "single": lambda: started(ServerProcess(context_model, WORKERS, log_path=logs / "single.log")),
        "mme": lambda: started(ServerProcess(root / "none", {
            **WORKERS, "SAGEMAKER_MULTI_MODEL": "true", "SMSERVE_MODELS_ROOT": str(models),
            # predict_fn sleeps nothing: let requests gather.
            "SMSERVE_MAX_BATCH_DELAY_MS": "5"}, log_path=logs / "mme.log"), loaded),
        "sessions": lambda: started(ServerProcess(sessions_model, log_path=logs / "sessions.log")),
    }, sessions_dir=sessions_model)
    yield servers
    servers.stop()


def test_every_hook_sees_the_requests_headers_and_sets_its_custom_attributes(servers):
    server = servers["single"]
    r = post(server.url + "/invocations?a=1&b=", {"x": 1}, {
        ATTRIBUTES: "trace=abc,k=v", "X-Amzn-SageMaker-Inference-Id": "id-7", "X-Test": "yes"})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer == {"input_saw": "trace=abc,k=v", "predict_saw": "trace=abc,k=v", "output_saw": "trace=abc,k=v",
                      "inference_id": "id-7", "target_model": None, "path": "/invocations",
                      "query": {"a": "1", "b": ""}, "x_test": "yes", "has_x_test": True}
    assert r.headers[ATTRIBUTES] == "echo=trace=abc,k=v"


def test_a_request_without_sagemakers_headers_gets_none(servers):
    r = post(servers["single"].url + "/invocations", {"x": 1})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["input_saw"] is answer["output_saw"] is answer["inference_id"] is None
    assert answer["x_test"] is None and answer["has_x_test"] is False
    assert r.headers[ATTRIBUTES] == "echo="


def test_each_request_has_its_own_context_under_concurrent_load(servers):
    """64 threads, 640 requests over 2 workers, each with its own attributes: every
    hook of every request saw its own, and its answer carries its own back."""
    server = servers["single"]

    def one(i: int):
        attributes = f"request={i}"
        r = post(server.url + "/invocations", {"x": i, "sleep": 0.002 * (i % 3)},
                 {ATTRIBUTES: attributes, "X-Amzn-SageMaker-Inference-Id": f"id-{i}"})
        assert r.status_code == 200, r.text
        answer = r.json()
        return (answer["input_saw"], answer["predict_saw"], answer["output_saw"], answer["inference_id"],
                r.headers.get(ATTRIBUTES)), (attributes, attributes, attributes, f"id-{i}", f"echo={attributes}")

    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(one, range(640)))
    mixed = [(seen, expected) for seen, expected in results if seen != expected]
    assert not mixed, mixed[:5]


def test_a_streamed_answer_carries_the_attributes_set_before_its_first_item(servers):
    server = servers["single"]
    with requests.post(server.url + "/invocations", data=json.dumps({"stream": 3}), stream=True, timeout=60,
                       headers={"Content-Type": "application/json", ATTRIBUTES: "s=1"}) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert r.status_code == 200 and r.headers["Transfer-Encoding"] == "chunked"
    assert r.headers[ATTRIBUTES] == "streamed=s=1"
    assert lines == [{"item": i, "attributes": "s=1"} for i in range(3)]
    # Set after the first item: too late, its headers have left.
    with requests.post(server.url + "/invocations", data=json.dumps({"stream": 2, "late": True}), stream=True,
                       timeout=60, headers={"Content-Type": "application/json", ATTRIBUTES: "s=2"}) as r:
        _ = r.content  # the whole stream, to its end
    assert r.status_code == 200 and ATTRIBUTES not in r.headers


def test_multi_model_invoke_gives_each_models_hooks_the_target_model(servers):
    server = servers["mme"]
    r = post(server.url + "/models/ctx/invoke", {"x": 1},
             {"X-Amzn-SageMaker-Target-Model": "ctx.tar.gz", ATTRIBUTES: "m=1"})
    assert r.status_code == 200, r.text
    assert r.json()["target_model"] == "ctx.tar.gz" and r.json()["path"] == "/models/ctx/invoke"
    assert r.headers[ATTRIBUTES] == "echo=m=1"
    # Without SageMaker's header, the model the route names.
    assert post(server.url + "/models/ctx/invoke", {"x": 1}).json()["target_model"] == "ctx"
    # Hooks without the parameter work as ever, and send no attributes back.
    r = post(server.url + "/models/plain/invoke", {"x": [1, 2]}, {ATTRIBUTES: "m=2"})
    assert r.status_code == 200 and ATTRIBUTES not in r.headers


def test_an_unbatched_models_predict_fn_gets_the_request_a_batched_ones_none(servers):
    """The example model without input_fn or output_fn: its predict_fn runs in the
    batcher. Unbatched (max_batch_size 0), each pass is one request's, and its context
    comes along; batched, a pass holds many requests, and predict_fn gets None (it
    raises otherwise) while the requests do share passes."""
    server = servers["mme"]

    def one(name: str, i: int):
        r = post(f"{server.url}/models/{name}/invoke", {"instances": PIXELS}, {ATTRIBUTES: f"r={i}"})
        assert r.status_code == 200, r.text
        return r.headers.get(ATTRIBUTES)

    with ThreadPoolExecutor(32) as pool:
        whole = list(pool.map(lambda i: one("whole", i), range(200)))
        batched = list(pool.map(lambda i: one("batched", i), range(400)))
    assert whole == [f"predict=r={i}" for i in range(200)]
    assert batched == [None] * 400

    def totals() -> tuple[float, float] | None:
        # (inferences, batches) of the batched model, once the other worker's counts,
        # flushed every second, have come in.
        text = requests.get(server.url + "/metrics", timeout=10).text
        found = [sum(float(v) for v in re.findall(rf'^{name}{{[^}}]*model="batched"[^}}]*}} (\S+)$', text, re.M))
                 for name in ("smserve_inferences_total", "smserve_batches_total")]
        return tuple(found) if found[0] >= 400 else None

    found = wait_until(totals, timeout=10, interval=0.2)
    assert found, "the batched model's 400 inferences never showed in /metrics"
    inferences, batches = found
    assert batches < inferences  # requests did share passes


# ---------------------------------------------------------------- caller-chosen paths


def test_a_stream_fn_session_on_a_path_and_query_the_caller_chose(servers):
    server = servers["sessions"]
    url = ws_url(server, "mode=chat&lang=en", path="/chat/v1")
    with ws_connect(url, additional_headers={ATTRIBUTES: "ws=1", "X-Test": "t"}) as ws:
        hello = json.loads(ws.recv(timeout=30))
        ws.send("hi")
        assert ws.recv(timeout=30) == "/chat/v1:hi"
    assert hello == {"path": "/chat/v1", "query": {"mode": "chat", "lang": "en"}, "query_string": "mode=chat&lang=en",
                     "custom_attributes": "ws=1", "x_test": "t", "peer": True, "device": "cpu",
                     # As every other hook's context has it (the toolkit's: no GPU here).
                     "system_properties": {"model_dir": str(servers["sessions_dir"]), "gpu_id": None}}
    # SageMaker's own path still opens one.
    with ws_connect(ws_url(server)) as ws:
        assert json.loads(ws.recv(timeout=30))["path"] == "/invocations-bidirectional-stream"


def test_a_default_session_on_a_chosen_path_gives_the_hooks_its_path_and_query(servers):
    """A model whose hooks take a context reads its own query options (not refused)."""
    server = servers["single"]
    with ws_connect(ws_url(server, "mode=fast", path="/sessions/fast"),
                    additional_headers={ATTRIBUTES: "d=1"}) as ws:
        for i in range(3):
            ws.send(json.dumps({"x": i}))
            answer = json.loads(ws.recv(timeout=30))
            assert answer["path"] == "/sessions/fast" and answer["query"] == {"mode": "fast"}
            assert answer["input_saw"] == answer["output_saw"] == "d=1"


def test_a_plain_request_to_a_sessions_path_is_a_json_404(servers):
    for server in (servers["sessions"], servers["single"]):
        r = requests.get(server.url + "/chat/v1?mode=chat", timeout=10)
        assert r.status_code == 404 and "no route" in r.json()["error"]
        r = requests.post(server.url + "/chat/v1", data=b"{}", timeout=10)
        assert r.status_code == 404


def handshake_status(port: int, path: str, method: str = "GET") -> bytes:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                     "Content-Length: 0\r\n\r\n".encode())
        return Conn(sock).response_head()
    finally:
        sock.close()


def test_a_route_with_an_upgrade_header_is_that_route_not_a_session(servers):
    server = servers["sessions"]
    assert handshake_status(server.port, "/ping").startswith(b"HTTP/1.1 200")
    assert handshake_status(server.port, "/ping", "POST").startswith(b"HTTP/1.1 200")
    # /invocations is a route (POST): a GET handshake there is its 405, not a session.
    assert handshake_status(server.port, "/invocations").startswith(b"HTTP/1.1 405")
    assert handshake_status(server.port, "/v2/models/model/ready").split(b" ")[1] != b"101"
    # Any other path switches.
    assert handshake_status(server.port, "/anything/else?x=1").startswith(b"HTTP/1.1 101")
    # A handshake is a GET: anything else to a path of no route is that path's 404.
    assert handshake_status(server.port, "/anything", "POST").startswith(b"HTTP/1.1 404")


def test_a_multi_model_endpoint_opens_no_session_on_other_paths(servers):
    assert handshake_status(servers["mme"].port, "/chat").startswith(b"HTTP/1.1 404")

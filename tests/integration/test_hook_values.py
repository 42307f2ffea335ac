"""Whatever a model's hook returns gets an answer, and no worker dies of it: every torch
dtype, every layout (sparse, nested, meta, views, expanded, requires_grad, a Parameter, a
Tensor subclass), numpy's byte orders and odd arrays, 0-d values, and containers of them,
from input_fn, predict_fn and output_fn. Each alone and beside ordinary requests (inline
passes on the loop's thread and passes on the inference thread alike), as a session's
state, and on a multi-model endpoint, of one worker a server (every value reaches the
one worker; it must outlive them all). After all of it the worker is the same process
(torch's errors on a greenlet's stack were SIGSEGV: engine/runtime/main_lane.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.helpers.client import post
from tests.helpers.lazy_servers import LazyServers, started
from tests.helpers.server import ServerProcess, worker_pids
from tests.helpers.models import hook_values_model, hook_values_module

VALUES = hook_values_module()
KINDS = VALUES.kinds()
PLAIN_ANSWER = [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]  # input_fn read the body: bare
# What the identity model answers a value with, whoever it runs with: these are dense
# numbers once made numpy's (bfloat16 and float8 as float32, quantized dequantized,
# sparse densified, big-endian in the machine's order).
ANSWERED = {f"dtype:{name}" for name in ("bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32",
                                         "uint64", "float16", "bfloat16", "float32", "float64", "qint8", "quint8",
                                         "qint32")} | {
    "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "strided_view", "transposed", "expanded",
    "flipped", "neg_view", "requires_grad", "parameter", "subclass", "channels_last", "zero_rows", "zero_width",
    "np_big_endian_f4", "np_big_endian_i8", "np_fortran", "np_reversed", "np_read_only", "np_float16"}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Each started when a test first asks for it, its worker's pid noted then."""
    root = tmp_path_factory.mktemp("hook-values")
    logs = tmp_path_factory.mktemp("hook-values-logs")
    values = hook_values_model(root, "values")
    hook_values_model(root, "predicted", predicted=True)

    def noted(server):
        server.first_workers = worker_pids(server)
        assert len(server.first_workers) == 1

    def loaded(server):
        for name in ("values", "predicted"):
            r = requests.post(server.url + "/models", json={"model_name": name, "url": str(root / name)}, timeout=120)
            assert r.status_code == 200, r.text
        noted(server)

    servers = LazyServers({
        "single": lambda: started(ServerProcess(values, log_path=logs / "single.log"), noted),
        # Two torch threads: no pass runs inline there, every one on the inference thread.
        "multi": lambda: started(ServerProcess(root / "none", {
            "SMSERVE_TORCH_THREADS": "2", "SAGEMAKER_MULTI_MODEL": "true", "SMSERVE_MODELS_ROOT": str(root)},
            log_path=logs / "multi.log"), loaded),
    })
    yield servers
    servers.stop()


def answered(r: requests.Response, kind: str) -> tuple[int, str]:
    """(status, body) of an answer that is a real one: a 200, or an error that says
    what went wrong (never the route's catch-all for an error nobody named)."""
    assert r.status_code == 200 or 400 <= r.status_code < 600, (kind, r.status_code)
    if r.status_code != 200:
        error = r.json()["error"]
        assert error and not error.startswith("internal error"), (kind, error)
    return r.status_code, r.text


def still_the_same_workers(servers, name: str) -> None:
    server = servers[name]
    assert requests.get(server.url + "/ping", timeout=5).status_code == 200
    assert worker_pids(server) == server.first_workers, f"the worker of the {name} server was replaced"
    assert "was sent SIG" not in server.log(), server.log()[-3000:]


def test_input_fn_values_get_the_same_answer_alone_and_beside_other_requests(servers):
    url = servers["single"].url + "/invocations"
    with ThreadPoolExecutor(8) as pool:
        for kind in KINDS:
            alone = answered(post(url, {"kind": kind}), kind)
            # Beside ordinary requests: gathered into the same passes where they batch.
            plain = [pool.submit(post, url, {"kind": "plain"}) for _ in range(3)]
            beside = answered(pool.submit(post, url, {"kind": kind}).result(), kind)
            assert beside == alone, kind
            for r in plain:
                assert r.result().status_code == 200 and r.result().json() == PLAIN_ANSWER, kind
            if kind in ANSWERED:
                assert alone[0] == 200, (kind, alone)
    answers = {kind: post(url, {"kind": kind}).json() for kind in ("dtype:bfloat16", "np_big_endian_f4",
                                                                   "sparse_coo", "dtype:qint8")}
    assert all(answer == PLAIN_ANSWER for answer in answers.values()), answers
    assert post(url, {"kind": "flipped"}).json() == PLAIN_ANSWER[::-1]
    still_the_same_workers(servers, "single")


def test_values_left_as_a_sessions_state_are_counted_and_closed(servers):
    url = servers["single"].url + "/invocations"
    for kind in KINDS:
        opened = post(url, {"kind": "plain"}, {"X-Amzn-SageMaker-Session-Id": "NEW_SESSION"})
        assert opened.status_code == 200, opened.text
        session = opened.headers["X-Amzn-SageMaker-New-Session-Id"].split(";")[0]
        answered(post(url, {"kind": kind}, {"X-Amzn-SageMaker-Session-Id": session}), kind)
        closed = post(url, {"kind": "plain"}, {"X-Amzn-SageMaker-Session-Id": session,
                                                 "X-Amzn-SageMaker-Custom-Attributes": "session=close"})
        assert closed.status_code == 200 and closed.headers["X-Amzn-SageMaker-Closed-Session-Id"] == session, kind
    still_the_same_workers(servers, "single")


def test_predict_fn_and_output_fn_values_on_a_multi_model_endpoint(servers):
    base = servers["multi"].url + "/models"
    for code, kind in enumerate(KINDS):
        answered(post(f"{base}/values/invoke", {"kind": kind}), kind)
        answered(post(f"{base}/predicted/invoke", {"at": "predict", "code": code}), kind)
        status, _ = answered(post(f"{base}/predicted/invoke", {"at": "predict", "code": KINDS.index("dtype:float32")},
                                  accept=f"application/x-hook-value-{code}"), kind)
        assert status in (200, 500), kind  # output_fn's own value: bytes, or its named failure
    still_the_same_workers(servers, "multi")

"""Stateful sessions (SageMaker's SessionId) on a real gunicorn of two workers: opened,
continued and closed through the model's hooks; each request reaches the worker that
holds its session whichever worker accepts it (its connection is handed over); one
session's state never reaches another's request; expiry, bounds, SIGTERM, multi-model
endpoints and bad headers."""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch

from local_test.runtime import LocalRuntime
from tests.helpers.server import (ROOT, ServerProcess, metric, passes_and_records, pending_requests, wait_until,
                                  worker_pids)
from tests.helpers.models import model_dir_with

SESSION = "X-Amzn-SageMaker-Session-Id"
NEW_ID = "X-Amzn-SageMaker-New-Session-Id"
CLOSED_ID = "X-Amzn-SageMaker-Closed-Session-Id"
ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
TWO = {"SAGEMAKER_MODEL_SERVER_WORKERS": "2"}

# A model of hooks alone that keeps, per session, the client's token (its custom
# attributes when it opened) and every number its requests sent; input_fn's one-row
# array is batched across sessions by the server, and output_fn answers with the
# session's state. close_session writes where and how each session ended.
SESSION_HOOKS = '''
import json
import os
import time

import numpy as np

ENDED = os.environ["TEST_SESSION_ENDED_LOG"]


def model_fn(model_dir):
    return "counter"


def open_session(context):
    if context.custom_attributes == "refuse":
        raise ValueError("asked to refuse")
    return {"token": context.custom_attributes, "seen": [], "worker": os.getpid()}


def close_session(state, context):
    with open(ENDED, "a") as f:
        f.write(json.dumps({"id": context.session_id, "how": context.close_reason, "token": state["token"],
                            "seen": state["seen"]}) + "\\n")
    if state["token"] == "explode":
        raise RuntimeError("close_session could not let go")


def input_fn(body, content_type, context):
    data = json.loads(body)
    if "n" not in data:
        raise ValueError("no n")
    if context.session is not None:
        context.session["seen"].append(data["n"])
    time.sleep(float(data.get("sleep", 0)))
    return np.array([[data["n"]]], dtype=np.float32)


def predict_fn(data, model):
    if (data == 777).any():
        time.sleep(1.5)  # a request kept in its pass (the SIGTERM test)
    return data + 0


def output_fn(prediction, accept, context):
    state = context.session
    answer = {"n": float(prediction[0][0]), "rows": int(prediction.shape[0])}
    if state is not None:
        answer.update(token=state["token"], seen=list(state["seen"]), worker=state["worker"])
    return json.dumps(answer), "application/json"
'''
METADATA = {"name": "counter", "max_batch_size": 64, "inputs": [{"name": "n", "datatype": "FP32", "shape": [1]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}]}


def counter_model(parent, name="counter"):
    folder = model_dir_with(parent, SESSION_HOOKS, name)
    (folder / "metadata.json").write_text(json.dumps({**METADATA, "name": name}))
    return folder


@pytest.fixture(scope="module")
def ended_log(tmp_path_factory):
    return tmp_path_factory.mktemp("sessions") / "ended.jsonl"


@pytest.fixture(scope="module")
def server(tmp_path_factory, ended_log):
    root = tmp_path_factory.mktemp("sessions-model")
    env = {**TWO, "TEST_SESSION_ENDED_LOG": str(ended_log), "SMSERVE_MAX_BATCH_DELAY_MS": "2"}
    with ServerProcess(counter_model(root), env, log_path=root / "server.log") as s:
        yield s


def ended(log_path) -> list[dict]:
    return [json.loads(line) for line in log_path.read_text().splitlines()] if log_path.exists() else []


def invoke(url, session=None, n=0, close=False, **extra):
    headers = {"Content-Type": "application/json", "Connection": "close"}
    if session is not None:
        headers[SESSION] = session
    if "attributes" in extra:
        headers[ATTRIBUTES] = extra.pop("attributes")
    if close:
        headers[ATTRIBUTES] = "session=close"
    return requests.post(url + "/invocations", data=json.dumps({"n": n, **extra}), headers=headers, timeout=60)


def open_session(url, token: str) -> str:
    answer = invoke(url, "NEW_SESSION", 0, attributes=token)
    assert answer.status_code == 200, answer.text
    value = answer.headers[NEW_ID]
    session_id, expires = value.split("; Expires=")
    assert time.strptime(expires, "%Y-%m-%dT%H:%M:%SZ")
    assert answer.json() == {"n": 0.0, "rows": 1, "token": token, "seen": [0], "worker": answer.json()["worker"]}
    return session_id


def test_a_session_opens_continues_and_closes_through_the_hooks(server, ended_log):
    sid = open_session(server.url, "alpha")
    for n in (1, 2, 3):
        answer = invoke(server.url, sid, n)
        assert answer.status_code == 200 and answer.json()["seen"] == list(range(n + 1)), answer.text
        assert NEW_ID not in answer.headers and CLOSED_ID not in answer.headers
    closed = requests.post(server.url + "/invocations", json={"requestType": "CLOSE"}, headers={SESSION: sid})
    assert closed.status_code == 200 and closed.headers[CLOSED_ID] == sid and closed.json() == {"closed": sid}
    gone = invoke(server.url, sid, 4)
    assert gone.status_code == 400 and sid in gone.json()["error"] and "not open" in gone.json()["error"]
    assert {"id": sid, "how": "closed", "token": "alpha", "seen": [0, 1, 2, 3]} in ended(ended_log)


def test_the_header_form_closes_once_its_request_is_answered(server, ended_log):
    sid = open_session(server.url, "beta")
    last = invoke(server.url, sid, 1, close=True)
    assert last.status_code == 200 and last.json()["seen"] == [0, 1] and last.headers[CLOSED_ID] == sid
    assert invoke(server.url, sid, 2).status_code == 400
    assert {"id": sid, "how": "closed", "token": "beta", "seen": [0, 1]} in ended(ended_log)


def test_a_failing_close_session_costs_a_last_request_nothing_and_answers_a_close(server, ended_log):
    sid = open_session(server.url, "explode")
    last = invoke(server.url, sid, 1, close=True)
    assert last.status_code == 200 and last.json()["seen"] == [0, 1] and last.headers[CLOSED_ID] == sid
    assert invoke(server.url, sid, 2).status_code == 400  # closed all the same
    other = open_session(server.url, "explode")
    closed = requests.post(server.url + "/invocations", json={"requestType": "CLOSE"}, headers={SESSION: other})
    assert closed.status_code == 500 and closed.json()["error"].startswith("close_session failed: RuntimeError")
    assert invoke(server.url, other, 2).status_code == 400
    assert wait_until(lambda: "close_session failed" in server.log())


def test_a_control_body_opens_without_inference(server):
    answer = requests.post(server.url + "/invocations", json={"requestType": "NEW_SESSION"},
                           headers={SESSION: "NEW_SESSION", ATTRIBUTES: "gamma"})
    assert answer.status_code == 200, answer.text
    sid = answer.headers[NEW_ID].split(";")[0]
    assert answer.json()["session"] == sid and answer.headers[NEW_ID].endswith("Z")
    assert invoke(server.url, sid, 5).json()["seen"] == [5]  # the control body was no request of the model's


def test_an_opening_request_that_fails_leaves_no_session(server, ended_log):
    answer = requests.post(server.url + "/invocations", json={"no": "n"}, headers={SESSION: "NEW_SESSION"})
    assert answer.status_code == 400 and NEW_ID not in answer.headers, answer.text
    refused = invoke(server.url, "NEW_SESSION", 1, attributes="refuse")
    assert refused.status_code == 500 and refused.json()["error"].startswith("open_session failed: ValueError")
    assert wait_until(lambda: any(e["how"] == "closed" and e["seen"] == [] for e in ended(ended_log)))


def sessions_on_both_workers(url: str, count: int, token: str) -> dict[int, str]:
    """count sessions, half held by each worker; token-i is the custom attribute session
    i opened with. Which worker accepts a new connection is the kernel's choice, and one
    after another they can all go to the worker that answered the last (its loop is
    awake): sessions are opened four at a time until each worker has its half, and one
    opened on a worker that has its half already is closed at once, so that such a run
    cannot fill that worker to SMSERVE_MAX_SESSIONS."""
    held: dict[int, list[tuple[int, str]]] = {0: [], 1: []}
    i = 0

    def opened(k: int) -> tuple[int, str]:
        answer = invoke(url, "NEW_SESSION", 0, attributes=f"{token}-{k}")
        assert answer.status_code == 200, answer.text
        return k, answer.headers[NEW_ID].split(";")[0]

    with ThreadPoolExecutor(4) as pool:
        while min(len(ids) for ids in held.values()) < count // 2:
            assert i < 50 * count, f"one worker opened every session: {held}"
            for k, sid in pool.map(opened, range(i, i + 4)):
                worker = held[int(sid.split("-")[0])]
                if len(worker) < count // 2:
                    worker.append((k, sid))
                else:
                    assert invoke(url, sid, 1, close=True).status_code == 200
            i += 4
    return dict(held[0] + held[1])


def test_sixteen_sessions_on_two_workers_never_see_each_others_state(server):
    """10,000 requests from 16 concurrent sessions, 8 held by each worker, half of them on
    a new connection each (accepted by either worker: handed to the holder when it is the
    other), half on one kept-alive connection each: every answer is its own session's,
    in order."""
    sessions = 16
    per_session = 10_000 // sessions
    ids = sessions_on_both_workers(server.url, sessions, "token")
    handoffs_before = metric(server, "smserve_session_handoffs_total")
    passes_before, records_before = passes_and_records(server, "counter")

    def drive(i):
        # http.client, not requests: the client's CPU is the server's on this machine, and
        # requests costs several times more a request.
        sid, seen = ids[i], [0]  # (each session's opening request sent 0)
        kept = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60) if i % 2 else None
        try:
            for n in range(1, per_session):
                headers = {"Content-Type": "application/json", SESSION: sid}
                connection = kept or http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
                if kept is None:
                    headers["Connection"] = "close"
                connection.request("POST", "/invocations", body=json.dumps({"n": i * 100_000 + n}), headers=headers)
                answer = connection.getresponse()
                body = answer.read()
                if kept is None:
                    connection.close()
                seen.append(i * 100_000 + n)
                assert answer.status == 200, body
                got = json.loads(body)
                assert got["token"] == f"token-{i}" and got["n"] == i * 100_000 + n and got["seen"] == seen
        finally:
            if kept is not None:
                kept.close()
        return per_session

    with ThreadPoolExecutor(sessions) as pool:
        assert sum(pool.map(drive, ids)) == sessions * per_session
    assert metric(server, "smserve_session_handoffs_total") > handoffs_before
    # Requests of different sessions shared forward passes (the workers write their
    # counts once a second).
    counted = wait_until(lambda: (lambda now: now if now[1] - records_before >= sessions * (per_session - 1) else None)(
        passes_and_records(server, "counter")), timeout=10)
    assert counted and counted[1] - records_before > counted[0] - passes_before, counted


def test_one_kept_alive_connection_carries_both_workers_sessions_pipelined(server):
    """SageMaker's load balancer sends any session's requests down any connection: the
    connection moves to each request's worker, pipelined requests with it."""
    first, second = sessions_on_both_workers(server.url, 2, "pipe").values()
    sids = [first, second] * 4
    requests_bytes = b"".join(
        b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"{SESSION}: {sid}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        for sid, body in ((sid, json.dumps({"n": k}).encode()) for k, sid in enumerate(sids)))
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:
        conn.sendall(requests_bytes)  # all at once: each hand-over carries the rest along
        reader = conn.makefile("rb")
        answers = [_read_answer(reader) for _ in sids]
    assert [a["n"] for a in answers] == list(range(len(sids)))
    assert [a["worker"] for a in answers][:2] != [answers[0]["worker"]] * 2
    for k, answer in enumerate(answers):
        assert answer["seen"][-1] == k


def _read_answer(reader) -> dict:
    status = reader.readline()
    assert status.startswith(b"HTTP/1.1 200"), status
    length = 0
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return json.loads(reader.read(length))


def test_requests_of_one_session_run_one_at_a_time_in_order(server):
    sid = open_session(server.url, "serial")
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda n: invoke(server.url, sid, n, sleep=0.05).json(), range(1, 7)))
    histories = sorted(len(a["seen"]) for a in answers)
    assert histories == list(range(2, 8))  # each saw a distinct, longer history: none ran beside another
    for answer in answers:
        assert answer["seen"][-1] == answer["n"]


@pytest.mark.parametrize("value, words", [
    ("1-aaaaaaaa-" + "0" * 32, ["not open"]),  # forged, of our form
    ("made-up-by-a-client", ["not open"]),
    ("7-aaaaaaaa-" + "0" * 32, ["not open"]),  # a worker there is not
    ("new_session", ["must be NEW_SESSION"]),
    ("a" * 257, ["must be NEW_SESSION"]),
    ("has space", ["must be NEW_SESSION"]),
    ("-leading", ["must be NEW_SESSION"]),
    ("x\x7fy", ["session-id"]),  # (refused by the head's parser, naming the field)
])
def test_unknown_forged_and_malformed_ids_are_400s_naming_the_session(server, value, words):
    answer = invoke(server.url, value, 1)
    assert answer.status_code == 400 and answer.headers["Content-Type"] == "application/json", answer.text
    for word in words:
        assert word.lower() in answer.json()["error"].lower()
    assert NEW_ID not in answer.headers and CLOSED_ID not in answer.headers


def test_a_folded_line_cannot_smuggle_a_header_in_beside_the_sessions(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:
        body = b'{"n": 1}'
        conn.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"{SESSION}: NEW_SESSION\r\n X-Injected: 1\r\n".encode()  # obsolete folding
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        answer = conn.recv(65536)
    assert answer.startswith(b"HTTP/1.1 400") and b"X-Injected" not in answer.split(b"\r\n\r\n")[0]


def test_a_model_without_session_hooks_says_it_keeps_none(example_server):
    answer = requests.post(example_server.url + "/invocations", json=[[0.0] * 64], headers={SESSION: "NEW_SESSION"})
    assert answer.status_code == 400 and "keeps no sessions" in answer.json()["error"], answer.text
    v2 = requests.post(example_server.url + "/v2/models/digits/infer", headers={SESSION: "NEW_SESSION"}, json={
        "inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]})
    assert v2.status_code == 400 and "/invocations" in v2.json()["error"]


def test_metrics_and_the_access_line_tell_the_sessions(server):
    opened = metric(server, "smserve_sessions_total", how="opened")
    sid = open_session(server.url, "counted")
    invoke(server.url, sid, 1)
    # (>=: the other worker's earlier opens may reach its file only now: each writes once a second)
    assert wait_until(lambda: metric(server, "smserve_sessions_total", how="opened") >= opened + 1)
    assert metric(server, "smserve_sessions_open") >= 1 and metric(server, "smserve_session_state_bytes") > 0
    assert wait_until(lambda: f"session={sid}" in server.log())


# ---------------------------------------------------------------- bounds, expiry, SIGTERM


def test_expiry_closes_through_the_hook_and_a_request_racing_it_is_never_served_without_its_state(tmp_path):
    ended_at = tmp_path / "ended.jsonl"
    env = {**TWO, "TEST_SESSION_ENDED_LOG": str(ended_at), "SMSERVE_SESSION_TTL_S": "2"}
    with ServerProcess(counter_model(tmp_path), env, log_path=tmp_path / "server.log") as server:
        sids = [open_session(server.url, f"t{i}") for i in range(4)]
        results = {sid: [] for sid in sids}

        def hammer(sid):
            # Until the session has expired and five more requests were refused (or 6 s).
            n, refused = 1, 0
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline and refused < 6:
                answer = invoke(server.url, sid, n)
                results[sid].append((answer.status_code, answer.json()))
                refused += answer.status_code != 200
                n += 1

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(hammer, sids))
        assert wait_until(lambda: len([e for e in ended(ended_at) if e["how"] == "expired"]) == 4, timeout=10)
        for sid in sids:
            codes = [code for code, _ in results[sid]]
            # Served, then refused, never served again; every 200 with its whole history.
            assert codes == sorted(codes) and codes[0] == 200 and codes[-1] == 400, codes
            served = [answer for code, answer in results[sid] if code == 200]
            assert all(a["seen"] == list(range(len(a["seen"]))) for a in served)
            refused = [answer["error"] for code, answer in results[sid] if code == 400]
            assert all(sid in message for message in refused)
            closing = next(e for e in ended(ended_at) if e["id"] == sid)
            assert closing["how"] == "expired" and closing["seen"] == served[-1]["seen"]


def test_a_worker_holds_at_most_max_sessions(tmp_path):
    env = {"TEST_SESSION_ENDED_LOG": str(tmp_path / "ended.jsonl"), "SMSERVE_MAX_SESSIONS": "3"}
    with ServerProcess(counter_model(tmp_path), env, log_path=tmp_path / "server.log") as server:
        sids = [open_session(server.url, f"t{i}") for i in range(3)]
        full = invoke(server.url, "NEW_SESSION", 1)
        assert full.status_code == 429 and "SMSERVE_MAX_SESSIONS" in full.json()["error"], full.text
        assert 1 <= int(full.headers["Retry-After"]) <= 1201
        assert invoke(server.url, sids[0], 1, close=True).status_code == 200
        open_session(server.url, "again")


def test_sigterm_closes_every_session_after_the_requests_in_flight(tmp_path):
    ended_at = tmp_path / "ended.jsonl"
    env = {**TWO, "TEST_SESSION_ENDED_LOG": str(ended_at)}
    server = ServerProcess(counter_model(tmp_path), env, log_path=tmp_path / "server.log").start()
    try:
        sids = [open_session(server.url, f"t{i}") for i in range(4)]
        slow = ThreadPoolExecutor(1).submit(invoke, server.url, sids[0], 777)
        assert wait_until(lambda: pending_requests(server) >= 1, timeout=10)  # in its pass
        assert server.terminate() == 0
        answer = slow.result(timeout=30)
        assert answer.status_code == 200 and answer.json()["seen"] == [0, 777]
    finally:
        server.terminate()
    closings = {e["id"]: e for e in ended(ended_at)}
    assert set(closings) == set(sids) and {e["how"] for e in closings.values()} == {"shutdown"}
    assert closings[sids[0]]["seen"] == [0, 777]  # closed after its request in flight finished


def test_a_killed_workers_sessions_are_refused_never_served_without_their_state(server):
    """kill -9 of the worker holding a session, under load: its requests are 400s naming
    the session (its state died with it, and the ID names the old process), never a 200
    without its history; the other worker's session goes on; the restarted worker opens
    new ones. (On the module's server: the test ends once both workers serve again, and
    the other tests use only sessions of their own and counts compared before and after,
    which a worker's kill never lowers: metrics/tally.py.)"""
    import signal

    (doomed_i, doomed), (survivor_i, survivor) = sessions_on_both_workers(server.url, 2, "k").items()
    tokens = {doomed: f"k-{doomed_i}", survivor: f"k-{survivor_i}"}
    victim = invoke(server.url, doomed, 1).json()["worker"]
    invoke(server.url, survivor, 1)
    answers = []
    stop = time.monotonic() + 3

    def load(sid, first):
        n = first
        while time.monotonic() < stop:
            try:
                answers.append((sid, n, invoke(server.url, sid, n)))
            except requests.ConnectionError:
                answers.append((sid, n, None))  # a request the kill cut off
            n += 2

    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(load, doomed, 2), pool.submit(load, survivor, 2)]
        assert wait_until(lambda: {sid for sid, _, _ in answers} == {doomed, survivor})  # both sessions flow
        os.kill(victim, signal.SIGKILL)
        for run in runs:
            run.result()
    refused = 0
    for sid, n, answer in answers:
        if answer is not None and answer.status_code == 200:
            got = answer.json()
            assert got["token"] == tokens[sid] and got["seen"][:2] == [0, 1] and got["seen"][-1] == n, got
        elif answer is not None:
            assert sid == doomed and answer.status_code == 400 and doomed in answer.json()["error"], answer.text
            refused += 1
        # (None: a connection the victim held when it died, whichever session's request it carried.)
    assert refused > 0
    assert wait_until(lambda: len(worker_pids(server)) == 2 and victim not in worker_pids(server), timeout=60)
    after = invoke(server.url, doomed, 99)
    assert after.status_code == 400 and doomed in after.json()["error"], after.text
    assert invoke(server.url, survivor, 100).json()["seen"][-1] == 100
    assert wait_until(lambda: _status_of_new(server) == 200, timeout=60)


def _status_of_new(server) -> int:
    return invoke(server.url, "NEW_SESSION", 0).status_code


def test_a_session_belongs_to_its_model_and_closes_with_its_unload(tmp_path):
    ended_at = tmp_path / "ended.jsonl"
    root = tmp_path / "models"
    root.mkdir()
    a, b = counter_model(root, "a"), counter_model(root, "b")
    env = {**TWO, "SAGEMAKER_MULTI_MODEL": "true", "SMSERVE_MODELS_ROOT": str(root),
           "TEST_SESSION_ENDED_LOG": str(ended_at)}
    with ServerProcess(tmp_path / "none", env, log_path=tmp_path / "server.log") as server:
        for name, folder in (("a", a), ("b", b)):
            assert requests.post(server.url + "/models", json={"model_name": name, "url": str(folder)},
                                 timeout=120).status_code == 200
        opened = requests.post(server.url + "/models/a/invoke", json={"n": 1}, headers={SESSION: "NEW_SESSION"})
        assert opened.status_code == 200, opened.text
        sid = opened.headers[NEW_ID].split(";")[0]
        other = requests.post(server.url + "/models/b/invoke", json={"n": 2}, headers={SESSION: sid})
        assert other.status_code == 400 and "belongs to model 'a'" in other.json()["error"]
        again = requests.post(server.url + "/models/a/invoke", json={"n": 3}, headers={SESSION: sid})
        assert again.status_code == 200 and again.json()["seen"] == [1, 3]
        assert requests.delete(server.url + "/models/a", timeout=60).status_code == 200
        assert {"id": sid, "how": "unloaded", "token": None, "seen": [1, 3]} in ended(ended_at)
        gone = requests.post(server.url + "/models/b/invoke", json={"n": 4}, headers={SESSION: sid})
        assert gone.status_code == 400


def test_random_workers_random_order_stress(server):
    """Sessions opened and closed while others run, on random connections."""
    rng = random.Random(7)

    def life(i):
        sid = open_session(server.url, f"life-{i}")
        for n in range(1, rng.randint(2, 12)):
            answer = invoke(server.url, sid, n)
            assert answer.status_code == 200 and answer.json()["seen"] == list(range(n + 1))
        closed = requests.post(server.url + "/invocations", json={"requestType": "CLOSE"}, headers={SESSION: sid})
        assert closed.status_code == 200
        return True

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(life, range(24)))


# ---------------------------------------------------------------- the textgen example, streamed


def test_textgen_continues_a_conversation_streamed_in_a_session(textgen_dir, tmp_path):
    """The example's predict_fn continues context.session's conversation: a streamed answer
    (as InvokeEndpointWithResponseStream carries it) of an existing session is what the
    model writes offline after the same earlier turns."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("textgen_offline", textgen_dir / "code" / "inference.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    # On the device the server's model_fn picks, so the same kernels sample the same text.
    model = hooks.load_generator(str(textgen_dir), "cuda" if torch.cuda.is_available() else "cpu")
    turns = [{"prompt": "The iris data set", "max_tokens": 30, "seed": 1, "temperature": 0.5},
             {"prompt": " It has", "max_tokens": 40, "seed": 2, "temperature": 0.5},
             {"prompt": "", "max_tokens": 20, "seed": 3, "temperature": 0.5}]
    state = hooks.open_session(None)
    offline = ["".join(model.generate(hooks.parse_request(turn), state)) for turn in turns]

    with ServerProcess(textgen_dir, TWO, log_path=tmp_path / "server.log") as server:
        first = requests.post(server.url + "/invocations", json=turns[0], timeout=60,
                              headers={SESSION: "NEW_SESSION", "Accept": "text/plain"})
        assert first.status_code == 200 and first.text == offline[0], first.text
        sid = first.headers[NEW_ID].split(";")[0]
        for turn, expected in zip(turns[1:], offline[1:]):
            with requests.post(server.url + "/invocations", json=turn, stream=True, timeout=60,
                               headers={SESSION: sid, "Accept": "text/plain", "Connection": "close"}) as answer:
                assert answer.status_code == 200 and answer.headers.get("Transfer-Encoding") == "chunked"
                pieces = [piece.decode() for piece in answer.iter_content(None)]
            assert "".join(pieces) == expected and len(pieces) > 1
        # Without the session, the same turn starts a conversation of its own.
        alone = requests.post(server.url + "/invocations", json=turns[1], headers={"Accept": "text/plain"}, timeout=60)
        assert alone.status_code == 200 and alone.text != offline[1]


# ---------------------------------------------------------------- clients: boto3 through a local runtime


def test_the_local_driver_runs_a_session_through_boto3(server, ended_log):
    done = subprocess.run([sys.executable, "-m", "local_test.session", "--url", server.url, '{"n": 1}', '{"n": 2}',
                           '{"n": 3}'], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [a["seen"] for a in answers] == [[1], [1, 2], [1, 2, 3]]
    opened = re.search(r"^NewSessionId: (\S+); Expires=\S+Z$", done.stderr, re.M)
    assert opened and f"ClosedSessionId: {opened.group(1)}" in done.stderr
    assert wait_until(lambda: {"id": opened.group(1), "how": "closed", "token": None, "seen": [1, 2, 3]}
                      in ended(ended_log))


def test_deploy_invoke_session_id_prints_the_new_and_closed_ids(server, tmp_path):
    env = {**os.environ, "AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}

    def deploy_invoke(session, body, *extra):
        (tmp_path / "body.json").write_text(json.dumps(body))
        return subprocess.run([sys.executable, "-m", "deploy", "invoke", "--endpoint-url", runtime.url,
                               "--endpoint-name", "local", "--input", str(tmp_path / "body.json"),
                               "--session-id", session, *extra], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)

    with LocalRuntime(server.url) as runtime:
        first = deploy_invoke("NEW_SESSION", {"n": 5})
        assert first.returncode == 0, first.stderr
        sid = re.search(r"NewSessionId: ([A-Za-z0-9-]+); Expires=", first.stderr).group(1)
        second = deploy_invoke(sid, {"n": 6}, "--custom-attributes", "session=close")
        assert second.returncode == 0 and f"ClosedSessionId: {sid}" in second.stderr, second.stderr
        assert json.loads(second.stdout)["seen"] == [5, 6]
        third = deploy_invoke(sid, {"n": 7})
        # SageMaker's ModelError, the container's 400 inside, in one line.
        assert third.returncode == 1 and "400" in third.stderr and sid in third.stderr, third.stderr
    sent = [r["headers"].get("X-Amzn-SageMaker-Session-Id") for r in runtime.requests]
    assert sent == ["NEW_SESSION", sid, sid]

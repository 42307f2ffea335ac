"""What one client can take of a worker's stateful sessions, on a real gunicorn: a worker
full of sessions closes the one idle longest to open another (SMSERVE_SESSION_IDLE_S),
the request whose state takes the sessions past their memory (SMSERVE_SESSION_STATE_MB)
is a 507 that closes its session and no other, and a WebSocket handshake naming a
session is held to the rules an HTTP request is (400 before any 101).

The tests of one setting share a server: each test's sessions are closed after it, and
the next starts once the worker holds none (their state given back), so each test finds
the worker as a fresh server's; the closings it sees are those since it began."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from tests.helpers.server import ServerProcess, metric, wait_until, worker_pids, ws_url
from tests.helpers.models import model_dir_with

SESSION = "X-Amzn-SageMaker-Session-Id"
NEW_ID = "X-Amzn-SageMaker-New-Session-Id"
CLOSED_ID = "X-Amzn-SageMaker-Closed-Session-Id"

# Each request's "grow" bytes are added to its session's state.
GROWING_HOOKS = '''
import json
import os
import time

import numpy as np

ENDED = os.environ["TEST_SESSION_ENDED_LOG"]


def model_fn(model_dir):
    return "growing"


def open_session(context):
    time.sleep(float(os.environ.get("TEST_OPEN_SESSION_S", 0)))
    return {"blob": b"", "requests": 0}


def close_session(state, context):
    with open(ENDED, "a") as f:
        f.write(json.dumps({"id": context.session_id, "how": context.close_reason}) + "\\n")


def input_fn(body, content_type, context):
    data = json.loads(body)
    if context.session is not None:
        context.session["blob"] += b"x" * int(data.get("grow", 0))
        context.session.setdefault("messages", []).extend("m%d" % i for i in range(int(data.get("chat", 0))))
        context.session["requests"] += 1
    return np.array([[context.session["requests"] if context.session is not None else 0]], dtype=np.float32)


def predict_fn(data, model):
    return data
'''


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """servers(settings) -> the module's server with these settings added, started the
    first time a test asks for it."""
    folder = model_dir_with(tmp_path_factory.mktemp("growing"), GROWING_HOOKS, "growing")
    made: dict[tuple, ServerProcess] = {}

    def get(settings: dict[str, str]) -> ServerProcess:
        key = tuple(sorted(settings.items()))
        if key not in made:
            logs = tmp_path_factory.mktemp("bounds-server")
            env = {"TEST_SESSION_ENDED_LOG": str(logs / "ended.jsonl"), "SMSERVE_MAX_SESSIONS": "2",
                   "SMSERVE_SESSION_IDLE_S": "1", "SMSERVE_SESSION_STATE_MB": "1", **settings}
            made[key] = ServerProcess(folder, env, log_path=logs / "server.log").start()
            made[key].ended = logs / "ended.jsonl"
        return made[key]

    yield get
    for server in made.values():
        server.terminate()


@pytest.fixture
def server(servers, request):
    """The module's server of the settings the test asks for (request.param), holding no
    session; every session the test opens is closed after it, and the next test waits
    until the worker holds none and their closings are all written."""
    s = servers(getattr(request, "param", {}))
    s.opened = []  # every session ID the test's requests were given
    s.ended_from = len(_ended_lines(s))
    yield s
    for session in s.opened:
        requests.post(s.url + "/invocations", json={"requestType": "CLOSE"}, headers={SESSION: session}, timeout=30)
    assert wait_until(lambda: set(s.opened) <= set(_ends(_ended_lines(s)))), "a session's closing was never written"
    assert wait_until(lambda: metric(s, "smserve_sessions_open") == metric(s, "smserve_session_state_bytes") == 0), \
        "the worker still holds sessions after the test closed every one it opened"


def invoke(server, session: str, grow: int = 0, chat: int = 0, **headers) -> requests.Response:
    answer = requests.post(server.url + "/invocations", data=json.dumps({"grow": grow, "chat": chat}),
                           headers={"Content-Type": "application/json", SESSION: session, **headers}, timeout=30)
    if NEW_ID in answer.headers:
        server.opened.append(answer.headers[NEW_ID].split(";")[0])
    return answer


def opened(server) -> str:
    answer = invoke(server, "NEW_SESSION")
    assert answer.status_code == 200, answer.text
    return answer.headers[NEW_ID].split(";")[0]


def _ended_lines(server) -> list[str]:
    return server.ended.read_text().splitlines() if server.ended.exists() else []


def _ends(lines: list[str]) -> dict[str, str]:
    return {entry["id"]: entry["how"] for entry in map(json.loads, lines)}


def ends(server) -> dict[str, str]:
    """The sessions that ended since the test began, and how."""
    return _ends(_ended_lines(server)[server.ended_from:])


def test_a_full_worker_closes_its_longest_idle_session_to_open_another(server):
    first, second = opened(server), opened(server)
    full = invoke(server, "NEW_SESSION")
    assert full.status_code == 429 and "SMSERVE_SESSION_IDLE_S" in full.json()["error"], full.text
    assert 1 <= int(full.headers["Retry-After"]) <= 2  # when one may have been idle long enough
    assert invoke(server, second).json() == [[2.0]]  # second is used again: first idles longest
    third = wait_until(lambda: invoke(server, "NEW_SESSION"), timeout=10, interval=0.2)
    assert third.status_code == 200, third.text
    assert ends(server) == {first: "idle"}
    gone = invoke(server, first)
    assert gone.status_code == 400 and "idle" in gone.json()["error"] and "SMSERVE_SESSION_IDLE_S" in gone.json()["error"]
    assert invoke(server, second).json() == [[3.0]]  # its state went on


def test_the_request_that_takes_the_sessions_past_their_memory_is_a_507_that_closes_its_session(server):
    pids = worker_pids(server)
    small, big = opened(server), opened(server)
    assert invoke(server, small, 200_000).status_code == 200
    over = invoke(server, big, 1_000_000)
    assert over.status_code == 507 and over.headers[CLOSED_ID] == big, over.text
    assert "SMSERVE_SESSION_STATE_MB" in over.json()["error"] and big in over.json()["error"]
    assert wait_until(lambda: ends(server)) == {big: "memory"}
    gone = invoke(server, big)
    assert gone.status_code == 400 and "SMSERVE_SESSION_STATE_MB" in gone.json()["error"]
    assert invoke(server, small).json() == [[3.0]]  # the other session, untouched
    assert worker_pids(server) == pids and "was sent SIG" not in server.log()
    opened(server)  # its memory was given back: room for a new one


def test_a_state_of_many_small_messages_is_held_to_the_memory_bound(server):
    """A chat's history grows by small messages (list.extend): each request's few hundred
    KB of them count, however many objects they are, until the 507."""
    chat = opened(server)
    answers = [invoke(server, chat, chat=10_000) for _ in range(10)]
    statuses = [a.status_code for a in answers]
    assert 507 in statuses, statuses
    over = answers[statuses.index(507)]
    assert over.headers[CLOSED_ID] == chat and "SMSERVE_SESSION_STATE_MB" in over.json()["error"], over.text
    assert statuses[statuses.index(507) + 1:] == [400] * (len(statuses) - statuses.index(507) - 1)
    assert wait_until(lambda: ends(server)) == {chat: "memory"}


@pytest.mark.parametrize("server", [{"TEST_OPEN_SESSION_S": "0.2", "SMSERVE_SESSION_IDLE_S": "600"}], indirect=True)
def test_new_sessions_asked_for_at_once_open_no_more_than_the_cap(server):
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda _: invoke(server, "NEW_SESSION"), range(12)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] * 2 + [429] * 10, statuses  # SMSERVE_MAX_SESSIONS=2, whatever the hook's pace
    assert all("SMSERVE_MAX_SESSIONS" in a.json()["error"] for a in answers if a.status_code == 429)


@pytest.mark.parametrize("value, words", [
    ("0-aaaaaaaa-" + "0" * 32, ["not open"]),  # our form, never given out
    ("forged-session", ["not open"]),
    ("has space", ["must be NEW_SESSION"]),
])
def test_a_websocket_handshake_naming_a_session_it_cannot_reach_is_a_400_before_any_101(server, value, words):
    with pytest.raises(InvalidStatus) as refused:
        with ws_connect(ws_url(server), additional_headers={SESSION: value}, open_timeout=10):
            pass
    response = refused.value.response
    assert response.status_code == 400
    error = json.loads(response.body)["error"]
    assert all(word.lower() in error.lower() for word in words), error
    live = opened(server)
    for header in (live, "NEW_SESSION"):  # an open session's ID, or a new one: the handshake goes on
        with ws_connect(ws_url(server), additional_headers={SESSION: header}, open_timeout=10) as ws:
            ws.send(json.dumps({"grow": 0}))
            assert json.loads(ws.recv(timeout=10)) == [[0.0]]

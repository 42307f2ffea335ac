"""Both SageMaker streaming APIs against a real gunicorn, with real clients: `requests`
(stream=True) for response streaming, the `websockets` library for bidirectional
sessions at /invocations-bidirectional-stream."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import threading
import time

import numpy as np
import pytest
import requests
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from tests.helpers.client import from_npy, npy
from tests.helpers.models import STREAMING_HOOKS, model_dir_with
from tests.helpers.server import ServerProcess, all_read, metric, pending_requests, wait_until, ws_url

WS_PATH = "/invocations-bidirectional-stream"

def closed_with(ws, timeout: float = 10) -> tuple[int, str]:
    """Reads until the server closes; its code and reason."""
    with pytest.raises(ConnectionClosed) as caught:
        while True:
            ws.recv(timeout=timeout)
    assert caught.value.rcvd is not None, "the server sent no Close frame"
    return caught.value.rcvd.code, caught.value.rcvd.reason


# ---------------------------------------------------------------- response streaming


@pytest.fixture(scope="module")
def streaming_server(tmp_path_factory):
    """The streaming hooks, shared by the module's tests: each asks for its own records,
    and a test that looks for a mark or a log line finds its own (its request's id, the
    log written since it began)."""
    work = tmp_path_factory.mktemp("streaming")
    marks = work / "marks"
    marks.mkdir()
    with ServerProcess(model_dir_with(work, STREAMING_HOOKS, "streaming"), {"TEST_STREAM_MARKS": str(marks)},
                       log_path=work / "server.log") as server:
        server.marks = marks
        yield server


# One server of the example model for the tests that need settings of their own: passes
# of at most 4 records, a 20 ms gathering delay and the debug log (each forward pass says
# how many requests it served), a 1 MB payload limit. Each test needs one of them, and the
# others do not change what it sees.
SETTINGS = {"SMSERVE_MAX_BATCH_SIZE": "4", "SMSERVE_MAX_BATCH_DELAY_MS": "20", "SMSERVE_LOG_LEVEL": "debug",
            "SMSERVE_MAX_REQUEST_MB": "1"}


@pytest.fixture(scope="module")
def settings_server(example_model_dir, tmp_path_factory):
    work = tmp_path_factory.mktemp("settings")
    with ServerProcess(example_model_dir, SETTINGS, log_path=work / "server.log") as server:
        yield server


def read_chunks(response) -> list[tuple[float, bytes]]:
    """Each HTTP chunk as it arrived, with its arrival time."""
    return [(time.monotonic(), chunk) for chunk in response.raw.read_chunked(decode_content=False)]


@pytest.mark.slow
@pytest.mark.serial
def test_each_yielded_item_leaves_as_its_own_chunk_as_soon_as_it_exists(streaming_server):
    started = time.monotonic()
    with requests.post(streaming_server.url + "/invocations", json={"n": 4, "pause": 0.3},
                       headers={"Accept": "application/jsonlines"}, stream=True, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["Content-Type"] == "application/jsonlines"
        assert r.headers["Transfer-Encoding"] == "chunked"
        chunks = read_chunks(r)
    ended = time.monotonic()
    assert [json.loads(c) for _, c in chunks] == [{"token": i, "text": f"w{i}"} for i in range(4)]
    assert all(c.endswith(b"\n") and c.count(b"\n") == 1 for _, c in chunks), chunks
    # The first record leaves long before the stream ends (4 records, 0.3 s apart).
    first_at = chunks[0][0] - started
    assert first_at < (ended - started) / 2, (first_at, ended - started)


@pytest.mark.slow
def test_server_sent_events_end_with_an_end_event(streaming_server):
    with requests.post(streaming_server.url + "/invocations", json={"n": 2},
                       headers={"Accept": "text/event-stream"}, stream=True, timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        body = b"".join(c for _, c in read_chunks(r))
    assert body == b'data: {"token":0,"text":"w0"}\n\ndata: {"token":1,"text":"w1"}\n\nevent: end\ndata: {}\n\n'


@pytest.mark.slow
def test_a_failure_after_the_first_chunk_ends_the_stream_with_an_error_record(streaming_server):
    with requests.post(streaming_server.url + "/invocations", json={"n": 5, "fail_at": 2},
                       headers={"Accept": "application/jsonlines"}, stream=True, timeout=30) as r:
        assert r.status_code == 200  # sent before the failure
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[:2] == [{"token": 0, "text": "w0"}, {"token": 1, "text": "w1"}]
    assert "broke at 2" in lines[2]["error"]
    assert requests.get(streaming_server.url + "/ping", timeout=5).status_code == 200


@pytest.mark.slow
def test_a_client_that_leaves_mid_stream_closes_the_generator(streaming_server):
    log_at = len(streaming_server.log())
    with requests.post(streaming_server.url + "/invocations", json={"n": 1000, "pause": 0.05, "id": "left"},
                       headers={"Accept": "application/jsonlines"}, stream=True, timeout=30) as r:
        next(r.iter_lines())
    mark = streaming_server.marks / "closed-left"
    assert wait_until(mark.exists, timeout=15), "the model's generator ran on after its client left"
    # Far fewer than 1000 records were made: 1000 x 0.05 s would take 50 s. (The log
    # line can reach the file after the model's mark: a CI run read the log between.)
    assert wait_until(lambda: "stream closed before its end" in streaming_server.log()[log_at:], timeout=10), \
        streaming_server.log()[log_at:]


@pytest.mark.slow
def test_a_request_that_fails_before_its_first_item_gets_its_status(streaming_server):
    r = requests.post(streaming_server.url + "/invocations", json={"n": 3, "fail_at": 0},
                      headers={"Accept": "application/jsonlines"}, timeout=30)
    assert r.status_code == 500 and "broke at 0" in r.json()["error"]
    r = requests.post(streaming_server.url + "/invocations", json={"n": 3},
                      headers={"Accept": "application/x-npy"}, timeout=30)
    assert r.status_code == 406 and "application/jsonlines" in r.json()["error"]


@pytest.mark.slow
def test_many_records_in_a_line_format_leave_pass_by_pass(settings_server):
    rng = np.random.default_rng(3)
    rows = (rng.random((50, 64)) * 16).astype(np.float32)
    body = "".join(json.dumps(r) + "\n" for r in rows.tolist()).encode()
    server = settings_server  # passes of 4 records
    with requests.post(server.url + "/invocations", data=body, stream=True, timeout=60,
                       headers={"Content-Type": "application/jsonlines", "Accept": "application/jsonlines"}) as r:
        assert r.status_code == 200 and r.headers["Transfer-Encoding"] == "chunked"
        chunks = [c for _, c in read_chunks(r)]
    assert len(chunks) == 13  # ceil(50 / 4) passes, each pass's lines as they end
    assert [len(c.splitlines()) for c in chunks] == [4] * 12 + [2]
    # The same numbers as the buffered answer of the same passes.
    buffered = requests.post(server.url + "/invocations", data=body, timeout=60,
                             headers={"Content-Type": "application/jsonlines", "Accept": "application/json"})
    assert [json.loads(line) for line in b"".join(chunks).splitlines()] == buffered.json()  # JSON Lines in: bare


@pytest.mark.slow
def test_textgen_streams_its_characters_over_http(textgen_server):
    server = textgen_server
    with requests.post(server.url + "/invocations", json={"prompt": "The iris", "max_tokens": 40, "seed": 1},
                       headers={"Accept": "text/plain"}, stream=True, timeout=60) as r:
        assert r.status_code == 200
        chunks = [c for _, c in read_chunks(r)]
    assert len(chunks) == 40 and all(len(c.decode()) == 1 for c in chunks)
    again = requests.post(server.url + "/invocations", json={"prompt": "The iris", "max_tokens": 40, "seed": 1},
                          headers={"Accept": "text/plain"}, timeout=60)
    assert again.content == b"".join(chunks)


# ---------------------------------------------------------------- WebSocket: default sessions


@pytest.mark.slow
def test_the_websocket_path_speaks_only_websocket(example_server):
    r = requests.get(example_server.url + WS_PATH, timeout=10)
    assert r.status_code == 426 and r.headers["Upgrade"] == "websocket" and "WebSocket" in r.json()["error"]
    r = requests.post(example_server.url + WS_PATH, data=b"{}", timeout=10)
    assert r.status_code == 405 and "error" in r.json()
    # Containers that take bidirectional streams must answer POST /ping too.
    assert requests.post(example_server.url + "/ping", timeout=10).status_code == 200


@pytest.mark.slow
def test_fragmented_text_and_binary_messages_are_each_answered_once(example_server, digits):
    x = digits[0][:3].astype(np.float32)
    expected = requests.post(example_server.url + "/invocations", json={"instances": x.tolist()},
                             timeout=30).json()["predictions"]
    with ws_connect(ws_url(example_server), max_size=None) as ws:
        text = json.dumps({"instances": x.tolist()})
        ws.send([text[:7], text[7:30], text[30:]])  # one message in three frames
        binary = npy(x)
        ws.send([binary[:10], binary[10:100], binary[100:]])
        ws.send(json.dumps({"instances": x[:1].tolist()}))
        first, second, third = ws.recv(timeout=30), ws.recv(timeout=30), ws.recv(timeout=30)
        with pytest.raises(TimeoutError):
            ws.recv(timeout=1)  # nothing more: each message was answered once
    assert isinstance(first, str) and np.allclose(json.loads(first)["predictions"], expected, atol=1e-6)
    assert isinstance(second, bytes) and np.allclose(from_npy(second), expected, atol=1e-6)
    assert np.allclose(json.loads(third)["predictions"], expected[:1], atol=1e-6)


@pytest.mark.slow
def test_500_pipelined_messages_are_answered_in_order(example_server, digits):
    x = digits[0][:500].astype(np.float32)
    expected = np.asarray(requests.post(example_server.url + "/invocations", json={"instances": x.tolist()},
                                        timeout=60).json()["predictions"])
    with ws_connect(ws_url(example_server, "content-type=application/x-npy&accept=application/x-npy"),
                    max_size=None) as ws:
        sender = threading.Thread(target=lambda: [ws.send(npy(x[i:i + 1])) for i in range(len(x))])
        sender.start()
        answers = [from_npy(ws.recv(timeout=60)) for _ in range(len(x))]
        sender.join()
    got = np.concatenate(answers)
    assert got.shape == expected.shape
    assert np.allclose(got, expected, atol=1e-5)
    assert (got.argmax(1) == expected.argmax(1)).all()


@pytest.mark.slow
def test_sessions_batch_together(settings_server, digits):
    server = settings_server  # a 20 ms gathering delay; the debug log says each pass's requests
    log_at = len(server.log())
    x = digits[0][:20].astype(np.float32)
    failures = []

    def session():
        try:
            with ws_connect(ws_url(server), max_size=None) as ws:
                for row in x:
                    ws.send(npy(row[None]))
                    assert from_npy(ws.recv(timeout=30)).shape == (1, 10)
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=session) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures, failures
    sizes = [int(n) for n in re.findall(r"pass of (\d+) requests", server.log()[log_at:])]
    assert sizes and max(sizes) > 1, "no forward pass served more than one session's message"


@pytest.mark.slow
@pytest.mark.serial
def test_pings_are_answered_while_a_long_inference_runs(echo_server):
    server = echo_server
    with ws_connect(ws_url(server)) as ws:
        ws.send(json.dumps({"x": [1.0], "sleep": 3}))
        assert wait_until(lambda: pending_requests(server) >= 1)  # in its pass
        started = time.monotonic()
        assert ws.ping().wait(5), "no pong while the model was busy"
        pong_s = time.monotonic() - started
        answer = json.loads(ws.recv(timeout=30))
    assert pong_s < 2.5, pong_s  # the inference alone takes 3 s
    assert np.allclose(np.asarray(answer["predictions"] if isinstance(answer, dict) else answer).ravel(), [2.0])


@pytest.mark.slow
def test_a_bad_message_gets_an_error_message_and_the_session_goes_on(echo_server):
    server = echo_server
    with ws_connect(ws_url(server)) as ws:
        ws.send("this is not json")
        error = json.loads(ws.recv(timeout=30))
        assert error["status"] == 400 and "input_fn rejected" in error["error"]
        ws.send(json.dumps({"x": [2.0]}))
        assert "4" in ws.recv(timeout=30)


def test_a_malformed_npy_message_gets_an_error_message_and_the_session_goes_on(example_server, digits):
    """A .npy whose dtype numpy lacks made the codec raise TypeError, which the session
    took for the server's fault: it closed with 1011."""
    x = digits[0][:1].astype(np.float32)
    with ws_connect(ws_url(example_server)) as ws:
        ws.send(npy(x).replace(b"<f4", b"<f5"))
        error = json.loads(ws.recv(timeout=30))
        assert error["status"] == 400 and "'<f5'" in error["error"], error
        ws.send(npy(x))
        assert from_npy(ws.recv(timeout=30)).shape == (1, 10)


@pytest.mark.slow
def test_a_model_that_fails_closes_with_1011_and_the_worker_lives(echo_server):
    server = echo_server
    with ws_connect(ws_url(server)) as ws:
        ws.send(json.dumps({"x": [1.0], "fail": True}))
        code, reason = closed_with(ws)
    assert code == 1011 and "asked to fail" in reason
    with ws_connect(ws_url(server)) as ws:
        ws.send(json.dumps({"x": [1.0]}))
        assert ws.recv(timeout=30)
    assert requests.get(server.url + "/ping", timeout=5).status_code == 200


@pytest.mark.slow
def test_a_message_over_the_payload_limit_closes_with_1009(settings_server):
    server = settings_server  # SMSERVE_MAX_REQUEST_MB=1
    with ws_connect(ws_url(server), max_size=None) as ws:
        ws.send(b"\0" * (2 * 1024 * 1024))
        code, reason = closed_with(ws)
    assert code == 1009 and "SMSERVE_MAX_REQUEST_MB=1" in reason
    with ws_connect(ws_url(server), max_size=None) as ws:
        ws.send(npy(np.zeros((1, 64), np.float32)))
        assert from_npy(ws.recv(timeout=30)).shape == (1, 10)


@pytest.mark.slow
@pytest.mark.parametrize("query, named", [("colour=blue", "colour"), ("content-type=image/png", "image/png"),
                                          ("accept=application/xml", "application/xml")])
def test_an_unsupported_query_option_closes_with_1008_naming_it(example_server, query, named):
    with ws_connect(ws_url(example_server, query)) as ws:
        code, reason = closed_with(ws)
    assert code == 1008 and named in reason


@pytest.mark.slow
def test_sigterm_answers_held_messages_then_closes_every_session_with_1001(make_server, echo_model_dir):
    server = make_server(echo_model_dir, {"SMSERVE_GRACEFUL_TIMEOUT": "20"})
    with contextlib.ExitStack() as stack:
        sessions = [stack.enter_context(ws_connect(ws_url(server))) for _ in range(4)]
        for i, ws in enumerate(sessions):
            ws.send(json.dumps({"x": [float(i)], "sleep": 1}))
        idle = stack.enter_context(ws_connect(ws_url(server)))  # a session with nothing in flight
        assert wait_until(lambda: all(all_read(server, ws.socket) for ws in sessions))
        server.proc.send_signal(signal.SIGTERM)
        for i, ws in enumerate(sessions):
            answer = ws.recv(timeout=30)
            assert str(float(2 * i)) in answer, answer
            assert closed_with(ws)[0] == 1001
        assert closed_with(idle)[0] == 1001
    assert server.proc.wait(30) == 0


# ---------------------------------------------------------------- WebSocket: stream_fn sessions


@pytest.fixture(scope="module")
def textgen_server(shared_server, textgen_dir):
    """textgen with room for two sessions at once: the cap's tests fill it; the others
    open one session at a time."""
    return shared_server(textgen_dir, {"SMSERVE_MAX_SESSIONS": "2"})


def sessions_open(server) -> int:
    return int(metric(server, "smserve_websocket_sessions_open"))


def generate(ws, prompt: str) -> list[str]:
    ws.send(prompt)
    return list(ws.recv_streaming())


@pytest.mark.slow
def test_textgen_answers_each_prompt_as_one_fragmented_message(textgen_server):
    with ws_connect(ws_url(textgen_server, "max_tokens=30&seed=7")) as ws:
        first = generate(ws, "The iris data set")
        second = generate(ws, json.dumps({"prompt": " has", "max_tokens": 10}))
    # One frame a character, then the empty final frame that ends the message.
    assert len(first) == 31 and first[-1] == "" and all(len(p) == 1 for p in first[:-1])
    assert len("".join(second)) == 10


@pytest.mark.slow
def test_textgen_sessions_keep_state_and_replay_from_a_seed(textgen_server):
    def conversation(query):
        with ws_connect(ws_url(textgen_server, query)) as ws:
            return ["".join(generate(ws, p)) for p in ("The", " data", "")]

    a, b = conversation("seed=11&max_tokens=20"), conversation("seed=11&max_tokens=20")
    assert a == b
    # The state carries over: the same prompt later in a session is a different context.
    with ws_connect(ws_url(textgen_server, "seed=11&max_tokens=20&temperature=0")) as ws:
        fresh = "".join(generate(ws, " data"))
    with ws_connect(ws_url(textgen_server, "seed=11&max_tokens=20&temperature=0")) as ws:
        generate(ws, "The iris")
        later = "".join(generate(ws, " data"))
    assert fresh != later


@pytest.mark.slow
def test_textgen_bad_query_option_closes_with_1008(textgen_server):
    with ws_connect(ws_url(textgen_server, "temperature=warm")) as ws:
        code, reason = closed_with(ws)
    assert code == 1008 and "temperature" in reason


@pytest.mark.slow
def test_textgen_pings_are_answered_while_it_generates(textgen_server):
    with ws_connect(ws_url(textgen_server, "max_tokens=1000")) as ws:
        ws.send("The")
        pieces = ws.recv_streaming()
        first = next(pieces)  # the answer has started
        pong, asked = ws.ping(), time.monotonic()
        # Read on while waiting: the client's reader stops reading the socket once 16
        # frames wait unread (websockets' max_queue), and the pong comes behind the
        # pieces sent before it (in CI's parallel suite it waited there past 5 s).
        rest = []
        for piece in pieces:
            rest.append(piece)
            if pong.is_set():
                break
        assert pong.is_set() and time.monotonic() - asked < 5, "no pong in the middle of a streamed answer"
        assert len(first + "".join(rest)) < 1000, "the pong came only after the whole answer"
        rest += list(pieces)
    assert len(first + "".join(rest)) == 1000


@pytest.mark.slow
def test_stream_fn_sessions_past_the_cap_are_told_to_come_back(textgen_server):
    server = textgen_server  # SMSERVE_MAX_SESSIONS=2
    assert wait_until(lambda: sessions_open(server) == 0)  # the sessions of the tests before are gone
    with ws_connect(ws_url(server)) as a, ws_connect(ws_url(server)) as b:
        with ws_connect(ws_url(server)) as refused:
            code, reason = closed_with(refused)
        assert code == 1013 and "SMSERVE_MAX_SESSIONS" in reason
        for ws in (a, b):
            assert len("".join(generate(ws, json.dumps({"prompt": "x", "max_tokens": 5})))) == 5
    # Closed sessions give their places back.
    with ws_connect(ws_url(server)) as c:
        assert len("".join(generate(c, json.dumps({"prompt": "x", "max_tokens": 5})))) == 5


@pytest.mark.slow
def test_a_client_that_vanishes_mid_answer_frees_its_session(textgen_server):
    server = textgen_server  # SMSERVE_MAX_SESSIONS=2, of which `held` takes one throughout
    assert wait_until(lambda: sessions_open(server) == 0)  # the sessions of the tests before are gone
    with ws_connect(ws_url(server)) as held:
        for _ in range(3):  # with one place left, each next session needs the last one's freed
            with ws_connect(ws_url(server, "max_tokens=1000")) as ws:
                ws.send("The")
                next(iter(ws.recv_streaming()))
                ws.socket.shutdown(socket.SHUT_RDWR)  # no Close frame: gone
            assert wait_until(lambda: sessions_open(server) == 1)  # `held` alone
        with ws_connect(ws_url(server)) as ws:
            assert len("".join(generate(ws, json.dumps({"prompt": "x", "max_tokens": 3})))) == 3
        assert len("".join(generate(held, json.dumps({"prompt": "x", "max_tokens": 3})))) == 3
    assert requests.get(server.url + "/ping", timeout=5).status_code == 200

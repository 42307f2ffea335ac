"""The contract under the conditions SageMaker creates: kept-alive load-balancer
connections at SIGTERM, slow and stalled clients, worker crashes. A real gunicorn."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time

import pytest
import requests

from tests.integration.http_raw import Reader, connect, json_request, request_bytes
from tests.helpers.models import ECHO_HOOKS, model_dir_with, slow_predict
from tests.helpers.server import (ServerProcess, _tcp_table, all_read, outgoing, signal_pending, wait_until,
                                  worker_pids)

CONNECTIONS = 32
# Each batch takes a while, so at SIGTERM most requests are still queued, unread or
# unanswered: exactly the ones a careless drain loses.
SLOW_PREDICT = slow_predict(0.05)
# A 1 MB payload limit: the servers of the 413 tests, shared (they only send requests).
ONE_MB = {"SMSERVE_MAX_REQUEST_MB": "1"}


def _pixels(i: int) -> list[list[float]]:
    return [[float((i + j) % 17) for j in range(64)]]


def _open_kept_alive(port: int, count: int) -> list[tuple]:
    """Connections that already carried one request, as a load balancer's are."""
    conns = []
    for _ in range(count):
        sock = connect(port)
        reader = Reader(sock)
        sock.sendall(request_bytes("GET", "/ping"))
        assert reader.response().status == 200
        conns.append((sock, reader))
    return conns


@pytest.mark.slow
@pytest.mark.parametrize("delay_s, pipelined", [(0.0, False), (0.05, False), (0.0, True)],
                         ids=["signal-at-once", "signal-50ms-after", "pipelined-pair"])
def test_sigterm_answers_every_request_already_sent(make_server, model_copy, delay_s, pipelined):
    # A long graceful timeout: on a loaded machine the drain may be slow, but it must
    # not wait for that timeout.
    server = make_server(model_copy(SLOW_PREDICT), {"SMSERVE_GRACEFUL_TIMEOUT": "60"})
    conns = _open_kept_alive(server.port, CONNECTIONS)
    per_connection = 2 if pipelined else 1
    for i, (sock, _) in enumerate(conns):
        sock.sendall(b"".join(json_request({"instances": _pixels(i + k)}) for k in range(per_connection)))
    time.sleep(delay_s)
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)

    answered, failures = 0, []
    for i, (sock, reader) in enumerate(conns):
        for k in range(per_connection):
            try:
                resp = reader.response()
            except (ConnectionError, OSError) as e:
                failures.append(f"connection {i} request {k}: {e}")
                continue
            if resp.status == 200 and len(resp.json()["predictions"]) == 1:
                answered += 1
            else:
                failures.append(f"connection {i} request {k}: {resp.status} {resp.body[:200]!r}")
        sock.close()
    assert answered == CONNECTIONS * per_connection, failures
    assert server.proc.wait(50) == 0
    # Idle kept-alive connections were closed at once, not held to the graceful timeout.
    assert time.monotonic() - started < 40
    assert "graceful timeout" not in server.log().lower()


@pytest.mark.slow
def test_sigterm_answers_requests_still_in_the_accept_backlog(make_server, example_model_dir):
    """Connections the kernel accepted, with their whole request sent, that the worker
    had not yet taken when SIGTERM came: the worker is stopped (SIGSTOP) so that they
    verifiably wait in the listen backlog at the signal. Closing the listening socket
    first would reset every one of them."""
    server = make_server(example_model_dir, {"SMSERVE_GRACEFUL_TIMEOUT": "30"})
    (worker,) = worker_pids(server)
    kept = _open_kept_alive(server.port, 2)
    os.kill(worker, signal.SIGSTOP)
    try:
        queued = []
        for i in range(8):
            sock = connect(server.port)
            sock.sendall(json_request({"instances": _pixels(i)}))
            queued.append((sock, Reader(sock)))
        for i, (sock, _) in enumerate(kept):
            sock.sendall(json_request({"instances": _pixels(100 + i)}))
        assert wait_until(lambda: not any(outgoing(sock) for sock, _ in queued + kept))
        server.proc.send_signal(signal.SIGTERM)
        # The master has closed its listener and signalled the worker.
        assert wait_until(lambda: signal_pending(worker, signal.SIGTERM))
    finally:
        os.kill(worker, signal.SIGCONT)
    failures = []
    for i, (sock, reader) in enumerate(queued + kept):
        try:
            resp = reader.response()
            if resp.status != 200:
                failures.append(f"connection {i}: {resp.status} {resp.body[:200]!r}")
        except (ConnectionError, OSError) as e:
            failures.append(f"connection {i}: {e}")
        sock.close()
    assert not failures, failures
    assert server.proc.wait(40) == 0


# The connection handling below is the same whatever the model: a model of hooks starts
# on about half the CPU the example model takes.
def test_sigterm_closes_idle_kept_alive_connections_at_once(make_server, tmp_path):
    server = make_server(model_dir_with(tmp_path, ECHO_HOOKS, "echo"), {"SMSERVE_GRACEFUL_TIMEOUT": "60"})
    conns = _open_kept_alive(server.port, 8)
    silent = connect(server.port)  # connected, never sent a byte
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(50) == 0
    assert time.monotonic() - started < 40  # far from the 60 s graceful timeout
    for sock, _ in conns + [(silent, None)]:
        sock.settimeout(2)
        assert sock.recv(1) == b""  # closed by the server, without an answer to nothing
        sock.close()


def test_stalled_body_gets_408_and_the_connection_is_freed(make_server, tmp_path):
    server = make_server(model_dir_with(tmp_path, ECHO_HOOKS, "echo"),
                         {"SMSERVE_BODY_TIMEOUT": "1", "SMSERVE_HEADER_TIMEOUT": "1"})
    stalled = connect(server.port)
    stalled.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: text/csv\r\nContent-Length: 1000\r\n\r\n"
                    + b"1,2,3,4,5,")
    head_only = connect(server.port)
    head_only.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\n")  # never finishes its head
    silent = connect(server.port)  # never sends a byte: the worker's idle sweep ends it
    for sock in (stalled, head_only):
        sock.settimeout(10)
        resp = Reader(sock).response()
        assert resp.status == 408
        assert "error" in resp.json()
        assert sock.recv(1) == b""
        sock.close()
    silent.settimeout(10)
    assert silent.recv(1) == b""  # closed, with nothing said: no request was made
    silent.close()
    assert requests.get(server.url + "/ping", timeout=2).status_code == 200


@pytest.mark.serial
@pytest.mark.slow
def test_a_thousand_slow_clients_do_not_starve_ping(make_server, tmp_path):
    # A small cap makes the eviction path run: at the cap, the longest-waiting stalled
    # connection makes room, so /ping always gets in.
    server = make_server(model_dir_with(tmp_path, ECHO_HOOKS, "echo"),
                         {"SMSERVE_MAX_CONNECTIONS": "200", "SMSERVE_BODY_TIMEOUT": "50"})
    slow = []
    for _ in range(1000):
        try:
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: text/csv\r\n"
                         b"Content-Length: 1000\r\n\r\n1,2,3,4,5,")
            slow.append(sock)
        except OSError:
            pass  # an evicted connection may be reset while we still send
    try:
        latencies = []
        for _ in range(20):
            started = time.monotonic()
            assert requests.get(server.url + "/ping", timeout=2).status_code == 200
            latencies.append(time.monotonic() - started)
        assert max(latencies) < 2
        resp = requests.post(server.url + "/invocations", json={"x": [1.5]}, timeout=5)
        assert resp.status_code == 200 and resp.json() == [3.0], resp.text
    finally:
        for sock in slow:
            sock.close()


CAP = 16
ESTABLISHED, CLOSE_WAIT = "01", "08"  # /proc/net/tcp states of a connection the server has not closed


def _connections_held(server) -> int:
    """Connections to the server that it has not closed yet: established, or closed by
    their client only."""
    return sum(1 for local, _, state, _, _ in _tcp_table() if local == server.port and state in (ESTABLISHED, CLOSE_WAIT))


@pytest.fixture(scope="module")
def cap_server(example_model_dir, tmp_path_factory):
    """The example model with room for CAP connections, shared by the tests of the cap."""
    work = tmp_path_factory.mktemp("cap")
    with ServerProcess(example_model_dir, {"SMSERVE_MAX_CONNECTIONS": str(CAP)}, log_path=work / "server.log") as server:
        yield server


@pytest.fixture
def capped(cap_server):
    """cap_server once it holds no connection: each test fills the cap from empty, not
    on top of the connections the test before it closed."""
    assert wait_until(lambda: _connections_held(cap_server) == 0), _connections_held(cap_server)
    return cap_server


@pytest.mark.slow
def test_at_the_cap_a_request_already_sent_is_never_the_one_evicted(capped):
    """The cap is held by clients stalled mid-head. A complete GET /ping arrives and
    then a silent connection, both before the worker's loop runs (it is stopped, as a
    busy loop or a burst would leave them): the eviction must end a stalled client,
    not the ping whose bytes are already there."""
    server = capped
    (worker,) = worker_pids(server)
    stalled = []
    for _ in range(CAP + 2):
        sock = connect(server.port)
        sock.sendall(b"G")
        stalled.append(sock)
    assert wait_until(lambda: all(all_read(server, sock) for sock in stalled))  # the worker holds them all
    try:
        for _ in range(3):
            os.kill(worker, signal.SIGSTOP)
            try:
                ping = connect(server.port)
                ping.sendall(request_bytes("GET", "/ping", headers={"Connection": "close"}))
                silent = connect(server.port)
                assert wait_until(lambda sock=ping: outgoing(sock) == 0)
            finally:
                os.kill(worker, signal.SIGCONT)
            assert Reader(ping).response().status == 200
            ping.close()
            silent.close()
        # The stalled clients made the room: the longest-waiting ones were ended.
        ended = 0
        for sock in stalled:
            sock.settimeout(0.5)
            try:
                ended += sock.recv(1) == b""
            except (socket.timeout, ConnectionError):
                pass
        assert ended >= 3
    finally:
        for sock in stalled:
            sock.close()


@pytest.mark.slow
def test_a_flood_at_the_cap_never_cuts_or_fails_a_request_being_read(capped):
    """Requests whose bodies are still arriving, then a burst of silent connections
    far past the cap: every request is answered 200. (An eviction once landed in a
    request that had just become busy and made it a 500.)"""
    server = capped
    log_at = len(server.log())
    held = []
    for _ in range(CAP + 4):
        sock = connect(server.port)
        sock.sendall(b"P")
        held.append(sock)
    assert wait_until(lambda: all(all_read(server, sock) for sock in held))  # the worker holds them all
    body = request_bytes("POST", "/invocations", json.dumps({"instances": _pixels(0) * 4000}).encode(),
                         {"Content-Type": "application/json", "Connection": "close"})
    senders, answers = [], []

    def send(sock):
        try:
            sock.sendall(body)
        except OSError:
            pass

    valid = []
    for _ in range(12):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the answers wait, unread
        sock.settimeout(30)
        sock.connect(("127.0.0.1", server.port))
        valid.append(sock)
    for sock in valid:
        senders.append(threading.Thread(target=send, args=(sock,)))
        senders[-1].start()
    try:
        for _ in range(150):
            held.append(connect(server.port))
        for sock in valid:
            try:
                answers.append(Reader(sock).response().status)
            except (ConnectionError, OSError) as e:
                answers.append(repr(e))
    finally:
        for thread in senders:
            thread.join(10)
        for sock in held + valid:
            sock.close()
    assert answers == [200] * len(valid), answers
    log = server.log()[log_at:]
    assert "_Close" not in log and "unhandled error" not in log


@pytest.mark.slow
def test_websocket_sessions_cannot_take_the_room_ping_needs(capped):
    """A session is never evicted (it holds its connection as long as its client likes),
    so past the cap a new session is refused with 503 instead of growing the worker's
    connections until it runs out of descriptors and /ping cannot get in."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect as ws_connect

    server = capped
    url = server.url.replace("http://", "ws://") + "/invocations-bidirectional-stream"
    sessions, refused = [], []
    with contextlib.ExitStack() as opened:
        for _ in range(CAP + 8):
            try:
                sessions.append(opened.enter_context(ws_connect(url, open_timeout=10)))
            except InvalidStatus as e:
                refused.append(e.response.status_code)
        assert CAP - 1 <= len(sessions) <= CAP + 1, len(sessions)
        assert refused and set(refused) == {503}, refused
        for _ in range(5):
            assert requests.get(server.url + "/ping", timeout=2).status_code == 200
        # The sessions that got in work.
        sessions[0].send(json.dumps({"instances": _pixels(0)}))
        assert len(json.loads(sessions[0].recv(timeout=10))["predictions"]) == 1
    # Once they close, new sessions get in again.
    with ws_connect(url, open_timeout=10) as session:
        session.send(json.dumps({"instances": _pixels(1)}))
        assert "predictions" in json.loads(session.recv(timeout=10))


def _ping_while(server, action) -> tuple[object, list]:
    """Run action() while /ping is asked every 50 ms on fresh connections; its result
    and every ping's (status or error, seconds)."""
    pings, done = [], threading.Event()

    def poll():
        while not done.is_set():
            started = time.monotonic()
            try:
                status = requests.get(server.url + "/ping", timeout=2).status_code
            except requests.RequestException as e:
                status = type(e).__name__
            pings.append((status, time.monotonic() - started))
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        assert wait_until(lambda: pings)
        result = action()
        answered = len(pings)
        assert wait_until(lambda: len(pings) > answered)  # one ping after the action too
    finally:
        done.set()
        poller.join()
    return result, pings


@pytest.mark.slow
def test_a_body_of_a_million_one_byte_chunks_neither_stalls_ping_nor_is_parsed_whole(example_server):
    """Each chunk costs a Python-level parse: one read of 1 MB of them held the event
    loop for seconds. Past Triton's 65,536 non-empty chunks the body is refused (its
    wording), and the client that sent it all before reading still gets that answer."""
    server = example_server
    row = b",".join([b"1"] * 64) + b"\n"
    content = row * (1_000_000 // len(row))
    body = b"".join(b"1\r\n" + content[i:i + 1] + b"\r\n" for i in range(len(content))) + b"0\r\n\r\n"
    head = (b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: text/csv\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")

    def send_all_then_read():
        sock = connect(server.port)
        sock.sendall(head + body)
        answer = Reader(sock).response()
        sock.close()
        return answer

    answer, pings = _ping_while(server, send_all_then_read)
    assert answer.status == 400
    assert answer.json() == {"error": "Chunked request body exceeds maximum of 65536 non-empty chunks. "
                                      "Send fewer or larger HTTP chunks."}
    assert pings and all(status == 200 and seconds < 2 for status, seconds in pings), pings
    # Under the cap such a body is served, the loop keeping its turns.
    small = content[:50_000 // len(row) * len(row)]
    chunked = b"".join(b"1\r\n" + small[i:i + 1] + b"\r\n" for i in range(len(small))) + b"0\r\n\r\n"
    sock = connect(server.port)
    sock.sendall(head + chunked)
    answer = Reader(sock).response()
    sock.close()
    assert answer.status == 200 and len(answer.json()) == len(small) // len(row)  # CSV in: a bare JSON array


def test_a_client_that_sends_its_whole_body_before_reading_gets_the_413(shared_server, example_model_dir):
    """The 413 leaves before the body is read. Closing then, with the body still
    arriving, would reset the connection, and a reset may destroy the answer before
    the client reads it: the worker reads and drops the rest for a while first."""
    server = shared_server(example_model_dir, ONE_MB)
    body = b"1," * (10 << 20)
    for _ in range(3):
        sock = connect(server.port)
        sock.sendall(request_bytes("POST", "/invocations", body, {"Content-Type": "text/csv"}))
        answer = Reader(sock).response()
        sock.close()
        assert answer.status == 413 and "payload limit" in answer.json()["error"]
    assert requests.get(server.url + "/ping", timeout=5).status_code == 200


@pytest.mark.parametrize("path", ["/invocations", "/v2/models/dig%69ts/infer"], ids=["worker-route", "flask-route"])
def test_expect_100_continue_with_a_body_over_the_limit_gets_413_not_an_invitation(shared_server, example_model_dir,
                                                                                     path):
    server = shared_server(example_model_dir, ONE_MB)
    sock = connect(server.port)
    sock.sendall(request_bytes("POST", path, headers={"Content-Type": "text/csv", "Expect": "100-continue",
                                                      "Content-Length": str(5 << 20)}))
    answer = Reader(sock).response()
    sock.close()
    assert answer.status == 413 and "payload limit" in answer.json()["error"]


@pytest.mark.slow
def test_kill_9_of_a_worker_leaves_the_instance_healthy(make_server, model_copy):
    server = make_server(model_copy(SLOW_PREDICT), {"SAGEMAKER_MODEL_SERVER_WORKERS": "2"})
    workers = worker_pids(server)
    assert len(workers) == 2
    statuses: list[int | str] = []
    pings: list[int | str] = []
    stop = threading.Event()

    def load():
        session = requests.Session()
        while not stop.is_set():
            try:
                r = session.post(server.url + "/invocations", json={"instances": _pixels(1)}, timeout=10)
                statuses.append(r.status_code)
            except requests.RequestException as e:
                statuses.append(type(e).__name__)
                session = requests.Session()

    def ping():
        while not stop.is_set():
            started = time.monotonic()
            try:
                status = requests.get(server.url + "/ping", timeout=2).status_code
            except requests.RequestException as e:
                status = type(e).__name__
            pings.append((started, time.monotonic(), status))
            time.sleep(0.05)

    threads = [threading.Thread(target=load) for _ in range(4)] + [threading.Thread(target=ping)]
    for t in threads:
        t.start()
    assert wait_until(lambda: len(statuses) >= 8 and pings)  # load and pings flow
    victim = min(workers)
    before = len(statuses)
    killing = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    # Until the replacement has loaded its model and beyond.
    def replaced():
        current = worker_pids(server)
        return len(current) == 2 and victim not in current and server.log().count(" ready: model") >= 3

    wait_until(replaced, timeout=60, interval=0.2)
    served = len(statuses)
    wait_until(lambda: len(statuses) >= served + 20, timeout=10)  # and beyond, both workers serving
    stop.set()
    for t in threads:
        t.join(15)
    after_kill = statuses[before:]
    # Only requests in flight on the killed worker may fail (a reset); no 503 "loading"
    # from the replacement, ever.
    assert 503 not in after_kill, after_kill
    assert sum(1 for s in after_kill if s != 200) <= 8, [s for s in after_kill if s != 200]
    # /ping never says the instance is down. The one ping that may fail is one the
    # killed worker had accepted and was answering at the kill: its connection dies
    # with the process, as an invocation's does (no server can answer from a dead one).
    in_flight = [p for p in pings if p[0] <= killed and p[1] >= killing]
    others = [status for started, ended, status in pings if not (started <= killed and ended >= killing)]
    assert others and all(status == 200 for status in others), [s for s in others if s != 200]
    assert len(in_flight) <= 1 and all(status in (200, "ConnectionError") for *_, status in in_flight), in_flight
    assert len(worker_pids(server)) == 2

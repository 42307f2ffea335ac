"""The parts of stateful sessions that need no server: IDs and headers as SageMaker
writes them, a state's counted memory, a request's head rebuilt for the worker it is
handed to, and a connection handed between two workers' ends over a Unix socket."""

from __future__ import annotations

import re
import socket
import sys
import time

import gevent
import numpy as np
import pytest
import torch
from gunicorn.config import Config
from gunicorn.http.parser import RequestParser
from hypothesis import given, settings, strategies as st

from smserve.core import session_ids
from smserve.engine.sessions.measure import COUNTED_PER_TURN, state_size
from smserve.errors import BadRequest
from smserve.http.handoff import Handoff, head_bytes, session_owner

# SageMaker's own patterns (the runtime API's model): what it accepts from us.
SAGEMAKER_SESSION_ID = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")
SAGEMAKER_NEW_SESSION = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*;\sExpires=[0-9]{4}-[0-9]{2}-[0-9]{2}T"
                                   r"[0-9]{2}:[0-9]{2}:[0-9]{2}Z$")


def test_ids_name_their_worker_and_start_and_are_of_sagemakers_form():
    start = session_ids.start_token()
    made = {session_ids.new_id(3, start) for _ in range(1000)}
    assert len(made) == 1000
    for value in made:
        assert SAGEMAKER_SESSION_ID.match(value) and len(value) <= 256
        assert session_ids.parse(value) == session_ids.SessionId(3, start, value)
        assert session_ids.owner(value) == 3
    header = session_ids.new_session_header(value, time.time() + 1200)
    assert SAGEMAKER_NEW_SESSION.match(header) and len(header) <= 256
    assert session_ids.owner(None) is None and session_ids.owner("NEW_SESSION") is None
    assert session_ids.owner("made-up") is None and session_ids.parse("12345-aaaaaaaa-" + "0" * 32) is None


@pytest.mark.parametrize("value", ["NEW_SESSION", "a", "a-b--c", "0-12345678-" + "f" * 32, "x" * 256])
def test_a_header_of_sagemakers_form_is_taken(value):
    assert session_ids.requested(value) == value


@pytest.mark.parametrize("value", ["", "-a", "a-", "a b", "a_b", "new_session", "x" * 257, "a\r\nb", "é", "a;b"])
def test_any_other_header_is_a_400_that_never_echoes_it_raw(value):
    with pytest.raises(BadRequest) as refused:
        session_ids.requested(value)
    assert "\r" not in refused.value.message and "\n" not in refused.value.message


def test_a_states_memory_is_counted_where_it_can_be():
    tensor, array = torch.zeros(100, dtype=torch.float32), np.zeros(50, dtype=np.int64)

    class History:
        def __init__(self):
            self.turns = ["abc", b"de"]
            self.cache = {"kv": tensor}

    assert state_size(tensor) == 400 and state_size(array) == 400
    history = History()
    own = sum(sys.getsizeof(v) for v in (history, vars(history), "turns", "cache", history.turns, "abc", b"de",
                                         history.cache, "kv"))
    state = {"history": history, "ids": [array, array]}
    assert state_size(state) == 400 + 400 + own + sum(sys.getsizeof(v) for v in (state, "history", "ids", state["ids"]))
    loop = []
    loop.append(loop)
    assert state_size(loop) == sys.getsizeof(loop)  # a cycle ends
    assert state_size({"code": np, "kind": History, "fn": state_size}) == sys.getsizeof({"code": np, "kind": History,
                                                                                          "fn": state_size}) \
        + sum(sys.getsizeof(k) for k in ("code", "kind", "fn"))  # modules, classes and functions are not state


def test_a_state_of_many_small_objects_is_counted_whole():
    """A chat's history, one small message after another: every one counts, however many
    (a count that stopped after so many objects let such a state grow unbounded)."""
    messages = [{"role": "user", "content": f"message {i}"} for i in range(COUNTED_PER_TURN * 5)]
    each = sys.getsizeof(messages[0]) + sys.getsizeof(messages[0]["content"])
    assert state_size({"messages": messages}) >= len(messages) * each


@settings(max_examples=80, deadline=None)
@given(method=st.sampled_from(["GET", "POST", "PUT"]),
       path=st.from_regex(r"/[a-zA-Z0-9/_.%-]{0,40}(\?[a-z=&0-9]{0,20})?", fullmatch=True),
       fields=st.lists(st.tuples(st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,15}", fullmatch=True),
                                 st.from_regex(r"[!-~]([ -~]{0,30}[!-~])?", fullmatch=True)), max_size=8),
       minor=st.sampled_from([0, 1]))
def test_a_head_rebuilt_for_the_next_worker_parses_to_the_same_request(method, path, fields, minor):
    fields = [(name, value) for name, value in fields if name.upper() not in ("CONTENT-LENGTH", "TRANSFER-ENCODING",
                                                                              "EXPECT", "HOST")]
    raw = f"{method} {path} HTTP/1.{minor}\r\n" + "".join(f"{n}: {v}\r\n" for n, v in fields) + "\r\n"
    original = _parsed(raw.encode())
    rebuilt = _parsed(head_bytes(original))
    assert (rebuilt.method, rebuilt.uri, rebuilt.version, rebuilt.headers) == \
        (original.method, original.uri, original.version, original.headers)


def _parsed(data: bytes):
    return next(RequestParser(Config(), [data], ("127.0.0.1", 1)))


def test_the_owner_is_read_off_a_parsed_request():
    sid = session_ids.new_id(1, session_ids.start_token())
    request = _parsed(f"POST /invocations HTTP/1.1\r\nX-Amzn-SageMaker-Session-Id: {sid}\r\n\r\n".encode())
    assert session_owner(request) == 1
    assert session_owner(_parsed(b"POST /invocations HTTP/1.1\r\n\r\n")) is None


def test_a_connection_and_its_bytes_move_from_one_workers_end_to_the_other(tmp_path):
    taken = []
    sender, receiver = Handoff(str(tmp_path), 0), Handoff(str(tmp_path), 1)
    receiver.listen(lambda sock, peer, data: taken.append((sock, peer, data)))
    client, server_side = socket.socketpair()
    try:
        ahead = b"POST /invocations HTTP/1.1\r\n\r\n" + b"x" * 100_000  # more than one read's worth
        sender.send(1, server_side, ("10.0.0.1", 5555), ahead)
        server_side.close()  # the sender lets go of its descriptor; the connection lives on
        assert _waited(lambda: taken)
        sock, peer, data = taken[0]
        assert peer == ("10.0.0.1", 5555) and data == ahead
        sock.sendall(b"answered by worker 1")
        assert client.recv(100) == b"answered by worker 1"
        sock.close()
        # A worker that does not listen: refused, saying so.
        assert "does not take connections" in receiver.hand_off(0, _parsed(b"GET / HTTP/1.1\r\n\r\n"), client,
                                                                ("10.0.0.1", 5555), b"")
    finally:
        client.close()
        sender.close()
        receiver.close()
    assert not (tmp_path / "handoff-1.sock").exists()


def _waited(probe, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while not probe() and time.monotonic() < deadline:
        gevent.sleep(0.01)
    return probe()

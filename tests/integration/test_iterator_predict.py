"""A predict_fn that returns an iterator without being a generator function (textgen's
`return model.generate(data)`) streams, as one that yields does: what it returns
decides. Over HTTP with and without an input_fn, in the stream types of Accept, and in
default WebSocket sessions, `accept` query option included."""

from __future__ import annotations

import json

import pytest
import requests
from websockets.sync.client import connect as ws_connect

from tests.helpers.server import ServerProcess, copy_model, ws_url
from tests.helpers.models import model_dir_with

# The example model's predicted class per row, returned as an iterator of records (a
# generator made elsewhere: predict_fn itself is a plain function).
BUILTIN_DECODER = '''
import torch


def _records(classes):
    for i, c in enumerate(classes):
        yield {"row": i, "class": int(c)}


def predict_fn(data, model):
    with torch.inference_mode():
        classes = model(data).argmax(1).tolist()
    return _records(classes)
'''

# An input_fn of its own, and an iterator that is no generator at all.
OWN_DECODER = '''
import json


def model_fn(model_dir):
    return "words"


def input_fn(body, content_type):
    return json.loads(body)


def predict_fn(data, model):
    return iter(["w%d" % i for i in range(int(data["n"]))])
'''


# Passes of 4 records: a request of more is several passes, as long as the server does
# not know yet that predict_fn streams.
SMALL_PASSES = {"SMSERVE_MAX_BATCH_SIZE": "4"}


# One server each, started when a test first asks for it (under xdist, only in the
# processes whose tests use it).
@pytest.fixture(scope="module")
def builtin(example_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("builtin")
    with ServerProcess(copy_model(example_model_dir, tmp / "builtin", BUILTIN_DECODER), log_path=tmp / "b.log") as server:
        yield server


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("own")
    with ServerProcess(model_dir_with(tmp, OWN_DECODER, "own"), log_path=tmp / "o.log") as server:
        yield server


@pytest.fixture(scope="module")
def small(example_model_dir, tmp_path_factory):
    """Its first request is the module's only one: a stream not yet known of."""
    tmp = tmp_path_factory.mktemp("small")
    with ServerProcess(copy_model(example_model_dir, tmp / "small", BUILTIN_DECODER), SMALL_PASSES,
                       log_path=tmp / "s.log") as server:
        yield server


def test_a_first_request_of_several_passes_is_streamed_whole_in_a_line_format(small, digits):
    """Each pass answered with an iterator before the server knew predict_fn streams:
    one stream cannot be made of several, so the request runs as one call."""
    with requests.post(small.url + "/invocations", json={"instances": rows(digits, 10)}, stream=True,
                       headers={"Accept": "application/jsonlines"}, timeout=30) as r:
        assert r.status_code == 200, r.text
        assert r.headers["Content-Type"] == "application/jsonlines"
        records = [json.loads(line) for line in r.text.splitlines()]
    assert [record["row"] for record in records] == list(range(10))
    r = requests.post(small.url + "/invocations", json={"instances": rows(digits, 9)}, timeout=30)
    assert r.status_code == 200 and len(r.text.splitlines()) == 9, r.text


def rows(digits, n: int) -> list:
    return digits[0][:n].tolist()


def test_without_an_input_fn_the_iterator_is_streamed_as_json_lines(builtin, digits):
    with requests.post(builtin.url + "/invocations", json={"instances": rows(digits, 3)}, stream=True,
                       timeout=30) as r:
        assert r.status_code == 200, r.text
        assert r.headers["Content-Type"] == "application/jsonlines"
        assert r.headers["Transfer-Encoding"] == "chunked"
        records = [json.loads(line) for line in r.text.splitlines()]
    assert [record["row"] for record in records] == [0, 1, 2]
    assert all(0 <= record["class"] <= 9 for record in records)
    assert "generator object" not in r.text


def test_without_an_input_fn_event_stream_is_acceptable(builtin, digits):
    r = requests.post(builtin.url + "/invocations", json={"instances": rows(digits, 2)},
                      headers={"Accept": "text/event-stream"}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "text/event-stream"
    assert r.text.startswith('data: {"row":0,') and r.text.endswith("event: end\ndata: {}\n\n")


def test_an_accept_no_stream_can_meet_is_still_406(builtin, digits):
    r = requests.post(builtin.url + "/invocations", json={"instances": rows(digits, 1)},
                      headers={"Accept": "image/png"}, timeout=30)
    assert r.status_code == 406 and "text/event-stream" in r.json()["error"]


def test_requests_that_arrive_together_are_each_streamed_their_own_answer(builtin, digits):
    """Requests the batcher would have put in one pass: an iterator cannot be split
    back into requests, so each request gets its own."""
    from concurrent.futures import ThreadPoolExecutor

    def ask(i):
        r = requests.post(builtin.url + "/invocations", json={"instances": rows(digits, i + 1)}, timeout=30)
        return r.status_code, [json.loads(line)["row"] for line in r.text.splitlines()]

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(8)))
    assert answers == [(200, list(range(i + 1))) for i in range(8)]


def test_a_v2_request_to_a_model_that_streams_is_told_why_not(builtin, digits):
    body = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": rows(digits, 1)[0]}]}
    r = requests.post(builtin.url + "/v2/models/digits/infer", json=body, timeout=30)
    assert r.status_code == 406 and "cannot be streamed" in r.json()["error"], r.text
    assert requests.get(builtin.url + "/ping", timeout=5).status_code == 200


def test_a_session_message_is_answered_as_one_fragmented_stream(builtin, digits):
    with ws_connect(ws_url(builtin)) as ws:
        ws.send(json.dumps({"instances": rows(digits, 2)}))
        frames = list(ws.recv_streaming())
    records = [json.loads(line) for line in "".join(frames).splitlines()]
    assert [record["row"] for record in records] == [0, 1]


def test_a_session_may_ask_for_an_event_stream(builtin, digits):
    with ws_connect(ws_url(builtin, "accept=text/event-stream")) as ws:
        ws.send(json.dumps({"instances": rows(digits, 1)}))
        answer = "".join(ws.recv_streaming())
    assert answer.startswith('data: {"row":0,') and answer.endswith("event: end\ndata: {}\n\n")


def test_with_an_input_fn_http_streams_each_item(own):
    r = requests.post(own.url + "/invocations", json={"n": 3}, headers={"Accept": "text/event-stream"}, timeout=30)
    assert r.status_code == 200
    assert r.text == 'data: "w0"\n\ndata: "w1"\n\ndata: "w2"\n\nevent: end\ndata: {}\n\n'


def test_with_an_input_fn_a_session_may_ask_for_an_event_stream(own):
    with ws_connect(ws_url(own, "accept=text/event-stream")) as ws:
        ws.send(json.dumps({"n": 2}))
        answer = "".join(ws.recv_streaming())
    assert answer == 'data: "w0"\n\ndata: "w1"\n\nevent: end\ndata: {}\n\n'

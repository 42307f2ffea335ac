"""Text answers over a WebSocket session are text messages, whatever their bytes: a
streamed answer whose chunks split a UTF-8 character (HTTP serves it as it is; a text
message's frames may split a character too), an answer that is not valid UTF-8, an
answer in another charset."""

from __future__ import annotations

import json

import pytest
import requests
from websockets.sync.client import connect as ws_connect

from tests.helpers.models import model_dir_with
from tests.helpers.server import ws_url
from tests.integration.ws_raw import CONT, TEXT, Conn, text

pytestmark = pytest.mark.slow

# Streams its answer in the pieces a message asks for (latin-1 code points are bytes);
# answers {"whole": ...} at once, through output_fn, in the type the message names.
PIECES_HOOKS = '''
import json


def model_fn(model_dir):
    return "pieces"


def input_fn(body, content_type):
    return json.loads(body)


def predict_fn(data, model):
    if "whole" in data:
        return data
    return (piece.encode("latin-1") for piece in data["pieces"])


def output_fn(prediction, accept):
    if isinstance(prediction, dict):
        return prediction["whole"].encode("latin-1"), prediction["type"]
    return prediction
'''

# A stream_fn answering each message with a fragmented message of the pieces it names.
STREAM_FN_HOOKS = '''
import json


def model_fn(model_dir):
    return "pieces"


def stream_fn(messages, model, context):
    for message in messages:
        pieces = json.loads(message)
        yield (p if isinstance(p, str) else bytes(p) for p in pieces)
'''

CAFE = ["caf", "\xc3", "\xa9", " ok"]  # b"caf", b"\xc3", b"\xa9", b" ok": "café ok"


@pytest.fixture(scope="module")
def pieces_server(tmp_path_factory):
    from tests.helpers.server import ServerProcess

    work = tmp_path_factory.mktemp("pieces")
    with ServerProcess(model_dir_with(work, PIECES_HOOKS, "pieces"), log_path=work / "server.log").start() as server:
        yield server


def test_a_streamed_text_answer_that_splits_a_character_is_one_text_message(pieces_server):
    body = json.dumps({"pieces": CAFE})
    http = requests.post(pieces_server.url + "/invocations", data=body, timeout=30,
                         headers={"Content-Type": "application/json", "Accept": "text/plain"})
    assert http.status_code == 200 and http.content.decode("utf-8") == "café ok"
    conn = Conn.open(pieces_server.port, "accept=text/plain")
    try:
        conn.send(text(body))
        frames = []
        while not frames or not frames[-1][0]:
            frames.append(conn.frame())
        # Every frame of a text message is text: the first TEXT, the rest continuations.
        assert [opcode for _, opcode, _ in frames] == [TEXT] + [CONT] * (len(frames) - 1), frames
        assert b"".join(data for _, _, data in frames).decode("utf-8") == "café ok"
        for _, _, data in frames:
            data.decode("utf-8")  # each frame carries whole characters
        conn.send(text(json.dumps({"pieces": ["next"]})))
        assert conn.message() == (TEXT, b"next")  # the session goes on
    finally:
        conn.close()


def test_a_streamed_text_answer_that_is_not_utf8_is_still_text(pieces_server):
    warned = pieces_server.log().count("is not valid utf-8")
    with ws_connect(ws_url(pieces_server, "accept=text/plain")) as ws:
        for _ in range(2):
            ws.send(json.dumps({"pieces": ["ok", "\xff", "caf\xc3", "\xa9", "\xc3"]}))
            assert ws.recv(timeout=30) == "ok\ufffdcafé\ufffd"
        ws.send(json.dumps({"pieces": ["again"]}))
        assert ws.recv(timeout=30) == "again"
    assert pieces_server.log().count("is not valid utf-8") == warned + 1  # once a session


@pytest.mark.parametrize("kind, whole, answer", [
    ("text/plain", "caf\xc3\xa9", "café"),
    ("text/plain", "bad \xff", "bad \ufffd"),  # was a binary message
    ("text/plain; charset=iso-8859-1", "caf\xe9", "café"),
])
def test_a_whole_text_answer_is_a_text_message_in_its_charset(pieces_server, kind, whole, answer):
    with ws_connect(ws_url(pieces_server, "accept=text/plain")) as ws:
        ws.send(json.dumps({"whole": whole, "type": kind}))
        assert ws.recv(timeout=30) == answer


def test_a_stream_fn_text_answer_may_split_a_character_between_items(make_server, tmp_path):
    server = make_server(model_dir_with(tmp_path, STREAM_FN_HOOKS, "stream_fn"))
    with ws_connect(ws_url(server)) as ws:
        ws.send(json.dumps(["x", list(b"caf\xc3"), list(b"\xa9"), " ok"]))
        assert ws.recv(timeout=30) == "xcafé ok"

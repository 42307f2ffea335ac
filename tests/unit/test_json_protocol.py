"""The JSON protocol's choice of thread: flat numeric records are read on the event
loop (simdjson's C reader holds the GIL on any thread, so a codec thread would free
nothing); any other JSON body goes through the server's codec step, once."""

import orjson
import pytest

from smserve.codecs.records import jsondoc
from smserve.protocols import TABLE
from smserve.protocols.message import Message
from smserve.errors import BadRequest
from smserve.core.metadata import ModelMetadata, TensorSpec
from smserve.engine.worker.served import ModelTraits
from smserve.settings import Settings

MODEL = ModelMetadata(name="m", max_batch_size=8, inputs=(TensorSpec("x", "FP32", (2,)),),
                      outputs=(TensorSpec("y", "FP32", (2,)),))


class _Server:
    """What Json.answer asks of the server, with the codec steps it takes recorded."""

    metadata = MODEL
    traits = ModelTraits()

    def __init__(self, body: bytes):
        self.body = body
        self.codec_steps = []
        self.pools = self  # (its offload is codec)
        self.offload = self.codec

    def codec(self, size, fn, *args):
        # A step handed the request's body decodes it; any other step encodes an answer.
        self.codec_steps.append("decode" if any(a is self.body for a in args) else "encode")
        return fn(*args)

    def check_ready(self):
        pass

    def passes(self, inputs):
        return 1

    def infer(self, inputs, context=None):
        return {"y": inputs["x"] * 2}


def _answer(body: bytes):
    server = _Server(body)
    message = Message(body=body, content_type="application/json", accept="application/json")
    reply = TABLE.answer(message, server, Settings())
    return orjson.loads(reply.body), server.codec_steps


def test_flat_records_are_decoded_without_a_codec_step():
    answer, steps = _answer(b'{"instances": [[1, 2], [3.5, 4]]}')
    assert answer == {"predictions": [[2.0, 4.0], [7.0, 8.0]]}
    assert "decode" not in steps


def test_other_json_takes_one_codec_step_and_one_c_read(monkeypatch):
    """A body the C reader refuses (here: a second member) is decoded on the codec
    step by orjson's path, and the C reader is not run a second time there."""
    flat, _ = _answer(b"[[1, 2], [3, 4]]")  # a bare array answers the bare array
    calls = []
    real = jsondoc.c_doubles
    monkeypatch.setattr(jsondoc, "c_doubles", lambda *a: calls.append(a) or real(*a))
    answer, steps = _answer(b'{"instances": [[1, 2], [3, 4]], "parameters": {}}')
    assert answer == {"predictions": flat}
    assert steps.count("decode") == 1
    assert len(calls) == 1


def test_the_json_answer_takes_the_requests_form():
    """As AWS's PyTorch containers answer a bare array (json.dumps(tensor.tolist())),
    and as the SageMaker convention wraps instances in predictions."""
    assert _answer(b" [[1, 2]]")[0] == [[2.0, 4.0]]
    assert _answer(b'\n {"instances": [[1, 2]]}')[0] == {"predictions": [[2.0, 4.0]]}
    assert _answer(b'{"inputs": [[1, 2]]}')[0] == {"predictions": [[2.0, 4.0]]}


def test_a_v2_json_request_takes_the_codec_step():
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]})
    server = _Server(body)
    reply = TABLE.answer(Message(body=body, content_type="application/json"), server, Settings())
    answer = orjson.loads(reply.body)
    assert answer["outputs"][0]["name"] == "y" and answer["outputs"][0]["data"] == [2.0, 4.0]
    assert server.codec_steps == ["decode", "encode"]


def test_bad_flat_json_still_names_its_error():
    with pytest.raises(BadRequest, match="request body"):
        _answer(b'{"instances": [[1, 2], [3, 4]]')
    with pytest.raises(BadRequest):
        _answer(b'{"instances": [[1, 2, 3], [3, 4, 5]]}')  # the model takes 2 values a record

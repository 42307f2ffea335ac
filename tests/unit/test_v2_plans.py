"""A binary v2 request's JSON header, once decoded, is kept as a plan (plans._plans):
the next request with the same header bytes is the same request with its own tensors,
and everything that depends on the body, or on the model, is still checked for it."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

from smserve.codecs import v2
from smserve.codecs.v2 import plans as v2_plans
from smserve.core.metadata import ModelMetadata, TensorSpec
from smserve.errors import BadRequest

MODEL = ModelMetadata(name="m", max_batch_size=8, inputs=(TensorSpec("x", "FP32", (4,)), TensorSpec("flags", "BOOL", (2,)),
                                                          TensorSpec("words", "BYTES", (1,))),
                      outputs=(TensorSpec("y", "FP32", (4,)),))


def body_of(x: np.ndarray, flags: np.ndarray, words: np.ndarray, **parameters) -> tuple[bytes, int]:
    inputs = []
    for name, array, datatype in (("x", x, "FP32"), ("flags", flags, "BOOL"), ("words", words, "BYTES")):
        tensor = httpclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=True)
        inputs.append(tensor)
    outputs = [httpclient.InferRequestedOutput("y", binary_data=True)]
    body, header_length = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs,
                                                                                 parameters=parameters or None)
    return body, header_length


def tensors(seed: int, rows: int = 2):
    rng = np.random.default_rng(seed)
    return (rng.random((rows, 4), dtype=np.float32), rng.random((rows, 2)) > 0.5,
            np.array([[f"w{seed}-{i}".encode()] for i in range(rows)], dtype=object))


@pytest.fixture(autouse=True)
def no_plans():
    v2_plans._plans.clear()
    yield
    v2_plans._plans.clear()


def test_each_request_with_a_kept_header_gets_its_own_tensors():
    requests = []
    for seed in range(3):
        x, flags, words = tensors(seed)
        body, header_length = body_of(x, flags, words, tag="t")
        request = v2.decode_request(body, header_length, MODEL)
        np.testing.assert_array_equal(request.inputs["x"], x)
        np.testing.assert_array_equal(request.inputs["flags"], flags)
        assert request.inputs["words"].tolist() == words.tolist()
        assert [o.name for o in request.outputs] == ["y"] and request.parameters == {"tag": "t"}
        requests.append(request)
    assert len(v2_plans._plans) == 1  # one header, decoded once
    # Nothing a request holds is another's: a hook may change its own.
    requests[0].parameters["tag"] = "changed"
    requests[0].outputs.clear()
    requests[0].datatypes.clear()
    x, flags, words = tensors(9)
    again = v2.decode_request(*body_of(x, flags, words, tag="t"), MODEL)
    assert again.parameters == {"tag": "t"} and [o.name for o in again.outputs] == ["y"]
    assert again.datatypes == {"x": "FP32", "flags": "BOOL", "words": "BYTES"}


def test_a_body_that_does_not_match_its_kept_header_gets_the_decoders_answer():
    body, header_length = body_of(*tensors(1))
    v2.decode_request(body, header_length, MODEL)
    with pytest.raises(BadRequest, match="expecting 1 additional bytes"):
        v2.decode_request(body[:-1], header_length, MODEL)
    with pytest.raises(BadRequest, match="unexpected additional input data"):
        v2.decode_request(body + b"\0", header_length, MODEL)


def test_what_the_tensors_bytes_hold_is_checked_each_time():
    x, flags, words = tensors(1)
    body, header_length = body_of(x, flags, words)
    v2.decode_request(body, header_length, MODEL)
    at = header_length + x.nbytes
    bad_bool = body[:at] + b"\x02" + body[at + 1:]
    with pytest.raises(BadRequest, match="BOOL input 'flags'"):
        v2.decode_request(bad_bool, header_length, MODEL)
    at += flags.nbytes
    bad_bytes = body[:at] + (10**6).to_bytes(4, "little") + body[at + 4:]
    with pytest.raises(BadRequest, match="words"):
        v2.decode_request(bad_bytes, header_length, MODEL)


def test_a_kept_header_is_checked_again_against_another_model():
    body, header_length = body_of(*tensors(1))
    v2.decode_request(body, header_length, MODEL)
    other = ModelMetadata(name="other", max_batch_size=8, inputs=(TensorSpec("x", "FP32", (4,)),),
                          outputs=(TensorSpec("y", "FP32", (4,)),))
    with pytest.raises(BadRequest, match="unexpected inference input 'flags' for model 'other'"):
        v2.decode_request(body, header_length, other)


def test_json_data_is_never_kept():
    x = httpclient.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4), binary_data=False)
    body, header_length = httpclient.InferenceServerClient.generate_request_body([x])
    model = ModelMetadata(name="m", max_batch_size=8, inputs=(TensorSpec("x", "FP32", (4,)),))
    first = v2.decode_request(body, len(body), model)
    second = v2.decode_request(body, len(body), model)
    assert first.inputs["x"] is not second.inputs["x"] and not v2_plans._plans


def test_the_kept_headers_are_bounded():
    model = ModelMetadata(name="m", max_batch_size=0, inputs=(TensorSpec("x", "FP32", (-1,)),))
    for n in range(v2_plans.PLANS_KEPT + 10):
        x = httpclient.InferInput("x", [n], "FP32")
        x.set_data_from_numpy(np.zeros(n, dtype=np.float32), binary_data=True)
        body, header_length = httpclient.InferenceServerClient.generate_request_body([x])
        assert v2.decode_request(body, header_length, model).inputs["x"].shape == (n,)
    assert 0 < len(v2_plans._plans) <= v2_plans.PLANS_KEPT

"""Inputs whose shape is not known: a TorchScript model.pt without metadata.json.

TorchScript keeps argument names but no shapes, so the server derives shape None
("not known"): requests of any rank reach the model as sent, in every protocol, and a
model whose shapes are known is checked exactly as before. metadata.json writes null
(or leaves `shape` out) for the same thing.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from smserve.codecs import v2
from smserve.errors import BadRequest
from smserve.core.metadata import ModelMetadata, TensorSpec
from smserve.engine.model.derived import from_torchscript
from smserve.engine.worker.loaded_model import load
from smserve.protocols.simple import decode_inputs

from tests.helpers.client import npy

UNKNOWN = ModelMetadata(inputs=(TensorSpec("input", "FP32", None),), outputs=(TensorSpec("output__0", "FP32", None),))
# The same model told it is a 1-D tensor of any length: still checked.
ONE_DIM = ModelMetadata(inputs=(TensorSpec("input", "FP32", (-1,)),))
UNKNOWN_BATCHED = ModelMetadata(max_batch_size=8, inputs=(TensorSpec("input", "FP32", None),))


def save_torchscript(directory, kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Linear(64, 3).eval()
    directory.mkdir(parents=True, exist_ok=True)
    module = torch.jit.script(net) if kind == "script" else torch.jit.trace(net, torch.zeros(2, 64))
    torch.jit.save(module, str(directory / "model.pt"))
    return net


@pytest.mark.parametrize("kind", ["script", "trace"])
def test_torchscript_metadata_has_argument_names_unknown_shapes_and_no_batching(tmp_path, kind):
    save_torchscript(tmp_path, kind)
    metadata = from_torchscript(torch.jit.load(str(tmp_path / "model.pt")))
    assert [(s.name, s.datatype, s.shape) for s in metadata.inputs] == [("input", "FP32", None)]
    assert [(s.name, s.shape) for s in metadata.outputs] == [("output__0", None)]
    assert metadata.max_batch_size == 0


X = np.arange(3 * 64, dtype=np.float32).reshape(3, 64) / 100


@pytest.mark.parametrize("body, content_type", [
    ("".join(",".join(f"{v:g}" for v in row) + "\n" for row in X).encode(), "text/csv"),
    (json.dumps({"instances": X.tolist()}).encode(), "application/json"),
    (json.dumps(X.tolist()).encode(), "application/json"),
    ("".join(json.dumps(row) + "\n" for row in X.tolist()).encode(), "application/jsonlines"),
    (npy(X), "application/x-npy"),
])
def test_records_of_an_unknown_shape_reach_the_model_as_sent(body, content_type):
    inputs = decode_inputs(body, content_type, UNKNOWN)
    assert list(inputs) == ["input"]
    np.testing.assert_allclose(inputs["input"], X, rtol=1e-6)
    assert inputs["input"].dtype == np.float32


def test_any_rank_is_taken_when_the_shape_is_unknown():
    for array in (np.zeros(5, np.float32), np.zeros((2, 3, 4), np.float32), np.float32(1.5)):
        assert decode_inputs(npy(array), "application/x-npy", UNKNOWN)["input"].shape == np.shape(array)
    # A model without any metadata (model_fn, no metadata.json) takes records too.
    assert decode_inputs(b"1,2,3\n4,5,6\n", "text/csv", ModelMetadata())["input__0"].shape == (2, 3)


def test_a_known_shape_is_still_checked():
    with pytest.raises(BadRequest, match=r"expected shape \[-1\], got \[3, 64\]"):
        decode_inputs(npy(X), "application/x-npy", ONE_DIM)
    v2_body = json.dumps({"inputs": [{"name": "input", "shape": [3, 64], "datatype": "FP32",
                                      "data": X.ravel().tolist()}]}).encode()
    with pytest.raises(BadRequest, match="unexpected shape"):
        v2.decode_request(v2_body, None, ONE_DIM)


def test_a_batching_model_of_unknown_shape_needs_a_batch_dimension():
    assert decode_inputs(npy(X), "application/x-npy", UNKNOWN_BATCHED)["input"].shape == (3, 64)
    with pytest.raises(BadRequest, match="batch dimension"):
        decode_inputs(npy(np.float32(1)), "application/x-npy", UNKNOWN_BATCHED)
    scalar = json.dumps({"inputs": [{"name": "input", "shape": [], "datatype": "FP32", "data": [1.0]}]}).encode()
    with pytest.raises(BadRequest, match="unexpected shape"):
        v2.decode_request(scalar, None, UNKNOWN_BATCHED)


@pytest.mark.parametrize("shape", [[3, 64], [64], [2, 3, 64]])
def test_v2_json_and_binary_take_any_shape_when_it_is_unknown(shape):
    data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    body = json.dumps({"inputs": [{"name": "input", "shape": shape, "datatype": "FP32",
                                   "data": data.ravel().tolist()}]}).encode()
    np.testing.assert_array_equal(v2.decode_request(body, None, UNKNOWN).inputs["input"], data)
    header = json.dumps({"inputs": [{"name": "input", "shape": shape, "datatype": "FP32",
                                     "parameters": {"binary_data_size": data.nbytes}}]}).encode()
    decoded = v2.decode_request(header + data.tobytes(), len(header), UNKNOWN)
    np.testing.assert_array_equal(decoded.inputs["input"], data)


def test_a_raw_binary_request_cannot_deduce_an_unknown_shape_and_says_so():
    with pytest.raises(BadRequest, match="can not be deduced.*metadata.json"):
        v2.decode_request(X.tobytes(), 0, UNKNOWN)


def test_v2_metadata_reports_an_unknown_shape_as_minus_one():
    assert UNKNOWN.to_v2()["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1]}]


@pytest.mark.parametrize("entry", [{"name": "x", "shape": None}, {"name": "x"}])
def test_metadata_json_says_unknown_with_null_or_no_shape(entry):
    metadata = ModelMetadata.from_dict({"inputs": [entry]})
    assert metadata.inputs[0].shape is None and metadata.full_shape(metadata.inputs[0]) is None
    assert ModelMetadata.from_dict({"inputs": [{"name": "x", "shape": [-1, 4]}]}).inputs[0].shape == (-1, 4)


@pytest.mark.parametrize("kind", ["script", "trace"])
def test_a_loaded_torchscript_model_serves_a_batch_of_records_and_the_log_says_what_was_derived(
        tmp_path, kind, caplog):
    net = save_torchscript(tmp_path, kind)
    with caplog.at_level(logging.INFO, logger="smserve.engine"):
        loaded = load(str(tmp_path), torch.device("cpu"))
    assert loaded.warm_up() is False  # nothing to warm up with: the shape is not known
    inputs = decode_inputs("".join(",".join(f"{v:g}" for v in row) + "\n" for row in X).encode(), "text/csv",
                           loaded.metadata)
    outputs = loaded.predict(inputs)
    np.testing.assert_allclose(outputs["output__0"], net(torch.from_numpy(X)).detach().numpy(), rtol=1e-5, atol=1e-6)
    message = " ".join(r.getMessage() for r in caplog.records)
    assert "derived from model.pt" in message and "input (FP32, any shape)" in message
    assert "max_batch_size 0" in message and "metadata.json" in message and "make new-model" in message

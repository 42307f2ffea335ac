"""engine/batching/batchable.py: what an input_fn's value is to the batcher (named leaves along
dimension 0 and the form that rebuilds it), and a prediction cut back into requests."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from smserve.engine.batching import batchable
from smserve.engine.batching.batchable import NotBatchable, Unsplittable


def test_a_cpu_tensor_becomes_a_numpy_view_of_its_memory_and_comes_back_a_tensor():
    images = torch.rand(4, 3, 8, 8)
    form, leaves = batchable.flatten(images, ("image",))
    assert list(leaves) == ["image"] and isinstance(leaves["image"], np.ndarray)
    assert np.shares_memory(leaves["image"], images.numpy())  # no copy
    assert form.container == batchable.ONE and form.tensors == (True,)
    assert form.rebuild(leaves) is leaves["image"]


def test_containers_keep_their_kind_order_and_names():
    a, b = torch.zeros(2, 3), np.ones((2, 5), np.int64)
    form, leaves = batchable.flatten((a, b), ("x", "mask"))
    assert list(leaves) == ["x", "mask"] and form.container == batchable.TUPLE and form.tensors == (True, False)
    rebuilt = form.rebuild(leaves)
    assert isinstance(rebuilt, tuple) and len(rebuilt) == 2
    form, leaves = batchable.flatten([a, b], ("only-one-name",))  # names only when they are as many
    assert list(leaves) == ["input__0", "input__1"] and isinstance(form.rebuild(leaves), list)
    form, leaves = batchable.flatten({"ids": b, "pixels": a})
    assert list(leaves) == ["ids", "pixels"] and list(form.rebuild(leaves)) == ["ids", "pixels"]


def test_tensors_numpy_cannot_hold_stay_tensors():
    half = torch.zeros(2, 3, dtype=torch.bfloat16)
    meta = torch.empty(2, 3, device="meta")
    _, leaves = batchable.flatten({"h": half, "m": meta})
    assert leaves["h"] is half and leaves["m"] is meta


@pytest.mark.parametrize("value, why", [
    ("a string", "not a tensor"),
    ([b"jpeg", b"jpeg"], "not all tensors"),
    ([], "an empty list"),
    ({"x": torch.zeros(2, 3), "threshold": 0.5}, "not all tensors"),
    (torch.tensor(3.0), "scalar"),
    ((torch.zeros(2, 3), torch.zeros(3, 3)), "disagree on dimension 0"),
    (np.array([b"a", b"b"], dtype=object), "Python objects"),
])
def test_what_is_no_batch_says_why(value, why):
    with pytest.raises(NotBatchable, match=why):
        batchable.flatten(value)


def test_the_signature_tells_forms_shapes_dtypes_and_devices_apart():
    def signature(value):
        form, leaves = batchable.flatten(value, ("x",))
        return form.signature(leaves)

    base = signature(torch.zeros(2, 3))
    assert base == signature(torch.ones(7, 3))  # dimension 0 may differ
    assert base != signature(torch.zeros(2, 4))
    assert base != signature(torch.zeros(2, 3, dtype=torch.float64))
    assert base != signature((torch.zeros(2, 3),))
    assert base != signature(torch.empty(2, 3, device="meta"))


def test_a_prediction_is_cut_back_into_its_requests_whatever_its_shape():
    logits, features = torch.arange(12.0).view(6, 2), np.arange(6)
    parts = batchable.split((logits, {"f": features}), [1, 2, 3])
    assert [p[0].tolist() for p in parts] == [[[0, 1]], [[2, 3], [4, 5]], [[6, 7], [8, 9], [10, 11]]]
    assert [p[1]["f"].tolist() for p in parts] == [[0], [1, 2], [3, 4, 5]]
    # One item per record (labels a predict_fn made).
    assert batchable.split(["a", "b", "c"], [2, 1]) == [["a", "b"], ["c"]]
    # A lone request's prediction is its own, whatever it is.
    only = object()
    assert batchable.split(only, [5]) == [only]


@pytest.mark.parametrize("prediction", [torch.zeros(5, 2), {"y": np.zeros(3)}, ["a", "b"], 7, "text"])
def test_a_prediction_without_its_records_along_dimension_0_is_unsplittable(prediction):
    with pytest.raises(Unsplittable):
        batchable.split(prediction, [2, 2])


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.integers(1, 5), min_size=1, max_size=6),
       kind=st.sampled_from(["tensor", "array", "tuple", "dict", "records"]))
def test_split_then_join_gives_the_prediction_back(rows, kind):
    total = sum(rows)
    tensor = torch.arange(total * 2, dtype=torch.float32).view(total, 2)
    prediction = {
        "tensor": tensor,
        "array": tensor.numpy().copy(),
        "tuple": (tensor, tensor.numpy() * 2),
        "dict": {"logits": tensor, "ids": np.arange(total)},
        "records": [f"r{i}" for i in range(total)],
    }[kind]
    joined = batchable.join(batchable.split(prediction, rows), rows)
    flat = batchable.flatten(joined)[1] if kind != "records" else None
    if kind == "records":
        assert joined == prediction
    else:
        expected = batchable.flatten(prediction)[1]
        assert list(flat) == list(expected)
        for name in flat:
            np.testing.assert_array_equal(np.asarray(flat[name]), np.asarray(expected[name]))
        assert type(joined) is type(prediction)

"""One answer form whatever the model's batching, labels on request, and the named
input forms (JSON, JSON Lines, .npz) for models of one input or several (issue 24)."""

from __future__ import annotations

import gzip
import io
import json
import zipfile

import numpy as np
import orjson
import pytest

from smserve.codecs import simple
from smserve.core.metadata import ModelMetadata, TensorSpec
from smserve.errors import BadRequest, NotAcceptable, PayloadTooLarge
from smserve.protocols.simple import answer_labels, decode_inputs

OUTPUTS = {"probs": np.array([[0.1, 0.9], [0.8, 0.2]], dtype=np.float32), "score": np.array([3, 4], dtype=np.int64)}
RECORDS = [{"probs": [0.1, 0.9], "score": 3}, {"probs": [0.8, 0.2], "score": 4}]
LABELS = {"probs": ("cat", "dog")}


def two_inputs(max_batch_size: int) -> ModelMetadata:
    return ModelMetadata(name="m", max_batch_size=max_batch_size,
                         inputs=(TensorSpec("image", "FP32", (2,) if max_batch_size else (-1, 2)),
                                 TensorSpec("meta", "INT64", (1,) if max_batch_size else (-1, 1))),
                         outputs=(TensorSpec("probs", "FP32", (2,), labels=("cat", "dog")),
                                  TensorSpec("score", "INT64", ())))


ONE = ModelMetadata(name="one", max_batch_size=8, inputs=(TensorSpec("tokens", "INT64", (3,)),))


def predictions(body: bytes):
    return orjson.loads(body)["predictions"]


# ---------------------------------------------------------------- one form


def test_several_outputs_answer_one_object_per_record():
    body, media = simple.encode(OUTPUTS, "application/json")
    assert media == "application/json" and predictions(body) == RECORDS
    lines, _ = simple.encode(OUTPUTS, "application/jsonlines")
    assert [json.loads(line) for line in lines.splitlines()] == RECORDS


def test_outputs_without_a_common_first_dimension_answer_one_object_of_arrays():
    """Nothing to call a record (a scalar beside a vector): the one other form."""
    outputs = {"probs": np.array([0.25, 0.75]), "loss": np.float64(1.5)}
    assert predictions(simple.encode(outputs, "application/json")[0]) == {"probs": [0.25, 0.75], "loss": 1.5}


def test_one_output_answers_its_rows():
    assert predictions(simple.encode({"probs": OUTPUTS["probs"]}, "application/json")[0]) == [[0.1, 0.9], [0.8, 0.2]]


# ---------------------------------------------------------------- labels


def test_labels_add_each_records_predicted_label_in_json_json_lines_and_csv():
    body, _ = simple.encode(OUTPUTS, "application/json", LABELS)
    assert predictions(body) == [{**RECORDS[0], "predicted_label": "dog"}, {**RECORDS[1], "predicted_label": "cat"}]
    lines, _ = simple.encode(OUTPUTS, "application/jsonlines", LABELS)
    assert [json.loads(line)["predicted_label"] for line in lines.splitlines()] == ["dog", "cat"]
    csv, _ = simple.encode(OUTPUTS, "text/csv", LABELS)
    assert csv == b"0.1,0.9,3,dog\n0.8,0.2,4,cat\n"


def test_a_single_output_with_labels_answers_records_too():
    body, _ = simple.encode({"probs": OUTPUTS["probs"]}, "application/json", LABELS)
    assert predictions(body) == [{"probs": [0.1, 0.9], "predicted_label": "dog"},
                                 {"probs": [0.8, 0.2], "predicted_label": "cat"}]


def test_several_labelled_outputs_each_get_their_own_field_and_missing_labels_the_index():
    outputs = {"a": np.array([[0.0, 1.0, 2.0]]), "b": np.array([[5.0, 1.0]])}
    body, _ = simple.encode(outputs, "application/json", {"a": ("x", "y"), "b": ("p", "q")})
    assert predictions(body) == [{"a": [0.0, 1.0, 2.0], "b": [5.0, 1.0], "a_predicted_label": "2",
                                  "b_predicted_label": "p"}]


def test_labels_in_npy_are_406():
    with pytest.raises(NotAcceptable, match="labels=true"):
        simple.encode({"probs": OUTPUTS["probs"]}, "application/x-npy", LABELS)


@pytest.mark.parametrize("header, chosen, wanted", [
    ("application/json; labels=true", "application/json", True),
    ("application/json;labels=TRUE", "application/json", True),
    ("text/csv; labels=true", "text/csv", True),
    ("*/*; labels=true", "application/json", True),
    ("text/csv; labels=true, application/json", "application/json", False),
    ("application/json; labels=false", "application/json", False),
    ("application/json", "application/json", False),
    (None, "application/json", False),
])
def test_the_accept_entry_that_chose_the_answer_asks_for_labels(header, chosen, wanted):
    assert (answer_labels(header, chosen, two_inputs(8)) is not None) == wanted


def test_labels_asked_of_a_model_without_labels_are_406():
    with pytest.raises(NotAcceptable, match="no output labels"):
        answer_labels("application/json; labels=true", "application/json", ONE)


# ---------------------------------------------------------------- named inputs


@pytest.mark.parametrize("max_batch_size", [0, 8])
@pytest.mark.parametrize("body", [
    b'{"inputs": {"image": [[1, 2], [3, 4]], "meta": [[5], [6]]}}',
    b'{"instances": [{"image": [1, 2], "meta": [5]}, {"image": [3, 4], "meta": [6]}]}',
    b'[{"image": [1, 2], "meta": [5]}, {"image": [3, 4], "meta": [6]}]',
])
def test_every_json_form_of_a_model_of_two_inputs(body, max_batch_size):
    inputs = decode_inputs(body, "application/json", two_inputs(max_batch_size))
    assert inputs["image"].tolist() == [[1, 2], [3, 4]] and inputs["image"].dtype == np.float32
    assert inputs["meta"].tolist() == [[5], [6]] and inputs["meta"].dtype == np.int64


@pytest.mark.parametrize("body, content_type", [
    (b'{"inputs": {"tokens": [[1, 2, 3], [4, 5, 6]]}}', "application/json"),
    (b'{"instances": [{"tokens": [1, 2, 3]}, {"tokens": [4, 5, 6]}]}', "application/json"),
    (b'{"tokens": [1, 2, 3]}\n{"tokens": [4, 5, 6]}\n', "application/jsonlines"),
    (b'[1, 2, 3]\n[4, 5, 6]\n', "application/jsonlines"),
    (b'{"instances": [[1, 2, 3], [4, 5, 6]]}', "application/json"),
])
def test_a_model_of_one_input_takes_it_by_name_as_well(body, content_type):
    assert decode_inputs(body, content_type, ONE)["tokens"].tolist() == [[1, 2, 3], [4, 5, 6]]


def test_npy_for_a_model_of_two_inputs_names_the_content_type_to_use():
    buffer = io.BytesIO()
    np.save(buffer, np.ones((2, 2), np.float32))
    with pytest.raises(BadRequest, match=r"several inputs \(image, meta\).*application/x-npz"):
        decode_inputs(buffer.getvalue(), "application/x-npy", two_inputs(8))


# ---------------------------------------------------------------- .npz


def savez(compressed: bool = False, **arrays) -> bytes:
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, **arrays)
    return buffer.getvalue()


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_holds_one_array_per_input_name(compressed):
    body = savez(compressed, image=np.array([[1, 2], [3, 4]], np.float32), meta=np.array([[5], [6]]))
    inputs = decode_inputs(body, "application/x-npz", two_inputs(8))
    assert inputs["image"].tolist() == [[1, 2], [3, 4]] and inputs["meta"].tolist() == [[5], [6]]
    assert inputs["meta"].dtype == np.int64


def test_npz_of_one_array_feeds_a_model_of_one_input_whatever_its_name():
    buffer = io.BytesIO()
    np.savez(buffer, np.array([[1, 2, 3]]))  # unnamed: arr_0
    assert decode_inputs(buffer.getvalue(), "application/x-npz", ONE)["tokens"].tolist() == [[1, 2, 3]]


def test_npz_names_a_missing_or_unknown_input():
    with pytest.raises(BadRequest, match="missing input 'meta'"):
        decode_inputs(savez(image=np.ones((1, 2))), "application/x-npz", two_inputs(8))
    with pytest.raises(BadRequest, match="unexpected input 'other'"):
        decode_inputs(savez(image=np.ones((1, 2)), meta=np.ones((1, 1)), other=np.ones(1)), "application/x-npz",
                      two_inputs(8))


def test_npz_never_unpickles():
    body = savez(image=np.array([{"a": 1}], dtype=object))
    with pytest.raises(BadRequest, match="never unpickled"):
        simple.read_npz(body, 1 << 20)


def test_a_compressed_member_inflates_within_the_limit():
    """A few KB that claim 64 MB of zeros: refused having made no more than the limit."""
    body = savez(True, image=np.zeros((1 << 23,), np.float64))
    assert len(body) < 1 << 20
    with pytest.raises(PayloadTooLarge, match="exceed the maximum allowed size of 1048576 bytes"):
        simple.read_npz(body, 1 << 20)
    assert simple.read_npz(body, (64 << 20) + 4096)["image"].shape == (1 << 23,)


@pytest.mark.parametrize("body, words", [
    (b"PK not a zip", "not a valid .npz archive"),
    (gzip.compress(b"x", mtime=0), "not a valid .npz archive"),
    (savez(), "holds no arrays"),
])
def test_a_body_that_is_no_npz_is_400(body, words):
    with pytest.raises(BadRequest, match=words):
        simple.read_npz(body, 1 << 20)


def test_a_member_that_is_not_npy_is_400():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("image.txt", b"1,2")
    with pytest.raises(BadRequest, match="not a .npy array"):
        simple.read_npz(buffer.getvalue(), 1 << 20)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("image.npy", b"\x93NUMPY garbage")
    with pytest.raises(BadRequest, match="the .npz member 'image.npy': body is not a valid .npy array"):
        simple.read_npz(buffer.getvalue(), 1 << 20)

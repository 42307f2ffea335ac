"""A model of two inputs and two outputs behind a real gunicorn, once with dynamic
batching (max_batch_size 8) and once without (0): one JSON answer form either way,
whatever JSON form, JSON Lines or .npz the request takes; labels on request (issue 24)."""

from __future__ import annotations

import io
import json
from typing import Tuple

import numpy as np
import pytest
import requests
import torch

from tests.helpers.server import ServerProcess, start_all

IMAGE = [[1.0, 2.0], [3.0, 0.5], [0.0, 0.0]]
META = [[5], [6], [7]]


class TwoInTwoOut(torch.nn.Module):
    def forward(self, image: torch.Tensor, meta: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        logits = torch.stack([image[:, 0] + image[:, 1], image[:, 0] * 2.0 - meta[:, 0].float() / 10], dim=1)
        return torch.softmax(logits, dim=1), meta[:, 0] * 10


def model_dir(parent, max_batch_size: int):
    folder = parent / f"two-{max_batch_size}"
    folder.mkdir()
    torch.jit.save(torch.jit.script(TwoInTwoOut()), str(folder / "model.pt"))
    batch = [] if max_batch_size else [-1]
    metadata = {
        "name": "two", "max_batch_size": max_batch_size,
        "inputs": [{"name": "image", "datatype": "FP32", "shape": batch + [2]},
                   {"name": "meta", "datatype": "INT64", "shape": batch + [1]}],
        "outputs": [{"name": "probs", "datatype": "FP32", "shape": batch + [2], "labels": ["cat", "dog"]},
                    {"name": "score", "datatype": "INT64", "shape": batch}],
    }
    (folder / "metadata.json").write_text(json.dumps(metadata))
    return folder


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    parent = tmp_path_factory.mktemp("answer-forms")
    started = start_all([ServerProcess(model_dir(parent, 0)), ServerProcess(model_dir(parent, 8))])
    yield started
    for server in started:
        server.terminate(timeout=10)


def expected_records() -> list[dict]:
    image, meta = np.array(IMAGE, np.float32), np.array(META)
    logits = np.stack([image[:, 0] + image[:, 1], image[:, 0] * 2 - meta[:, 0] / 10], axis=1)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return [{"probs": p, "score": int(s)} for p, s in zip(probs.tolist(), (meta[:, 0] * 10).tolist())]


def post(server, body: bytes, content_type: str, accept: str = "application/json") -> requests.Response:
    response = requests.post(server.url + "/invocations", data=body, timeout=30,
                             headers={"Content-Type": content_type, "Accept": accept})
    assert response.status_code == 200, response.text
    return response


def same_records(got: list[dict], labels: bool = False) -> None:
    expected = expected_records()
    assert [sorted(r) for r in got] == [sorted(["probs", "score"] + (["predicted_label"] if labels else []))] * 3
    for record, want in zip(got, expected):
        assert record["score"] == want["score"]
        assert np.allclose(record["probs"], want["probs"], rtol=1e-6)
        if labels:
            assert record["predicted_label"] == ["cat", "dog"][int(np.argmax(want["probs"]))]


def npz_body() -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, image=np.array(IMAGE, np.float32), meta=np.array(META))
    return buffer.getvalue()


JSON_BODIES = [
    json.dumps({"inputs": {"image": IMAGE, "meta": META}}).encode(),
    json.dumps({"instances": [{"image": i, "meta": m} for i, m in zip(IMAGE, META)]}).encode(),
    json.dumps([{"image": i, "meta": m} for i, m in zip(IMAGE, META)]).encode(),
]


@pytest.mark.parametrize("body", JSON_BODIES, ids=["inputs", "instances", "bare-list"])
def test_every_json_form_gets_one_object_per_record_whatever_the_batching(servers, body):
    answers = [post(server, body, "application/json").json() for server in servers]
    assert answers[0] == answers[1]
    # The answer takes the request's form: wrapped records answer {"predictions": ...},
    # a bare list the bare list (as AWS's PyTorch containers answer).
    same_records(answers[0] if body.startswith(b"[") else answers[0]["predictions"])


def test_json_lines_and_npz_answer_the_same_records(servers):
    lines = b"".join(json.dumps({"image": i, "meta": m}).encode() + b"\n" for i, m in zip(IMAGE, META))
    for server in servers:
        answer = post(server, lines, "application/jsonlines", "application/jsonlines")
        same_records([json.loads(line) for line in answer.content.splitlines()])
        same_records(post(server, npz_body(), "application/x-npz").json())  # not wrapped in: bare


def test_labels_on_request_in_json_and_csv(servers):
    for server in servers:
        answer = post(server, JSON_BODIES[0], "application/json", "application/json; labels=true")
        same_records(answer.json()["predictions"], labels=True)
        csv = post(server, JSON_BODIES[0], "application/json", "text/csv; labels=true").text.splitlines()
        assert [line.rsplit(",", 1)[1] for line in csv] == [r["predicted_label"] for r in answer.json()["predictions"]]
        assert "predicted_label" not in post(server, JSON_BODIES[0], "application/json").text


def test_npy_for_two_inputs_says_to_send_npz(servers):
    buffer = io.BytesIO()
    np.save(buffer, np.array(IMAGE, np.float32))
    response = requests.post(servers[0].url + "/invocations", data=buffer.getvalue(), timeout=30,
                             headers={"Content-Type": "application/x-npy"})
    assert response.status_code == 400 and "application/x-npz" in response.json()["error"]

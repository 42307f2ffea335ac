"""compat-check's parts without servers: how answers are compared, how request files get
their types, and the reference's reading of TorchServe's answer frame."""

from __future__ import annotations

import json

import pytest
from ts.context import Context, RequestProcessor
from ts.protocol.otf_message_handler import create_predict_response

from local_test.compat_check import ATOL, RTOL, Answer, first_difference, load_requests
from local_test.compat_check_reference import decode_predict_response

from tests.helpers.client import npy

TOL = {"rtol": RTOL, "atol": ATOL}


@pytest.mark.parametrize("ref, ours, difference", [
    (Answer(200, "application/json", b"[[0.1, 2.0]]"), Answer(200, "application/json; charset=utf-8", b"[[0.10000001,2]]"), None),
    (Answer(200, "application/json", b'{\n  "a": [1.0, 2.0]\n}'), Answer(200, "application/json", b'{"a":[1.0,2.5]}'), "$.a[1]: 2.0 vs 2.5"),
    (Answer(200, "application/json", b"[1, 2]"), Answer(200, "application/json", b"[1, 2, 3]"), "$: 2 items vs 3"),
    (Answer(200, "application/json", b'{"a": 1}'), Answer(200, "application/json", b'{"b": 1}'), "$: keys ['a'] vs ['b']"),
    (Answer(200, "application/json", b"[1]"), Answer(400, "application/json", b'{"error": "x"}'), "status 200 vs 400"),
    (Answer(500, "", b"Traceback ..."), Answer(500, "application/json", b'{"error": "x"}'), None),
    (Answer(200, "text/csv", b"1.0,2.0\n3,x\n"), Answer(200, "text/csv", b"1.00001,2.0\n3,x"), None),
    (Answer(200, "text/csv", b"1.0,2.0\n3,x\n"), Answer(200, "text/csv", b"1.0,2.0\n3.5,x\n"), "line 2 field 1: '3' vs '3.5'"),
    (Answer(200, "text/csv", b"1.0"), Answer(200, "application/json", b"1.0"), "Content-Type 'text/csv' vs 'application/json'"),
    (Answer(200, "application/x-npy", npy([[1.0, 2.0]])), Answer(200, "application/x-npy", npy([[1.0, 2.0]])), None),
    (Answer(200, "application/x-npy", npy([[1.0, 2.0]])), Answer(200, "application/x-npy", npy([1.0, 2.0])), "shape (1, 2) vs (2,)"),
    (Answer(200, "application/x-npy", npy([[1.0, 2.0]])), Answer(200, "application/x-npy", npy([[1.0, 3.0]])), "[0, 1]: np.float64(2.0) vs np.float64(3.0)"),
    (Answer(200, "image/png", b"\x89PNG..a"), Answer(200, "image/png", b"\x89PNG..b"), "byte 6: b'a' vs b'b'"),
    (Answer(200, "text/plain", b"1"), Answer(200, "text/plain", b"true"), "$: 1 vs true"),
])
def test_answers_are_compared_as_their_type_reads(ref, ours, difference):
    assert first_difference(ref, ours, **TOL) == difference


def test_request_types_come_from_the_name_or_the_manifest(tmp_path):
    (tmp_path / "a.json").write_text("[1]")
    (tmp_path / "b.npy").write_bytes(npy([1]))
    (tmp_path / "c.bin").write_text("1,2")
    (tmp_path / "manifest.json").write_text(json.dumps({"c.bin": {"content_type": "text/csv", "accept": "text/csv"}}))
    found = {r.name: (r.content_type, r.accept) for r in load_requests(tmp_path)}
    assert found == {"a.json": ("application/json", None), "b.npy": ("application/x-npy", None),
                     "c.bin": ("text/csv", "text/csv")}
    (tmp_path / "d.weird").write_text("?")
    with pytest.raises(SystemExit, match="d.weird: no Content-Type"):
        load_requests(tmp_path)


def context_for(requests: int) -> Context:
    context = Context("model", "/m", None, 1, None, "0.12.0")
    context.request_processor = [RequestProcessor({}) for _ in range(requests)]
    return context


def test_the_reference_reads_torchserves_answer_frame():
    """Each value as ts/protocol/otf_message_handler.py writes it: bytes as is, str as
    UTF-8, anything else as JSON; status and Content-Type from the context."""
    context = context_for(3)
    context.set_response_content_type(0, "application/x-npy")
    context.set_response_content_type(1, "text/csv")
    context.set_response_status(code=415, phrase="Unsupported", idx=2)
    frame = create_predict_response([b"\x93NUMPY", "1,2", {"a": [1]}], {0: "r0", 1: "r1", 2: "r2"}, "ok", 200, context)
    assert decode_predict_response(bytes(frame)) == [
        (200, "application/x-npy", b"\x93NUMPY"), (200, "text/csv", b"1,2"), (415, "", json.dumps({"a": [1]}, indent=2).encode())]


def test_a_failed_batch_gives_every_request_its_code_and_message():
    frame = create_predict_response(None, {0: "r0", 1: "r1"}, "Prediction failed", 503)
    assert decode_predict_response(bytes(frame)) == [(503, "text/plain", b"Prediction failed")] * 2

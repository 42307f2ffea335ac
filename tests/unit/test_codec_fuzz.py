"""Every codec's decoder, fuzzed: whatever the bytes, the only exception that leaves it is
an HTTPError with a 4xx status (a 400, or the 413 of a body past its limit). Anything
else would be a 500 with a traceback over HTTP, and a WebSocket session closed 1011.

Bodies are valid ones with a few bytes set, inserted, deleted or cut off (where the
bugs were: a .npy descr numpy lacks, zipfile's ValueError, NotImplementedError and
UnicodeDecodeError), .npy headers built from arbitrary dtypes and shapes, and plain
random bytes. Each test draws a few hundred examples: a few seconds, in every run."""

from __future__ import annotations

import gzip
import io
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from smserve.codecs import contentcoding, simple, v2
from smserve.core.metadata import ModelMetadata, TensorSpec
from smserve.errors import BadRequest, HTTPError
from smserve.protocols.simple import decode_inputs

from tests.helpers.client import npy as npy_body

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ONE = ModelMetadata(name="one", max_batch_size=8, inputs=(TensorSpec("pixels", "FP32", (4,)),),
                    outputs=(TensorSpec("p", "FP32", (2,)),))
TWO = ModelMetadata(name="two", max_batch_size=8,
                    inputs=(TensorSpec("a", "FP32", (2,)), TensorSpec("b", "INT64", (1,))))
METADATA = st.sampled_from([ONE, TWO])
LIMIT = 1 << 16  # small, so that the 413 paths are reached too


def only_client_errors(decode, *args) -> None:
    try:
        decode(*args)
    except HTTPError as e:
        assert 400 <= e.status < 500, f"{type(e).__name__} {e.status}: {e.message}"


def _edited(seed: bytes, edits: list[tuple[str, int, int]]) -> bytes:
    body = bytearray(seed)
    for kind, at, value in edits:
        at %= len(body) + 1
        if kind == "set" and at < len(body):
            body[at] = value
        elif kind == "insert":
            body.insert(at, value)
        elif kind == "delete" and at < len(body):
            del body[at]
        elif kind == "cut":
            del body[at:]
    return bytes(body)


def mutated(*seeds: bytes) -> st.SearchStrategy[bytes]:
    """A seed with one to eight bytes set, inserted or deleted, or cut short; or random bytes."""
    edit = st.tuples(st.sampled_from(("set", "insert", "delete", "cut")), st.integers(0, 1 << 16), st.integers(0, 255))
    return st.one_of(st.builds(_edited, st.sampled_from(seeds), st.lists(edit, min_size=1, max_size=8)),
                     st.binary(max_size=300))


def _npz(save, **arrays) -> bytes:
    buffer = io.BytesIO()
    save(buffer, **arrays)
    return buffer.getvalue()


NPY_SEEDS = [npy_body(np.zeros((2, 4), np.float32)), npy_body(np.arange(6, dtype=np.int64).reshape(3, 2)),
             npy_body(np.ones(3, np.uint8)), npy_body(np.zeros((2, 4), np.float32).T)]  # (the last Fortran order)
NPZ_SEEDS = [_npz(np.savez, pixels=np.zeros((2, 4), np.float32)),
             _npz(np.savez_compressed, a=np.zeros((2, 2), np.float32), b=np.ones((2, 1), np.int64))]


@st.composite
def npy_headers(draw) -> bytes:
    """A .npy body whose header says what it likes: any dtype text, shape and order."""
    descr = draw(st.sampled_from(["<", ">", "|", "=", ""])) + draw(st.sampled_from("biufcSUVMmO?")) \
        + str(draw(st.integers(0, 17)))
    shape = draw(st.lists(st.integers(0, 5), max_size=3))
    order = draw(st.booleans())
    text = f"{{'descr': '{descr}', 'fortran_order': {order}, 'shape': ({''.join(f'{d}, ' for d in shape)}), }}"
    header = text.encode("latin1") + b"\n"
    return simple.NPY_MAGIC + b"\x01\x00" + len(header).to_bytes(2, "little") + header + draw(st.binary(max_size=64))


@FUZZ
@given(st.one_of(mutated(*NPY_SEEDS), npy_headers()))
def test_npy(body):
    only_client_errors(simple.read_npy, body)


@FUZZ
@given(mutated(*NPZ_SEEDS))
def test_npz(body):
    only_client_errors(simple.read_npz, body, LIMIT)


SIMPLE_SEEDS = {
    simple.JSON: [b'{"instances": [[1, 2, 3, 4], [5, 6, 7, 8]]}', b'{"inputs": {"a": [[1, 2]], "b": [[3]]}}',
                  b"[[1.5, 2, 3, 4]]"],
    simple.CSV: [b"1,2,3,4\n5,6,7,8\n", b"1.5,-2e3,.5,0\r\n"],
    simple.JSONLINES: [b"[1, 2, 3, 4]\n[5, 6, 7, 8]\n", b'{"a": [1, 2], "b": [3]}\n{"a": [4, 5], "b": [6]}\n'],
    simple.NPY: NPY_SEEDS,
    simple.NPZ: NPZ_SEEDS,
}


@FUZZ
@given(st.sampled_from(sorted(SIMPLE_SEEDS)).flatmap(lambda kind: st.tuples(st.just(kind),
                                                                             mutated(*SIMPLE_SEEDS[kind]))),
       METADATA)
def test_simple_types(kind_and_body, metadata):
    kind, body = kind_and_body
    only_client_errors(decode_inputs, body, kind, metadata, LIMIT)


V2_JSON = (b'{"inputs": [{"name": "pixels", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}], '
           b'"outputs": [{"name": "p"}]}')
V2_HEADER = (b'{"inputs": [{"name": "pixels", "shape": [1, 4], "datatype": "FP32", '
             b'"parameters": {"binary_data_size": 16}}], "outputs": [{"name": "p", "parameters": {"binary_data": true}}]}')
V2_BYTES = (b'{"inputs": [{"name": "a", "shape": [1, 2], "datatype": "BYTES", "parameters": {"binary_data_size": 10}}]}')


@FUZZ
@given(mutated(V2_JSON, V2_HEADER + b"\0" * 16, V2_BYTES + b"\1\0\0\0x\1\0\0\0y"),
       st.one_of(st.none(), st.sampled_from([len(V2_HEADER), len(V2_BYTES)]), st.integers(-3, 400)), METADATA)
def test_v2_request(body, header_length, metadata):
    only_client_errors(v2.decode_request, body, header_length, metadata)


@FUZZ
@given(st.text(max_size=80), st.integers(0, 1 << 20))
def test_v2_header_lengths(text, content_length):
    only_client_errors(v2.sagemaker_header_length, v2.SAGEMAKER_BINARY_CONTENT_TYPE + text, content_length)
    only_client_errors(v2.sagemaker_header_length, text, content_length)
    only_client_errors(v2.header_length_from_header, text, content_length)


PLAIN = b'{"instances": [[1, 2, 3, 4]]}' * 20


@FUZZ
@given(st.sampled_from(["gzip", "deflate"]).flatmap(lambda coding: st.tuples(st.just(coding), mutated(
    gzip.compress(PLAIN, mtime=0), gzip.compress(b"", mtime=0) * 3, zlib.compress(PLAIN),
    zlib.compress(PLAIN)[2:-4]))))  # (the last raw deflate)
def test_content_coding(coding_and_body):
    coding, body = coding_and_body
    only_client_errors(contentcoding.inflate, body, coding, LIMIT)


@FUZZ
@given(st.text(max_size=40))
def test_content_coding_header(header):
    only_client_errors(contentcoding.codings, header)


# ------------------------------------------------------------------ what the fuzzing found


def _npz_edited(edit) -> bytes:
    """np.savez's archive of one stored member, edited in place: the local header at 0,
    the central directory where the end record (its last 22 bytes) says."""
    body = bytearray(NPZ_SEEDS[0])
    end = len(body) - 22
    central = struct.unpack_from("<I", body, end + 16)[0]
    edit(body, central, end)
    return bytes(body)


def _utf8_flagged_name_that_is_not(body, central, end):
    struct.pack_into("<H", body, 6, struct.unpack_from("<H", body, 6)[0] | 0x800)
    body[30] = 0xFF  # the local header's name, flagged UTF-8


@pytest.mark.parametrize("body, words", [
    (NPY_SEEDS[0].replace(b"<f4", b"<f5"), "a dtype numpy does not have: '<f5'"),
    (NPY_SEEDS[1].replace(b"<i8", b"<i3"), "a dtype numpy does not have: '<i3'"),
    (_npz_edited(lambda body, central, end: struct.pack_into("<H", body, central + 6, 148)),
     "NotImplementedError: zip file version 14.8"),
    (_npz_edited(lambda body, central, end: struct.pack_into("<I", body, end + 16, central + 1000)),
     "ValueError: negative seek value -1000"),
    (_npz_edited(_utf8_flagged_name_that_is_not), "UnicodeDecodeError"),
], ids=["npy-f5", "npy-i3", "npz-zip-version", "npz-negative-seek", "npz-utf8-name"])
def test_bodies_that_were_500_are_400_naming_the_fault(body, words):
    kind = simple.NPY if body.startswith(simple.NPY_MAGIC) else simple.NPZ
    with pytest.raises(BadRequest, match=words.replace("(", r"\(")):
        decode_inputs(body, kind, ONE, LIMIT)

"""codecs.simple keeps each .npy header's parse and each .npy answer's header: what it
keeps changes nothing it reads or writes, and a kept header still has each body's length
checked."""

from __future__ import annotations

import io

import numpy as np
import pytest

from smserve.codecs import simple
from smserve.errors import BadRequest


def saved(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def test_a_kept_header_still_checks_the_bytes_that_follow_it():
    body = saved(np.arange(12, dtype=np.float32).reshape(3, 4))
    np.testing.assert_array_equal(simple.read_npy(body), np.arange(12, dtype=np.float32).reshape(3, 4))
    assert simple._npy_header_bytes(body) in simple._npy_parsed
    for cut in (body[:-4], body + b"\0\0\0\0"):
        with pytest.raises(BadRequest, match="bytes follow it"):
            simple.read_npy(cut)


def test_a_refused_header_is_not_kept():
    body = saved(np.zeros(3, dtype=np.complex64))
    for _ in range(2):
        with pytest.raises(BadRequest, match="complex64"):
            simple.read_npy(body)
    assert simple._npy_header_bytes(body) not in simple._npy_parsed


def test_what_is_kept_stays_bounded_and_equal_to_numpys(monkeypatch):
    monkeypatch.setattr(simple, "NPY_HEADERS_KEPT", 4)
    for n in range(1, 20):
        for dtype in (np.float32, np.int64, np.uint8):
            array = np.ones((n, 2), dtype=dtype)
            body = saved(array)
            assert simple.write_npy(array) == body
            np.testing.assert_array_equal(simple.read_npy(body), array)
            assert len(simple._npy_parsed) <= 4 and len(simple._npy_written) <= 4

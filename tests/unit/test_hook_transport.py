"""What crosses between a worker and its hook processes: arrays and dense CPU tensors
through shared memory (no file left by name, the memory held by its writer's
descriptor until released), everything else as it is."""

import os

import numpy as np
import pytest
import torch

from smserve.engine.hooks import transport as hook_transport
from smserve.engine.hooks.transport import SHARED_BYTES, _Shared, release, restored, shareable

BIG = SHARED_BYTES // 4 + 1  # float32 elements past the shared-memory size


def files_left() -> set[str]:
    return {name for name in os.listdir(hook_transport.SHM_DIR) if name.startswith(f"smserve-hook-{os.getpid()}-")}


@pytest.mark.parametrize("value", [
    np.arange(BIG, dtype=np.float32).reshape(-1, 1),
    np.arange(BIG, dtype=">f4"),  # another byte order: kept as it was
    np.arange(2 * BIG, dtype=np.int64)[::2],  # not contiguous
    torch.arange(BIG, dtype=torch.float32).reshape(1, -1),
    torch.arange(BIG, dtype=torch.float32).to(torch.bfloat16),
    torch.ones(BIG, 2, dtype=torch.bool).t(),
    torch.zeros(0, 3),
    np.zeros(3, np.float32),  # small: pickled
])
def test_arrays_and_tensors_come_back_equal(value):
    before = files_left()
    held = []
    sent = shareable(value, held)
    big = getattr(value, "nbytes", 0) >= SHARED_BYTES
    assert isinstance(sent, _Shared) == big and len(held) == big
    assert files_left() == before  # none by name, from the start
    back = restored(sent)
    release(held)  # the mapping keeps the memory
    assert type(back) is type(value)
    if isinstance(value, torch.Tensor):
        assert back.dtype == value.dtype and back.shape == value.shape and torch.equal(back, value)
    else:
        assert back.dtype == value.dtype and np.array_equal(back, value)
    assert files_left() == before


def test_containers_and_other_values_cross_whole():
    image = np.ones((300, 300, 3), np.uint8)
    value = {"pixels": image, "meta": [torch.ones(BIG), "text", 3], "sparse": torch.ones(2, 2).to_sparse()}
    held = []
    back = restored(shareable(value, held))
    release(held)
    assert np.array_equal(back["pixels"], image) and torch.equal(back["meta"][0], torch.ones(BIG))
    assert back["meta"][1:] == ["text", 3] and torch.equal(back["sparse"].to_dense(), torch.ones(2, 2))
    back["pixels"][0, 0, 0] = 7  # a mapping of its own, writable


def test_a_value_that_fails_half_way_releases_what_it_wrote(monkeypatch):
    reserve, written = os.posix_fallocate, []

    def second_fails(fd, offset, size):
        if written:
            raise OSError(28, "No space left on device")
        written.append(fd)
        reserve(fd, offset, size)

    monkeypatch.setattr(hook_transport.os, "posix_fallocate", second_fails)
    held = [-1]  # (another value's, kept)
    with pytest.raises(hook_transport.SharedMemoryFull):
        shareable({"first": np.ones(BIG, np.float32), "second": np.ones(BIG, np.float32)}, held)
    assert held == [-1]
    with pytest.raises(OSError):
        os.fstat(written[0])  # the first array's file: closed, its memory gone


def test_a_full_dev_shm_is_an_error_that_says_so(monkeypatch):
    def full(fd, offset, size):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hook_transport.os, "posix_fallocate", full)
    held = []
    with pytest.raises(hook_transport.SharedMemoryFull, match=r"an array of 0\.1 MiB does not fit in /dev/shm \("):
        shareable([np.ones(BIG, np.float32)], held)
    assert held == []

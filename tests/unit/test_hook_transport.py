"""What crosses between a worker and its hook processes: arrays and dense CPU tensors
through shared memory (each file gone once mapped), everything else as it is."""

import os

import numpy as np
import pytest
import torch

from smserve.engine import hook_processes
from smserve.engine.hook_processes import SHARED_BYTES, _Shared, restored, shareable

BIG = SHARED_BYTES // 4 + 1  # float32 elements past the shared-memory size


def files_left() -> set[str]:
    return {name for name in os.listdir(hook_processes._SHM_DIR) if name.startswith(f"smserve-hook-{os.getpid()}-")}


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
    sent = shareable(value)
    big = getattr(value, "nbytes", 0) >= SHARED_BYTES
    assert isinstance(sent, _Shared) == big
    back = restored(sent)
    assert type(back) is type(value)
    if isinstance(value, torch.Tensor):
        assert back.dtype == value.dtype and back.shape == value.shape and torch.equal(back, value)
    else:
        assert back.dtype == value.dtype and np.array_equal(back, value)
    assert files_left() == before  # the file went once mapped


def test_containers_and_other_values_cross_whole():
    image = np.ones((300, 300, 3), np.uint8)
    value = {"pixels": image, "meta": [torch.ones(BIG), "text", 3], "sparse": torch.ones(2, 2).to_sparse()}
    back = restored(shareable(value))
    assert np.array_equal(back["pixels"], image) and torch.equal(back["meta"][0], torch.ones(BIG))
    assert back["meta"][1:] == ["text", 3] and torch.equal(back["sparse"].to_dense(), torch.ones(2, 2))
    back["pixels"][0, 0, 0] = 7  # a mapping of its own, writable

"""The GPU code paths, exercised on a CPU host (no GPU here): device choice and counts."""

import os

import pytest
import torch

from smserve.engine.worker import hardware
from smserve.engine.model.torch_model import choose_device
from smserve.engine.worker.loaded_model import ModelLoadError
from smserve.settings import Settings


@pytest.mark.parametrize("worker, expected", [(0, "cuda:0"), (1, "cuda:1"), (2, "cuda:0"), (5, "cuda:1")])
def test_worker_i_takes_gpu_i_mod_n(monkeypatch, worker, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert str(choose_device("auto", worker)) == expected


def test_cpu_when_there_is_no_gpu_or_when_asked(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert choose_device("auto", 3).type == "cpu"
    with pytest.raises(ModelLoadError, match="SMSERVE_DEVICE=cuda"):
        choose_device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert choose_device("cpu", 0).type == "cpu"


def test_gpu_count_from_device_nodes(monkeypatch):
    monkeypatch.setattr(hardware.glob, "glob", lambda _: ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"])
    assert hardware.gpu_count(Settings(nvidia_visible_devices="all")) == 2


# ------------------------------------------------------------ workers per GPU

GIB = 1 << 30


@pytest.mark.parametrize("gpus, cores, memory, weights, per_gpu, expected, words", [
    (0, 16, None, 0, None, 1, "no GPU"),
    (0, 16, None, 0, 3, 1, "no GPU"),  # workers per GPU mean nothing without one
    (1, 4, 24 * GIB, 100 << 20, None, 2, "2 for 4 cores"),  # g5.xlarge, a small model: two cores a worker
    (1, 2, 24 * GIB, 100 << 20, None, 1, "1 for 2 cores"),
    (1, 16, 24 * GIB, 100 << 20, None, 4, "4 per GPU"),  # the cap
    (4, 6, 24 * GIB, 100 << 20, None, 4, "1 for 6 cores"),  # one worker per GPU when the cores run out
    (8, 192, 141 * GIB, 100 << 20, None, 32, "4 per GPU x 8 GPUs"),
    (1, 8, 24 * GIB, 4 * GIB, None, 1, "1 for 24 GiB per GPU and a 4.00 GiB model"),  # 3 x 4 GiB + context fits once in 12
    (1, 8, 80 * GIB, 4 * GIB, None, 3, "3 for 80 GiB"),
    (2, 32, None, 100 << 20, None, 2, "memory unknown"),
    (2, 32, None, 100 << 20, 6, 12, "SMSERVE_WORKERS_PER_GPU"),  # set: the user knows best
])
def test_worker_plan(gpus, cores, memory, weights, per_gpu, expected, words):
    plan = hardware.plan_workers(gpus, cores, memory, weights, per_gpu)
    assert plan.workers == expected
    assert words in plan.reason


def test_gpu_memory_and_model_size_as_the_master_finds_them(monkeypatch, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 81559\necho 46068\n")  # MiB; the smallest GPU bounds the plan
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    model = tmp_path / "model"
    (model / "code").mkdir(parents=True)
    (model / "model.pt").write_bytes(b"x" * (3 << 20))
    (model / "code" / "big.bin").write_bytes(b"x" * (5 << 20))  # code/ is not weights
    assert hardware.gpu_memory_bytes() == 46068 << 20
    assert hardware.model_bytes(str(model)) == 3 << 20
    monkeypatch.setattr(hardware, "cpu_count", lambda: 16)
    settings = Settings(model_dir=str(model), cuda_visible_devices="0,1")
    assert hardware.default_plan(settings).workers == 2 * hardware.MAX_AUTO_WORKERS_PER_GPU
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert hardware.gpu_memory_bytes() is None
    assert hardware.default_plan(settings).workers == 2

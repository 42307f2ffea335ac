"""The GPU code paths, exercised on a CPU host (no GPU here): device choice and counts."""

import pytest
import torch

from smserve import hardware
from smserve.model import ModelLoadError, choose_device


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


@pytest.mark.parametrize("variable, value, expected", [
    ("CUDA_VISIBLE_DEVICES", "0,1,2", 3),
    ("CUDA_VISIBLE_DEVICES", "", 0),
    ("CUDA_VISIBLE_DEVICES", "-1", 0),
    ("NVIDIA_VISIBLE_DEVICES", "GPU-abc,GPU-def", 2),
    ("NVIDIA_VISIBLE_DEVICES", "void", 0),
])
def test_gpu_count_follows_the_visible_devices(monkeypatch, variable, value, expected):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv(variable, value)
    assert hardware.gpu_count() == expected
    assert hardware.default_workers() == max(expected, 1)


def test_gpu_count_from_device_nodes(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "all")
    monkeypatch.setattr(hardware.glob, "glob", lambda _: ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"])
    assert hardware.gpu_count() == 2

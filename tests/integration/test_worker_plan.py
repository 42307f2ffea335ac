"""The master's worker count on a GPU host, with the GPU faked: CUDA_VISIBLE_DEVICES says
one GPU, a stand-in nvidia-smi reports its memory, and SMSERVE_DEVICE=cpu lets the
workers load the model on this CPU. The plan (hardware.plan_workers) must reach gunicorn."""

from __future__ import annotations

import os
import re

from smserve.engine.worker import hardware
from tests.helpers.server import logged


def _fake_gpu_env(tmp_path, memory_mib: int) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\necho {memory_mib}\n")
    fake.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": "0", "SMSERVE_DEVICE": "cpu",
            "SAGEMAKER_MODEL_SERVER_WORKERS": ""}


def _worker_count(server) -> int:
    # The arbiter's own line, written once every worker is forked.
    found = re.search(r"(\d+) workers?: (.*)", server.log())
    assert found, server.log()[-3000:]
    return int(found.group(1))


def test_the_plan_reaches_gunicorn(make_server, example_model_dir, tmp_path):
    server = make_server(example_model_dir, _fake_gpu_env(tmp_path, 24576))
    expected = max(1, min(hardware.MAX_AUTO_WORKERS_PER_GPU, hardware.cpu_count() // hardware.CORES_PER_WORKER))
    assert _worker_count(server) == expected
    assert logged(server, f"{expected} per GPU x 1 GPUs"), server.log()


def test_workers_per_gpu_setting_wins(make_server, example_model_dir, tmp_path):
    server = make_server(example_model_dir, {**_fake_gpu_env(tmp_path, 24576), "SMSERVE_WORKERS_PER_GPU": "3"})
    assert _worker_count(server) == 3

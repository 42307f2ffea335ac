"""What the host offers, found without importing torch or initialising CUDA.

The gunicorn master uses this to choose a worker count; CUDA must not be initialised
before fork, so the master only counts device nodes and asks nvidia-smi for memory.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from smserve import toolkit
from smserve.settings import Settings

GIB = 1 << 30
# Workers per GPU chosen by default: more front ends (event loop, codecs, HTTP) for one
# device, never more than this (each splits the device's dynamic batches further).
MAX_AUTO_WORKERS_PER_GPU = 4
CORES_PER_WORKER = 2
# What one worker's CUDA context and allocator take before the model, and how many times its weights' size a worker may come to
# hold (weights, activations of a full batch, the caching allocator's slack).
CUDA_CONTEXT_BYTES = GIB // 2
MODEL_FOOTPRINT_FACTOR = 3
# Share of the GPU's memory the default lets the workers' estimated footprint take.
GPU_MEMORY_SHARE = 0.5


def gpu_count(settings: Settings) -> int:
    """GPUs this container may use: the first visible-devices list set that names
    devices, else the device nodes."""
    for value in (settings.cuda_visible_devices, settings.nvidia_visible_devices):
        if value is None:
            continue
        value = value.strip()
        if value in ("", "none", "void", "-1"):
            return 0
        if value != "all":
            return len([v for v in value.split(",") if v.strip()])
    return len([p for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", p)])


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def gpu_memory_bytes() -> int | None:
    """The smallest total memory of the visible GPUs, from nvidia-smi (which the NVIDIA
    container runtime mounts into GPU containers); None when it cannot be asked."""
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return None
    try:
        done = subprocess.run([nvidia_smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    values = [int(v) for v in re.findall(r"^\s*(\d+)\s*$", done.stdout, re.M)] if done.returncode == 0 else []
    return min(values) * 1024 * 1024 if values else None  # MiB


def model_bytes(model_dir: str) -> int:
    """Bytes of the model's files (its code/ folder aside): a stand-in for its weights."""
    total = 0
    for root, dirs, files in os.walk(model_dir):
        if root == model_dir and toolkit.CODE_DIR in dirs:
            dirs.remove(toolkit.CODE_DIR)
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


@dataclass(frozen=True)
class WorkerPlan:
    workers: int
    reason: str


def plan_workers(gpus: int, cores: int, gpu_memory: int | None, weights: int,
                 per_gpu: int | None = None) -> WorkerPlan:
    """How many workers: on a CPU host one, whose torch threads use the cores. On a GPU
    host `per_gpu` workers per GPU when set; otherwise as many as the cores, the GPU's
    memory (two cores a worker) and MAX_AUTO_WORKERS_PER_GPU allow (each worker holds its own copy of the
    model), and one per GPU when the memory cannot be known or the model is big."""
    if gpus <= 0:
        return WorkerPlan(1, "no GPU: one worker, its torch threads on every core")
    if per_gpu is not None:
        return WorkerPlan(gpus * per_gpu, f"{per_gpu} per GPU (SMSERVE_WORKERS_PER_GPU) x {gpus} GPUs")
    # A worker keeps two threads busy (its event loop, and the inference thread that
    # launches the GPU's work): two cores each. More workers than that only trade places
    # on the cores.
    by_cores = max(1, cores // (CORES_PER_WORKER * gpus))
    if gpu_memory is None:
        return WorkerPlan(gpus, f"one per GPU x {gpus} GPUs (GPU memory unknown: nvidia-smi did not answer)")
    footprint = CUDA_CONTEXT_BYTES + MODEL_FOOTPRINT_FACTOR * weights
    by_memory = max(1, int(GPU_MEMORY_SHARE * gpu_memory // footprint))
    per = min(MAX_AUTO_WORKERS_PER_GPU, by_cores, by_memory)
    return WorkerPlan(gpus * per, f"{per} per GPU x {gpus} GPUs (the least of: the default cap "
                                  f"{MAX_AUTO_WORKERS_PER_GPU}; {by_cores} for {cores} cores; {by_memory} for "
                                  f"{gpu_memory / GIB:.0f} GiB per GPU and a {weights / GIB:.2f} GiB model)")


def default_plan(settings: Settings) -> WorkerPlan:
    gpus = gpu_count(settings)
    if gpus <= 0:
        return plan_workers(0, cpu_count(), None, 0)
    per_gpu = settings.workers_per_gpu
    memory = None if per_gpu is not None else gpu_memory_bytes()
    weights = model_bytes(settings.model_dir) if settings.model_dir and memory is not None else 0
    return plan_workers(gpus, cpu_count(), memory, weights, per_gpu)


def default_workers(settings: Settings) -> int:
    return default_plan(settings).workers

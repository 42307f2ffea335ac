"""What the host offers, found without importing torch or initialising CUDA.

The gunicorn master uses this to choose a worker count; CUDA must not be initialised
before fork, so the master only counts device nodes.
"""

from __future__ import annotations

import glob
import os
import re


def gpu_count() -> int:
    """GPUs this container may use: the visible-devices list if set, else the device nodes."""
    for variable in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        value = os.environ.get(variable)
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


def default_workers() -> int:
    """One worker per GPU; on a CPU host one worker whose torch threads use the cores."""
    return gpu_count() or 1

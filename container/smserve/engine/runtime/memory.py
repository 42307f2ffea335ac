"""What memory a process holds and what the container may hold: for multi-model
endpoints, which measure each model's footprint as it loads and refuse a model that
does not fit (507), and for giving memory back after an unload."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

MB = 1 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE")
# cgroup v2, then v1: the container's limit and what it uses now.
_LIMIT_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
_USAGE_FILES = ("/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory/memory.usage_in_bytes")


def rss_bytes() -> int:
    """This process's resident memory now (not its peak: a model's footprint is what it
    keeps after loading and warming, not the temporary copies it made on the way)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def _first_number(paths: tuple[str, ...]) -> int | None:
    for path in paths:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
        return None  # "max": no limit at this level
    return None


def _meminfo(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def container_limit() -> int:
    """The cgroup's memory limit, or the host's memory where none is set (a v1 cgroup
    without a limit reports a number near 2**63)."""
    total = _meminfo("MemTotal")
    limit = _first_number(_LIMIT_FILES)
    return total if limit is None or limit >= total else limit


def container_usage() -> int:
    usage = _first_number(_USAGE_FILES)
    if usage is None:
        usage = _meminfo("MemTotal") - _meminfo("MemAvailable")
    return usage


def gpu_allocated() -> dict[int, int]:
    """Bytes torch holds on each CUDA device ({} on a CPU host, or before torch is in)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return {}
    return {i: torch.cuda.memory_allocated(i) for i in range(torch.cuda.device_count())}


def gpu_room() -> dict[int, int]:
    """Free bytes on each CUDA device now."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return {}
    return {i: torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count())}


def give_back() -> None:
    """Return freed heap to the system after an unload: glibc keeps freed small blocks in
    its arenas, so without this a worker's RSS would only grow over load/unload cycles.
    (Large tensors are mmap'd and return when freed.) collect() then trim(); a gevent
    worker runs trim() on a thread (engine/multimodel/server.py)."""
    collect()
    trim()


def collect() -> None:
    """What an unloaded model left in reference cycles, freed. Holds the GIL throughout,
    for as long as the objects the collector looks at take: a worker freezes what its
    start made (gc.freeze) so that this is about the models' objects only."""
    import gc

    gc.collect()


def trim() -> None:
    """Freed heap (and CUDA's cached blocks) back to the system. malloc_trim runs in C
    without the GIL (ctypes releases it): it may run on a thread beside the event loop."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _ = _LIBC.malloc_trim  # glibc only (musl has none)
        except (OSError, AttributeError):
            _LIBC = False
    return _LIBC or None

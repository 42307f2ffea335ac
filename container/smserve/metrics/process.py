"""The workers' own CPU, memory and GPU memory, as multiprocess metrics.

prometheus_client's process collector reads the scraping process only, so in
multiprocess mode it would describe whichever worker answered the scrape. Instead each
worker samples itself every SAMPLE_INTERVAL_S on its event loop (a few system calls:
microseconds) and the scraping worker once more just before it collects. The values
are summed over the workers, not labelled by pid: a pid label would start new series
at every worker restart, and a summed CPU counter keeps the seconds of the workers
that exited (their files stay), so it never goes backwards either.
"""

from __future__ import annotations

import logging
import os
import sys

from smserve.metrics import tally

log = logging.getLogger(__name__)

SAMPLE_INTERVAL_S = 5.0  # a multiple of tally.FLUSH_INTERVAL_S
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_cpu_seen = 0.0  # this process's CPU seconds already counted
_families = None  # catalog.Catalog: what sample() writes to, from start_sampling
_sampler = None


def start_sampling(families) -> None:
    """Sample into `families` (catalog.Catalog) now and then every SAMPLE_INTERVAL_S,
    and flush the tallies every tally.FLUSH_INTERVAL_S, in a greenlet of this worker's
    loop."""
    global _families, _sampler
    _families = families
    sample()
    if _sampler is None:
        import gevent

        _sampler = gevent.spawn(_sample_forever)


def _sample_forever() -> None:
    import gevent

    ticks = 0
    while True:
        gevent.sleep(tally.FLUSH_INTERVAL_S)
        ticks += 1
        try:
            tally.flush()
            if ticks * tally.FLUSH_INTERVAL_S >= SAMPLE_INTERVAL_S:
                ticks = 0
                sample()
        except Exception:  # noqa: BLE001 - a metric must never take the worker down
            log.exception("writing the process's metrics failed")


def sample(torch=None) -> None:
    """Record this process's CPU time, resident memory and (once CUDA is initialised:
    never initialise it here) GPU memory per device. torch: for tests, a stand-in."""
    global _cpu_seen
    families = _families
    if families is None:
        return
    times = os.times()
    cpu = times.user + times.system
    if cpu > _cpu_seen:
        families.cpu.inc(cpu - _cpu_seen)
        _cpu_seen = cpu
    rss = resident_bytes()
    if rss is not None:
        families.memory.set(rss)
    torch = torch or sys.modules.get("torch")
    if torch is not None:
        for device, allocated, reserved in gpu_memory(torch):
            families.gpu_allocated.labels(device).set(allocated)
            families.gpu_reserved.labels(device).set(reserved)


def resident_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


def gpu_memory(torch) -> list[tuple[str, int, int]]:
    """(device index, bytes allocated, bytes reserved) for each GPU this process has
    used; nothing before CUDA is initialised (the inference thread does that)."""
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_available() or not cuda.is_initialized():
            return []
        return [(str(i), int(cuda.memory_allocated(i)), int(cuda.memory_reserved(i)))
                for i in range(cuda.device_count())]
    except Exception as e:  # noqa: BLE001 - a driver error must not break the scrape
        log.debug("no GPU memory figures: %s", e)
        return []

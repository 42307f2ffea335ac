"""What one worker sustains, from the settings and the host: its threads (codec,
session, hook, torch's) and batch transform's execution parameters."""

from __future__ import annotations

from smserve.engine.runtime.threads import Pools
from smserve.engine.worker import hardware
from smserve.settings import DEFAULT_PAYLOAD_MB, Settings
from smserve.variables import MAX_TRANSFORM_BUDGET_MB


def cores_per_worker(workers: int) -> int:
    return max(1, hardware.cpu_count() // max(1, workers))


def pools(settings: Settings, workers: int) -> Pools:
    """The threads a worker's models share."""
    # Hooks decode images and text per request: the worker's share of the cores, and
    # no more, since more hook threads than cores starve the event loops (and /ping).
    hooks = settings.hook_threads or cores_per_worker(workers)
    # With hook processes, a hook thread only waits on one: as many as there are.
    hooks = max(hooks, settings.hook_processes)
    return Pools.sized(settings.codec_threads, settings.max_sessions + 4, hooks)


def torch_threads(settings: Settings, workers: int) -> int:
    """torch's intra-op threads for a model on the CPU."""
    return settings.torch_threads or cores_per_worker(workers)


def execution_parameters(settings: Settings, workers: int) -> dict:
    """What this container sustains: a couple of requests per worker in flight
    (one computing, one arriving), within SageMaker's concurrency x payload <= 100 MB.
    A job's MaxPayloadInMB=0 (no limit) is reported as it is: the budget then bounds
    nothing, and the server takes bodies up to its own SMSERVE_MAX_REQUEST_MB."""
    payload = settings.max_payload_mb
    if payload is None:
        payload = DEFAULT_PAYLOAD_MB
    concurrency = settings.max_concurrent_transforms or 2 * workers
    if payload:
        concurrency = min(concurrency, MAX_TRANSFORM_BUDGET_MB // payload)
    concurrency = max(1, concurrency)
    return {
        "MaxConcurrentTransforms": concurrency,
        "BatchStrategy": settings.batch_strategy,
        "MaxPayloadInMB": payload,
    }

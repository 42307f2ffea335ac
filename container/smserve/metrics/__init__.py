"""The server's metrics: what the rest of the code records, and nothing else to know.

`enable(settings)` turns them on in a worker (routes.app.create_app calls it); until
then, and with SMSERVE_METRICS=false, every function here returns at once. Every
recording call runs on the worker's event loop (never on the inference or codec
threads), so no lock is contended on the inference path; /metrics collects on a
codec thread (exposition.py).
"""

from __future__ import annotations

import os
import time

_families = None  # catalog.Catalog once enabled
_registry = None  # single-process mode's registry (None in multiprocess mode)
_requests: dict = {}  # (route, code) -> (counter child, histogram child)
_models: dict = {}  # name -> ModelStats


def enable() -> None:
    """Create this process's metrics: in multiprocess mode when PROMETHEUS_MULTIPROC_DIR
    is set (`serve` sets it; prometheus_client reads it when first imported), else in
    this process only (another WSGI server, Flask's test client). Idempotent."""
    global _families, _registry
    if _families is not None:
        return
    from prometheus_client import CollectorRegistry

    from smserve.metrics import catalog, process

    _registry = None if os.environ.get("PROMETHEUS_MULTIPROC_DIR") else CollectorRegistry(auto_describe=True)
    _families = catalog.Catalog(_registry)
    _families.workers.set(1)
    process.start_sampling()


def enabled() -> bool:
    return _families is not None


def families():
    return _families


def registry():
    return _registry


def request(route: str, status: int, seconds: float) -> None:
    """One HTTP request answered (status 0: the client left before any answer)."""
    if _families is None:
        return
    key = (route, status)
    children = _requests.get(key)
    if children is None:
        children = _requests[key] = (_families.requests.labels(route, str(status)),
                                     _families.request_duration.labels(route))
    children[0].inc()
    children[1].observe(seconds)


def model(name: str) -> "ModelStats":
    """One model's metrics (its runner's queue and passes, its readiness)."""
    stats = _models.get(name)
    if stats is None:
        stats = ModelStats(name)
        if _families is not None:
            _models[name] = stats
    return stats


class ModelStats:
    """A model's runner reports through this: all no-ops while metrics are off."""

    __slots__ = ("name", "_inferences", "_batches", "_queue", "_pending", "_ready")

    def __init__(self, name: str):
        self.name = name
        f = _families
        if f is None or name is None:  # off, or a model not loaded yet
            self._inferences = self._batches = self._queue = self._pending = self._ready = None
            return
        self._inferences = f.inferences.labels(name)
        self._batches = f.batches.labels(name)
        self._queue = f.queue_duration.labels(name)
        self._pending = f.pending.labels(name)
        self._ready = f.model_ready.labels(name)

    def ran(self, records: int) -> None:
        """A forward pass over `records` records ended well."""
        if self._batches is not None:
            self._batches.inc()
            self._inferences.inc(records)

    def waited(self, queued_at: float, started_at: float | None = None) -> None:
        """A request queued at `queued_at` (time.monotonic) reached its forward pass."""
        if self._queue is not None:
            self._queue.observe(max(0.0, (started_at or time.monotonic()) - queued_at))

    def pending(self, delta: int) -> None:
        if self._pending is not None:
            self._pending.inc(delta)

    def ready(self, ready: bool) -> None:
        """Loaded and serving (True), or unloaded (False): the series stays, at 0."""
        if self._ready is not None:
            self._ready.set(1 if ready else 0)


def websocket_session(opened: bool) -> None:
    if _families is None:
        return
    if opened:
        _families.sessions.inc()
        _families.sessions_open.inc()
    else:
        _families.sessions_open.dec()


def websocket_message() -> None:
    if _families is not None:
        _families.messages.inc()


def stream_started() -> None:
    if _families is not None:
        _families.streams.inc()


def stream_chunk() -> None:
    if _families is not None:
        _families.chunks.inc()

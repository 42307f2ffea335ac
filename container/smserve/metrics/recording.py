"""What the server records, behind the package's face (smserve.metrics).

`enable()` turns them on in a worker (routes.app.create_app calls it); until then, and
with SMSERVE_METRICS=false, every function here returns at once. Every recording call
runs on the worker's event loop (never on the inference or codec threads), so no lock
is contended on the inference path; what happens per request is kept in plain Python
and written to the shared files once a second (tally.py); /metrics collects on a codec
thread (exposition.py).
"""

from __future__ import annotations

import time

from smserve.metrics.tally import Count, Level, Observations, flush

_families = None  # catalog.Catalog once enabled
_registry = None  # single-process mode's registry (None in multiprocess mode)
_scraped = None  # what /metrics encodes: _registry, or every worker's files
_requests: dict = {}  # (route, code) -> (its Count, its route's Observations)
_durations: dict = {}  # route -> Observations
_models: dict = {}  # name -> ModelStats
_users: dict = {}  # name -> how many runners use its ModelStats


def enable(folder: str | None = None) -> None:
    """Create this process's metrics: in multiprocess mode when given the folder
    (Settings.metrics_dir: PROMETHEUS_MULTIPROC_DIR, which `serve` sets and
    prometheus_client reads when first imported), else in this process only (another
    WSGI server, Flask's test client). Idempotent."""
    global _families, _registry, _scraped
    if _families is not None:
        return
    from prometheus_client import CollectorRegistry

    from smserve.metrics import catalog, exposition, process  # noqa: F401 - exposition: its imports, now

    _registry = None if folder else CollectorRegistry(auto_describe=True)
    _scraped = exposition.every_worker(folder) if folder else _registry
    _families = catalog.Catalog(_registry)
    _families.workers.set(1)
    process.start_sampling(_families)


def enabled() -> bool:
    return _families is not None


def families():
    return _families


def registry():
    """What /metrics encodes: this process's registry, or in multiprocess mode one that
    reads every worker's files at each collect."""
    return _scraped


def request(route: str, status: int, seconds: float) -> None:
    """One HTTP request answered (status 0: the client left before any answer)."""
    if _families is None:
        return
    key = (route, status)
    tallies = _requests.get(key)
    if tallies is None:
        duration = _durations.get(route)
        if duration is None:
            duration = _durations[route] = Observations(_families.request_duration.labels(route))
        tallies = _requests[key] = (Count(_families.requests.labels(route, str(status))), duration)
    tallies[0].inc()
    tallies[1].observe(seconds)


def model(name: str) -> "ModelStats":
    """One model's metrics (its runner's queue and passes, its readiness); each call is
    one user of them until its forget_model (a model reloaded under its name while its
    last generation still unloads shares them with it)."""
    stats = _models.get(name)
    if stats is None:
        stats = ModelStats(name)
        if _families is not None:
            _models[name] = stats
    if _families is not None:
        _users[name] = _users.get(name, 0) + 1
    return stats


def forget_model(name: str) -> None:
    """An unloaded model's metrics, let go of in this process. A multi-model endpoint
    loads and unloads thousands of distinct models; each kept ~20 prometheus values,
    its tallies and its children here for good: memory, and objects that every later
    collection (an unload's, engine/runtime/memory.collect) walks while /ping waits.
    What they counted stays in this worker's files (multiprocess mode): its series
    keep their sums, and a later load of the same name counts on from them. In
    single-process mode the values are the series, so they stay."""
    if _families is None or _registry is not None or _models.get(name) is None:
        return
    _users[name] = _users.get(name, 1) - 1
    if _users[name] > 0:
        return  # another generation of it still counts through them
    del _users[name]
    flush()  # its tallies' news first
    del _models[name]
    doomed = []
    f = _families
    for family in (f.inferences, f.batches, f.queue_duration, f.pending, f.model_ready):
        child = family._metrics.get((name,))  # noqa: SLF001 - labels() would make one
        if child is not None:
            doomed += [getattr(child, attr) for attr in ("_value", "_sum") if hasattr(child, attr)]
            doomed += list(getattr(child, "_buckets", ()))
            family.remove(name)
    _release_values(doomed)


def _release_values(doomed: list) -> None:
    """prometheus_client's multiprocess values list every value ever made (to re-open
    their files after a fork) and never drop one: these go from that list too. Found in
    the value class's closure (prometheus_client 0.26, pinned); a version without it
    keeps them, as before."""
    from prometheus_client import values as prometheus_values

    init = getattr(prometheus_values.ValueClass, "__init__", None)
    cells = dict(zip(getattr(getattr(init, "__code__", None), "co_freevars", ()), getattr(init, "__closure__", None) or ()))
    listed, lock = cells.get("values"), cells.get("lock")
    if listed is None or lock is None or not doomed:
        return
    gone = {id(value) for value in doomed}
    with lock.cell_contents:
        listed.cell_contents[:] = [v for v in listed.cell_contents if id(v) not in gone]


class ModelStats:
    """A model's runner reports through this: all no-ops while metrics are off."""

    __slots__ = ("name", "_inferences", "_batches", "_queue", "_pending", "_ready")

    def __init__(self, name: str):
        self.name = name
        f = _families
        if f is None or name is None:  # off, or a model not loaded yet
            self._inferences = self._batches = self._queue = self._pending = self._ready = None
            return
        self._inferences = Count(f.inferences.labels(name))
        self._batches = Count(f.batches.labels(name))
        self._queue = Observations(f.queue_duration.labels(name))
        self._pending = Level(f.pending.labels(name))
        self._ready = f.model_ready.labels(name)  # rare: written at once

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
            self._pending.add(delta)

    def ready(self, ready: bool) -> None:
        """Loaded and serving (True), or unloaded (False): the series stays, at 0."""
        if self._ready is not None:
            self._ready.set(1 if ready else 0)


_events: dict = {}  # name -> Count, for the unlabelled counters


def _count(name: str) -> None:
    count = _events.get(name)
    if count is None:
        count = _events[name] = Count(getattr(_families, name))
    count.inc()


def websocket_session(opened: bool) -> None:
    if _families is None:
        return
    if opened:
        _count("sessions")
        _families.sessions_open.inc()  # rare: written at once
    else:
        _families.sessions_open.dec()


_session_counts: dict = {}  # how -> Count


def stateful_session(how: str, open_now: int, state_bytes: int) -> None:
    """A stateful session opened, or ended (how: closed, expired, unloaded, shutdown, idle, memory);
    open_now and state_bytes: this worker's, after it. Rare: the gauges are written at once."""
    if _families is None:
        return
    count = _session_counts.get(how)
    if count is None:
        count = _session_counts[how] = Count(_families.stateful_sessions.labels(how))
    count.inc()
    _families.stateful_sessions_open.set(open_now)
    _families.session_state.set(state_bytes)


def session_handoff() -> None:
    if _families is not None:
        _count("handoffs")


def session_state(state_bytes: int) -> None:
    """The open sessions' state after a request changed one: this worker's bytes."""
    if _families is not None:
        _families.session_state.set(state_bytes)


def websocket_message() -> None:
    if _families is not None:
        _count("messages")


def stream_started() -> None:
    if _families is not None:
        _count("streams")


def stream_chunk() -> None:
    if _families is not None:
        _count("chunks")

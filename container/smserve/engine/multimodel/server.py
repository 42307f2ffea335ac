"""One worker's side of a multi-model endpoint (SAGEMAKER_MULTI_MODEL=true).

SageMaker copies a model to the instance, then asks any worker to load it; it decides
what to unload and when (on a 507 it unloads what it used least and retries): this
server never unloads a model on its own. Each model is a ModelServer of its own: its
hooks, metadata, inference thread and batching queue (two models' requests are never
batched together), sharing the worker's codec and session threads.

Every worker in step: the models wanted live in a shared folder (engine/multimodel/registry.py)
that every worker follows. The worker that takes `POST /models` registers the model and
answers 200 once every worker has loaded and warmed it (so no sibling answers 404 or
503 afterwards), within SMSERVE_MODEL_LOAD_TIMEOUT; a retried POST joins that load.
`DELETE` answers once no worker holds it, one still loading it included (that load ends
unserved); past its timeout the workers go on, and a DELETE again waits for them. A
worker that restarts loads every registered model before it takes a connection.

Whether a model may come in (its folder, the room its memory takes: 507 past it) is
admission.py's; the start's rehearsal load, rehearsal.py's.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import tempfile
import time
from dataclasses import replace

import gevent
from gevent.event import Event
from gevent.lock import Semaphore

from smserve.engine.model.torch_caches import clear_torch_caches, generated_code
from smserve.engine.multimodel.admission import (
    Room,
    check_model_folder,
    footprint,
    memory_now,
    warn_of_a_big_torchscript,
)
from smserve.engine.multimodel.registry import LOADING, READY, UNLOADING, Entry, SharedRegistry, check_name
from smserve.engine.multimodel.rehearsal import rehearse
from smserve.engine.runtime import memory
from smserve.engine.sessions.store import SessionTable
from smserve.engine.worker import capacity, readiness
from smserve.engine.worker.server import FAILED, ModelServer
from smserve.errors import BadRequest, Conflict, NotFound, Unavailable
from smserve.settings import Settings

log = logging.getLogger(__name__)

# How often a worker looks at the shared folder; also the poll of a caller waiting for
# the other workers (short next to a model's load).
FOLLOW_S = 0.02


class _Local:
    """A model as this worker holds it."""

    __slots__ = ("server", "entry", "inflight", "unloading")

    def __init__(self, server: ModelServer, entry: Entry):
        self.server = server
        self.entry = entry
        self.inflight = 0  # requests using it now: an unload waits for them
        self.unloading = False


class MultiModelServer:
    def __init__(self, settings: Settings, worker_index: int = 0, workers: int | None = None,
                 state_dir: str | None = None):
        self.settings = settings
        self.worker_index = worker_index
        self.workers = workers or settings.workers or 1
        self.state_dir = state_dir
        self.shared = SharedRegistry(os.path.join(state_dir or tempfile.mkdtemp(prefix="smserve-"), "models"))
        self.pools = capacity.pools(settings, self.workers)
        # Stateful sessions, each of one model: one table, and one bound, for the worker.
        self.sessions = SessionTable(settings, worker_index)
        self.room = Room(self.shared, settings.models_memory_mb)
        self.codec_pool = self.pools.codec
        self.models: dict[str, _Local] = {}
        self._load_lock = Semaphore()  # one load at a time, so each footprint is its own
        self._busy: set[tuple[str, str]] = set()  # (name, generation) being loaded or unloaded here
        self._failed: set[tuple[str, str]] = set()  # loads that failed in this process
        self._synced = False
        self._seen: int | None = None  # the shared folder's version at the last read
        self._prepared = Event()  # torch is in: loads may begin
        self.status = READY

    # ------------------------------------------------------------ worker lifecycle

    def start(self) -> None:
        if self.state_dir:
            readiness.clear(self.state_dir, self.worker_index)
        # A killed predecessor's models went with it: an unload must not wait for it.
        self.shared.forget_worker(self.worker_index)
        gevent.spawn(self._follow)

    @property
    def loading(self) -> bool:
        """A (re)started worker is loading the models already registered, or, at the
        first start, this worker or a sibling has not yet torch in and the registry followed."""
        return not self._synced or bool(readiness.starting(self.state_dir, self.workers))

    def defers_accepting(self) -> bool:
        """Always: at the first start no worker takes a connection until every worker is
        ready (a client that connects meanwhile waits, and its first /ping answer is 200,
        as from the PyTorch containers' model server, which listens only once started;
        AWS's toolkit's multi-model test asserts just that); later, a restarted worker
        not until it has loaded the registered models, while the others serve."""
        return True

    def check_ready(self) -> None:
        """A model that fails to load never fails /ping, nor any other model."""

    def check_all_ready(self) -> None:
        """/ping: 503 until the server can take a load, i.e. at the first start until every
        worker has imported torch, rehearsed a load and followed the registry once (with
        the GIL held through stretches of it: a 200 before it would be followed by slow
        or missed pings while SageMaker already counts them). No worker takes a
        connection before that (defers_accepting), so this is a guard more than an
        answer clients see. After that first full start the server is up: a restarted
        worker takes no connection until it has loaded the registered models (worker.py),
        so a worker that answers is always past its start."""
        if not self._prepared.is_set():
            raise Unavailable("the server is starting (torch and a rehearsal load, before the first model)")
        starting = readiness.starting(self.state_dir, self.workers)
        if starting:
            raise Unavailable(f"worker(s) {', '.join(map(str, starting))} of {self.workers} still starting")

    def _follow(self) -> None:
        # torch comes in before the first model, so that model's footprint is its own;
        # on a thread, so that the loop answers /ping (503 until this is done, in every
        # worker: check_all_ready) and gunicorn's heartbeat meanwhile.
        self.codec_pool.apply(rehearse)
        self._prepared.set()
        # What the start created stays out of the collector's passes, so each unload's
        # collection holds the loop only for what models made. (No collection first: it
        # would hold the loop as long.)
        gc.freeze()

        while True:
            try:
                self._sync()
            except Exception:  # noqa: BLE001 - the follower must outlive any one bad model
                log.exception("multi-model: following %s failed", self.shared.root)
            if not self._synced and not self._busy:
                self._synced = True
                if self.state_dir:
                    readiness.mark_ready(self.state_dir, self.worker_index, self.workers)
            gevent.sleep(FOLLOW_S)

    def _sync(self) -> None:
        # The folder is read again only when it changed: reading every model's file at
        # each look costs a worker CPU that grows with the number of models.
        version = self.shared.version()
        if version is not None and version == self._seen:
            return
        entries = self.shared.entries()
        wanted = {e.name: e for e in entries if e.state in (LOADING, READY)}
        for name, local in list(self.models.items()):
            entry = wanted.get(name)
            if (entry is None or entry.generation != local.entry.generation) and not local.unloading:
                self._start(self._unload_here, local)
        for entry in entries:
            tag = (entry.name, entry.generation)
            if entry.state == UNLOADING and tag in self._failed:
                # A load that failed here left its outcome: withdrawing it is taking that back.
                self._failed.discard(tag)
                self._let_go(entry)
            elif entry.state != UNLOADING and entry.name not in self.models and tag not in self._failed:
                self._start(self._load_here, entry)
        self._seen = version

    def _start(self, job, target) -> None:
        entry = target.entry if isinstance(target, _Local) else target
        tag = (entry.name, entry.generation)
        if tag in self._busy:
            return
        self._busy.add(tag)

        def run():
            try:
                job(target)
            finally:
                self._busy.discard(tag)

        gevent.spawn(run)

    def _load_here(self, entry: Entry) -> None:
        with self._load_lock:
            if not self._wanted(entry):
                return  # withdrawn while it waited for its turn
            # Held from here: an unload waits until this load has ended and let it go.
            self.shared.ack(entry, self.worker_index, {"loading": True})
            before = memory_now()
            server = ModelServer(self.settings, self.worker_index, self.workers, model_dir=entry.url, sessions=self.sessions,
                                 name=entry.name, pools=self.pools)
            started = time.monotonic()
            server.load()
            failed, error = server.status == FAILED, server.error
            if failed or not self._wanted(entry):
                self._discard(server)
                if failed and self._wanted(entry):
                    self._failed.add((entry.name, entry.generation))
                    self.shared.ack(entry, self.worker_index, {"ok": False, "error": error})
                else:  # withdrawn while it loaded: it never serves here
                    self._let_go(entry)
                return
            added = footprint(before)
            self.models[entry.name] = _Local(server, entry)
            log.info("multi-model: %r loaded from %s in %.2f s (%s)", entry.name, entry.url,
                     time.monotonic() - started, ", ".join(f"{k} {v / memory.MB:.1f} MB" for k, v in added.items()))
            self.shared.ack(entry, self.worker_index, {"ok": True, "footprint": added})

    def _wanted(self, entry: Entry) -> bool:
        current = self.shared.get(entry.name)
        return current is not None and current.generation == entry.generation and current.state != UNLOADING

    def _let_go(self, entry: Entry) -> None:
        """This worker holds the model no more; the last to let go of one being unloaded forgets it."""
        self.shared.unack(entry, self.worker_index)
        self.shared.release(entry)

    def _discard(self, server: ModelServer) -> None:
        generated = generated_code(server.model.model) if server.model is not None else set()
        server.close()
        clear_torch_caches(generated)
        # Collected on the loop (short: the start's objects are frozen, _follow); malloc_trim
        # walks the heap in C without the GIL, on a thread while the loop goes on.
        memory.collect()
        self.codec_pool.apply(memory.trim)

    def _unload_here(self, local: _Local) -> None:
        local.unloading = True
        while local.inflight:
            gevent.sleep(FOLLOW_S)  # requests already running on it finish first
        self.models.pop(local.entry.name, None)
        self.sessions.close_model(local.server)  # through its close_session, while it is loaded
        self._discard(local.server)
        local.server = None
        self._let_go(local.entry)
        log.info("multi-model: %r unloaded", local.entry.name)

    # ------------------------------------------------------------ the model API

    def load(self, name: str, url: str) -> None:
        """POST /models: returns once every worker has loaded and warmed the model."""
        check_name(name)
        if self.shared.get(name) is not None:  # 409 before the url is judged, as the toolkit's server answers
            return self._join(name, url)
        check_model_folder(url, self.settings.models_root, self.settings.program)
        warn_of_a_big_torchscript(name, url)
        self._prepared.wait()  # (a call in the worker's first seconds, while torch comes in)
        self.room.check_before()
        try:
            entry = self.shared.claim(name, url)
        except Conflict:
            return self._join(name, url)
        try:
            outcomes = self._wait(entry, lambda acks: sum("ok" in o for o in acks.values()) >= self.workers,
                                  self.settings.model_load_timeout, "SMSERVE_MODEL_LOAD_TIMEOUT")
            failed = [o["error"] for o in outcomes.values() if o.get("ok") is False]
            if failed:
                raise BadRequest(f"model {name!r} failed to load from {url}: {failed[0]}")
            self.room.check_after(name)
        except Conflict:
            raise  # an unload took it meanwhile, and finishes it
        except Unavailable:
            self._withdraw(entry, wait=False)  # each worker lets it go when its load ends
            raise
        except BaseException:
            self._withdraw(entry)
            raise
        if self.shared.set_state(entry, READY, only_from=(LOADING,)) is None:
            raise Conflict(f"model {name!r} was unloaded while it loaded")

    def _join(self, name: str, url: str) -> None:
        """A POST of a name that is taken: 409, unless the model is loading from the same
        folder (a retried call), when this one answers as that load does."""
        entry = self.shared.get(name)
        if entry is None or entry.state != LOADING or entry.url != url:
            state = "is being unloaded" if entry is not None and entry.state == UNLOADING else "is already loaded"
            raise Conflict(f"Model {name!r} {state}")

        def outcome(acks) -> bool:
            failed = [o["error"] for o in acks.values() if o.get("ok") is False]
            if failed:
                raise BadRequest(f"model {name!r} failed to load from {url}: {failed[0]}")
            return self.shared.get(name) == replace(entry, state=READY)

        self._wait(entry, outcome, self.settings.model_load_timeout, "SMSERVE_MODEL_LOAD_TIMEOUT")

    def unload(self, name: str) -> None:
        """DELETE /models/<name>: returns once no worker holds the model (one being
        unloaded already, by a DELETE that timed out or a racing one, is waited for again)."""
        entry = self.shared.get(name)
        if entry is None or not self._withdraw(entry):
            raise NotFound(f"Model {name!r} is not loaded")

    def describe(self, name: str) -> dict:
        entry = self.shared.get(name)
        if entry is None or entry.state != READY:
            raise NotFound(f"Model {name!r} is not loaded")
        return _description(entry)

    def list(self, limit: int, start: int = 0) -> dict:
        """GET /models: the same on every worker (it reads the shared folder), by name;
        `start`: the page's first model, a page's nextPageToken."""
        ready = sorted((e for e in self.shared.entries() if e.state == READY), key=lambda e: e.name)
        if start > len(ready):
            raise BadRequest(f"invalid next_page_token '{start}': there are {len(ready)} models")
        page = ready[start:start + limit]
        answer: dict = {"models": [_description(e) for e in page]}
        if start + limit < len(ready):
            answer["nextPageToken"] = str(start + limit)
        return answer

    @contextlib.contextmanager
    def using(self, name: str):
        """The model's server while a request uses it (an unload waits until it is done)."""
        local = self.model(name)
        local.inflight += 1
        try:
            yield local.server
        finally:
            local.inflight -= 1

    def model(self, name: str) -> _Local:
        """The model for a request (count it in with `inflight` while it runs); 404 when
        it is not loaded here, or an unload has begun."""
        local = self.models.get(name)
        if local is None or local.unloading:
            raise NotFound(f"Model {name!r} is not loaded")
        return local

    # ------------------------------------------------------------ helpers

    def _withdraw(self, entry: Entry, wait: bool = True) -> bool:
        """Unload this generation everywhere and, with wait, return once it is forgotten
        (503 past SAGEMAKER_MODEL_SERVER_TIMEOUT: the workers go on and the last one
        forgets it). False when it is no longer registered."""
        if self.shared.set_state(entry, UNLOADING, only_from=(LOADING, READY)) is None:
            current = self.shared.get(entry.name)
            if current is None or current.generation != entry.generation:
                return False
        deadline = time.monotonic() + self.settings.request_timeout
        while wait and not self.shared.release(entry):
            if time.monotonic() > deadline:
                raise Unavailable(f"model {entry.name!r}: {len(self.shared.acks(entry))} of {self.workers} workers still "
                                  f"hold it after {self.settings.request_timeout} s (SAGEMAKER_MODEL_SERVER_TIMEOUT); "
                                  "the unload goes on, and a DELETE again waits for it")
            gevent.sleep(FOLLOW_S)
        return True

    def _wait(self, entry: Entry, done, timeout: int, setting: str) -> dict[int, dict]:
        deadline = time.monotonic() + timeout
        while True:
            acks = self.shared.acks(entry)
            if done(acks):
                return acks
            current = self.shared.get(entry.name)
            if current is None or current.generation != entry.generation:
                raise Conflict(f"model {entry.name!r} was unloaded while it loaded")
            if time.monotonic() > deadline:
                raise Unavailable(f"model {entry.name!r}: {sum('ok' in o for o in acks.values())} of {self.workers} "
                                  f"workers loaded it within {timeout} s ({setting}); the load is given up")
            gevent.sleep(FOLLOW_S)


def _description(entry: Entry) -> dict:
    return {"modelName": entry.name, "modelUrl": entry.url}

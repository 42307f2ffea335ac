"""One worker's model server: loads the model off the event loop and runs requests.

No Flask here: the routes call these methods and turn their exceptions into responses.
"""

from __future__ import annotations

import gc
import logging
import os
from dataclasses import dataclass
from typing import Iterator

import gevent
import numpy as np
from gevent.threadpool import ThreadPool

from smserve import logs, metrics
from smserve.engine.batching import plan as batch_plan
from smserve.engine.worker import hardware
from smserve.engine.worker import readiness
from smserve.engine.hooks import toolkit
from smserve.engine.model.artifacts import ModelLoadError
from smserve.engine.hooks.chain import HookChain
from smserve.engine.hooks.script import hook_error
from smserve.engine.sessions.store import SessionTable
from smserve.errors import HTTPError, ServerError, Unavailable
from smserve.core.context import RequestContext
from smserve.core.metadata import METADATA_FILE, ModelMetadata
from smserve.engine.batching.runner import Runner
from smserve.settings import DEFAULT_PAYLOAD_MB, MAX_TRANSFORM_BUDGET_MB, Settings

log = logging.getLogger(__name__)

LOADING, READY, FAILED = "loading", "ready", "failed"
# Bodies (and outputs) from this size on are decoded (encoded) on a codec thread.
OFFLOAD_BYTES = 256 * 1024


@dataclass(frozen=True)
class Pools:
    """The threads a worker's models share (gevent's pools start a thread only when one
    is wanted): codec threads decode and encode big bodies, session threads run
    stream_fn sessions (one each), hook threads run the models' input_fn and output_fn."""

    codec: ThreadPool
    session: ThreadPool
    hooks: ThreadPool

    @classmethod
    def for_worker(cls, settings: Settings, workers: int) -> "Pools":
        # Hooks decode images and text per request: the worker's share of the cores, and
        # no more, since more hook threads than cores starve the event loops (and /ping).
        hooks = settings.hook_threads or max(1, hardware.cpu_count() // max(1, workers))
        # With hook processes, a hook thread only waits on one: as many as there are.
        hooks = max(hooks, settings.hook_processes)
        return cls(ThreadPool(settings.codec_threads), ThreadPool(settings.max_sessions + 4), ThreadPool(hooks))


class ModelServer:
    def __init__(self, settings: Settings, worker_index: int = 0, workers: int | None = None,
                 state_dir: str | None = None, model_dir: str | None = None, name: str | None = None,
                 pools: Pools | None = None, sessions: SessionTable | None = None):
        """model_dir, name, pools, sessions: one model of a multi-model endpoint
        (engine/multimodel/server.py), which is loaded from its own folder, named by SageMaker,
        and shares the worker's threads and its stateful sessions with the other models."""
        self.settings = settings
        self.model_dir = model_dir or settings.model_dir
        self.name = name
        self.worker_index = worker_index
        self.workers = workers or settings.workers or hardware.default_workers(settings)
        # Where workers leave a ready marker, so /ping on any worker can tell whether
        # all of them are ready (SageMaker sends traffic as soon as one ping is 200).
        self.state_dir = state_dir
        self.runner = Runner(max_delay_s=settings.max_batch_delay_ms / 1000.0)
        self.pools = pools or Pools.for_worker(settings, self.workers)
        self.codec_pool, self.session_pool = self.pools.codec, self.pools.session
        self.stream_sessions = 0
        # Stateful sessions (SageMaker's NEW_SESSION): the worker's, whatever its models.
        self.sessions = sessions if sessions is not None else SessionTable(settings, worker_index)
        self.hook_chain = HookChain(self)
        self.status = LOADING
        self.error: str | None = None
        self.model = None  # LoadedModel once ready
        self.hook_processes = None  # engine/hook_processes.HookProcesses, when SMSERVE_HOOK_PROCESSES asks

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Load in the background: /ping answers 503 meanwhile, and gunicorn's
        heartbeat keeps running however long a large model takes."""
        if self.state_dir:
            # A restarted worker must not inherit its predecessor's readiness.
            readiness.clear(self.state_dir, self.worker_index)
        gevent.spawn(self.load)

    @property
    def loading(self) -> bool:
        return self.status == LOADING

    def defers_accepting(self) -> bool:
        """After the first full start, a (re)started worker takes connections only once
        its model is loaded: the other workers serve meanwhile."""
        return readiness.fully_started(self.state_dir)

    def load(self) -> None:
        try:
            self.runner.call(self._load_on_inference_thread)
        except Exception as e:
            self.status, self.error = FAILED, f"{type(e).__name__}: {e}"
            # A ModelLoadError names its problem in full (a missing file, a pickle where
            # TorchScript belongs): its traceback would be the server's own frames.
            log.error("model failed to load from %s: %s", self.model_dir, self.error,
                      exc_info=None if isinstance(e, ModelLoadError) else e)
            if self.settings.exit_on_load_error and self.name is None:
                _stop_the_server(self.model_dir)
            return
        batching = batch_plan.plan(self.settings, self.model.metadata, self.model.hooks,
                                   declared=os.path.exists(os.path.join(self.model_dir, METADATA_FILE)))
        max_batch = batching.max_batch
        self.runner.trial = batch_plan.Trial() if batching.trial else None
        inline_s = self.settings.inline_pass_ms / 1000.0 if self.model.may_run_inline else 0.0
        self.runner.start(self.model.predict, max_batch, stage=self.model.stage,
                          name=self.name or self.model.metadata.name, inline_pass_s=inline_s)
        if self.name is None:
            # (Not for a multi-model load: a frozen model could never be freed by an unload.)
            _freeze_heap()
        self.status = READY
        if self.state_dir:
            try:
                readiness.mark_ready(self.state_dir, self.worker_index, self.workers)
            except OSError as e:
                log.warning("cannot leave a ready marker in %s (%s): /ping speaks for this worker only", self.state_dir, e)
                self.state_dir = None
        log.info("worker %d ready: model %r on %s, max batch %d",
                 self.worker_index, self.model.metadata.name, self.model.device, max_batch)
        if self.worker_index == 0:
            log.info("batching: %s", batching.note)

    def _load_on_inference_thread(self) -> None:
        import torch  # only workers import torch: the master must not touch CUDA

        from smserve.engine.worker import loaded_model as model_module

        device = model_module.choose_device(self.settings.device, self.worker_index)
        if device.type == "cuda":
            # This thread's current device is the worker's GPU: a model_fn's `.cuda()` and
            # `torch.cuda.current_device()` mean it (codec threads bind before each hook).
            torch.cuda.set_device(device)
        if device.type == "cpu":
            torch.set_num_threads(self.settings.torch_threads or max(1, hardware.cpu_count() // self.workers))
        self.model = model_module.load_and_warm(self.model_dir, device,
                                                self.settings.autocast, self.settings.compile_mode,
                                                script=toolkit.script_of(self.settings), single=self.name is None,
                                                max_batch=self.settings.max_batch_size)
        self.hook_processes = self._start_hook_processes()

    def _start_hook_processes(self):
        """SMSERVE_HOOK_PROCESSES: input_fn and output_fn in processes of their own
        (engine/hooks/processes.py), where the model has them and keeps no sessions."""
        wanted = self.settings.hook_processes
        hooks = self.model.hooks
        if not wanted or (hooks.input_fn is None and hooks.output_fn is None):
            return None
        if hooks.keeps_sessions:
            log.warning("SMSERVE_HOOK_PROCESSES=%d not used: this model keeps sessions, whose state its hooks read "
                        "in the worker; its input_fn and output_fn run on hook threads", wanted)
            return None
        from smserve.engine.hooks.processes import HookProcesses

        processes = HookProcesses(self.model_dir, wanted, self.settings.request_timeout, single=self.name is None)
        log.info("hook processes: %d run %s (SMSERVE_HOOK_PROCESSES; pids %s)", wanted,
                 " and ".join(n for n in ("input_fn", "output_fn") if getattr(hooks, n) is not None),
                 ", ".join(map(str, processes.pids)))
        return processes

    def close(self) -> None:
        """Unload (multi-model endpoints): the inference thread ends and the model goes
        with it; the caller gives the memory back (engine/memory.give_back)."""
        self.runner.stats.ready(False)
        if self.runner.stats.name is not None:
            metrics.forget_model(self.runner.stats.name)
        self.runner.stop()
        if self.hook_processes is not None:
            self.hook_processes.close()
            self.hook_processes = None
        self.status, self.error, self.model = FAILED, "unloaded", None

    def check_ready(self) -> None:
        if self.status == READY:
            return
        if self.status == FAILED:
            raise ServerError(f"model failed to load: {self.error}")
        raise Unavailable("model is loading")

    def check_all_ready(self) -> None:
        """/ping: at the first start, this worker and every other one have loaded their
        model; after it, this worker serves (a restarting one takes no connection)."""
        self.check_ready()
        if self.hook_processes is not None:
            self.hook_processes.check()  # (none could be started again: this worker cannot serve)
        loading = readiness.starting(self.state_dir, self.workers)
        if loading:
            raise Unavailable(f"model is loading in worker(s) {', '.join(map(str, loading))} of {self.workers}")

    @property
    def metadata(self) -> ModelMetadata:
        self.check_ready()
        return self.model.metadata

    # ------------------------------------------------------------ inference

    def infer(self, inputs: dict[str, np.ndarray], context=None) -> dict[str, np.ndarray]:
        """context: the request's, for a predict_fn that takes one (predict_context)."""
        self.check_ready()
        return self.runner.infer(inputs, context)

    @property
    def predict_context(self) -> bool:
        """A predict_fn that takes the request's context runs on this request alone:
        the model is not batched across requests. (A batched pass's predict_fn gets None.)"""
        return self.status == READY and self.model.hooks.predict_context and self.runner.max_batch_size <= 0

    @property
    def has_input_fn(self) -> bool:
        return self.status == READY and self.model.hooks.input_fn is not None

    @property
    def uses_byte_hooks(self) -> bool:
        return self.status == READY and self.model.hooks.handles_bytes

    @property
    def streams(self) -> bool:
        """predict_fn is known to answer with iterators (a generator function, or it has)."""
        return self.status == READY and self.model.hooks.streams

    @property
    def may_stream(self) -> bool:
        """predict_fn may answer with an iterator: only its result tells."""
        return self.status == READY and self.model.hooks.may_stream

    @property
    def model_lock(self):
        return self.runner.model_lock

    def open_stream_session(self) -> bool:
        """Count a new stream_fn session in, unless the worker holds its most."""
        if self.stream_sessions >= self.settings.max_sessions:
            return False
        self.stream_sessions += 1
        return True

    def close_stream_session(self) -> None:
        self.stream_sessions -= 1

    # ------------------------------------------------------------ stateful sessions

    def open_session(self, context):
        """The model's open_session(context): a new session's state, on the inference
        thread (it may put tensors on the device)."""
        hook = self.model.hooks.open_session
        self.for_hooks(context)

        def run():
            try:
                return hook(context)
            except Exception as e:  # noqa: BLE001 - answered, naming the hook
                raise hook_error("open_session", e, client_fault=False) from e

        return self.runner.call(run)

    def close_session(self, state, context, session_id: str, how: str) -> None:
        """The model's close_session(state, context), if it has one, on the inference
        thread; context.close_reason says why (closed, expired, unloaded, shutdown)."""
        hook = self.model.hooks.close_session if self.model is not None else None
        if hook is None:
            return
        context = context if context is not None else RequestContext({})  # (at expiry: no request)
        context.session, context.session_id, context.close_reason = state, session_id, how
        self.for_hooks(context)

        def run():
            try:
                hook(state, context)
            except Exception as e:  # noqa: BLE001
                raise hook_error("close_session", e, client_fault=False) from e

        self.runner.call(run)

    def close_sessions(self) -> None:
        """SIGTERM, after the requests in flight: every session closed through its hook."""
        self.sessions.close_all()

    def codec(self, size: int, fn, *args):
        """Run a decode or encode: inline when it is small (a thread hop costs more than
        the work), on a codec thread when its cost grows with a big body, so the event
        loop keeps answering /ping meanwhile."""
        if size < OFFLOAD_BYTES:
            return fn(*args)
        return on_thread(self.codec_pool, fn, args)

    def on_hook_thread(self, fn, *args):
        """fn on a hook thread, whatever its cost: a hook of the user's, whose cost is
        not known from the body's size."""
        return on_thread(self.pools.hooks, fn, args)

    def on_session_thread(self, fn, *args):
        """fn on a stream_fn session's thread, holding the model lock (shared with the
        inference thread) only while fn runs."""
        return on_thread(self.session_pool, fn, args, self.model_lock)

    def passes(self, inputs: dict[str, np.ndarray]) -> int:
        """How many forward passes a request takes (more than one past the max batch)."""
        return self.runner.passes(inputs)

    def infer_by_pass(self, inputs: dict[str, np.ndarray]):
        self.check_ready()
        return self.runner.infer_by_pass(inputs)

    def hook_input(self, message):
        """The model's input_fn's value for the message (on a hook thread), or
        NotImplemented when it hands the body back to the built-in codecs."""
        self.check_ready()
        return self.hook_chain.input(message)

    @property
    def system_properties(self) -> dict:
        """The hooks' context.system_properties (the toolkit's), made once per model."""
        made = getattr(self, "_system_properties", None)
        if made is None:
            made = self._system_properties = toolkit.system_properties(self.model_dir, self.model.device)
        return made

    def hook_context(self, message):
        """The message's context as the model's hooks get it (for_hooks)."""
        return self.for_hooks(message.context)

    def for_hooks(self, context):
        """context as every hook gets it (input_fn ... stream_fn, the session hooks):
        naming the model's device, with the toolkit's system_properties."""
        context.device = self.model.device
        context.system_properties = self.system_properties
        return context

    def infer_with_hooks(self, value, message, accept: str, encode, decoded: bool = False):
        """The SageMaker hook chain after input_fn (engine/hooks/chain.py): value is what
        input_fn returned, or the built-in codecs' named arrays (decoded); batched with
        other requests where it is a batch, then output_fn (or encode, the built-in
        encoder, when there is none). Returns (body, media type), or the iterator a
        predict_fn returned (to stream: what it returns decides)."""
        self.check_ready()
        return self.hook_chain.answer(value, message, accept, encode, decoded)

    def stream_items(self, iterator, stream_format) -> Iterator[bytes]:
        """Advance a model's iterator on the inference thread, one item per hop, so
        other requests interleave with a long stream; each item is encoded there too.
        Closing this generator (the client went away) closes the model's iterator, so
        the device is not left working for nobody."""
        iterator = iter(iterator)

        def step():
            try:
                item = next(iterator)
            except StopIteration:
                return None
            except HTTPError:
                raise
            except Exception as e:
                log.exception("predict_fn failed while streaming: %s: %s", type(e).__name__, e)
                raise ServerError(f"model failed: {type(e).__name__}: {e}") from e
            return stream_format.item(item)

        finished = False
        try:
            while True:
                chunk = self.runner.call(step)
                if chunk is None:
                    finished = True
                    return
                if chunk:
                    yield chunk
        finally:
            if not finished and hasattr(iterator, "close"):
                log.info("stream closed before its end: closing the model's generator")
                self.runner.call(iterator.close)

    def close_stream(self, iterator) -> None:
        """Close a model's iterator that will not be read, on the inference thread."""
        if hasattr(iterator, "close"):
            self.runner.call(iterator.close)

    # ------------------------------------------------------------ batch transform

    def execution_parameters(self) -> dict:
        """What this container sustains: a couple of requests per worker in flight
        (one computing, one arriving), within SageMaker's concurrency x payload <= 100 MB.
        A job's MaxPayloadInMB=0 (no limit) is reported as it is: the budget then bounds
        nothing, and the server takes bodies up to its own SMSERVE_MAX_REQUEST_MB."""
        payload = self.settings.max_payload_mb
        if payload is None:
            payload = DEFAULT_PAYLOAD_MB
        concurrency = self.settings.max_concurrent_transforms or 2 * self.workers
        if payload:
            concurrency = min(concurrency, MAX_TRANSFORM_BUDGET_MB // payload)
        concurrency = max(1, concurrency)
        return {
            "MaxConcurrentTransforms": concurrency,
            "BatchStrategy": self.settings.batch_strategy,
            "MaxPayloadInMB": payload,
        }


def _freeze_heap() -> None:
    """Keep what the start created (torch, the model, every module: about a million
    objects) out of the cyclic garbage collector's full passes. Such a pass, triggered
    by the many lists a big JSON body parses into, held the GIL, and /ping, for 0.3-0.4 s."""
    gc.collect()
    gc.freeze()


# gunicorn's arbiter halts, and exits with this status, when a worker exits with it.
WORKER_BOOT_ERROR = 3


def _stop_the_server(model_dir: str) -> None:
    """SMSERVE_EXIT_ON_LOAD_ERROR: the whole server stops, not just this worker (a
    restarted one would fail the same way, forever)."""
    log.critical("stopping: the model in %s cannot be served (SMSERVE_EXIT_ON_LOAD_ERROR, which `make serve` "
                 "sets; under SageMaker the container stays up and /ping answers 500)", model_dir)
    logs.flush_access_lines()  # os._exit runs no atexit hook: the lines of the pings it answered
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(WORKER_BOOT_ERROR)


def on_thread(pool, fn, args, lock=None):
    """fn(*args) on one of pool's threads (holding lock, if given, while it runs); the
    calling greenlet waits, the loop does not. fn's exception is raised here, in the
    caller: it travels back as a value, since the pool would print a traceback for what
    is often a client's 4xx."""
    ok, value = pool.apply(_captured, (fn, args, lock))
    if ok:
        return value
    raise value


def _captured(fn, args, lock):
    if lock is not None:
        lock.acquire()
    try:
        return True, fn(*args)
    except BaseException as e:  # noqa: BLE001 - re-raised on the event loop's side
        return False, e
    finally:
        if lock is not None:
            lock.release()

"""One worker's served model: loads the model off the event loop and runs requests.

No Flask here: the routes call these methods (engine/worker/served.ServedModel) and turn
their exceptions into responses. The threads it shares are engine/runtime/threads.py's, its
hooks' contexts engine/hooks/context.py's, its sessions' hooks engine/sessions/hooks.py's.
"""

from __future__ import annotations

import logging
import os
from typing import Iterator

import gevent
import numpy as np

from smserve import metrics
from smserve.engine.batching import plan as batch_plan
from smserve.engine.batching.runner import Runner
from smserve import toolkit
from smserve.engine.hooks.chain import HookChain
from smserve.engine.hooks.context import HookContexts
from smserve.engine.model.artifacts import ModelLoadError
from smserve.engine.runtime.threads import Pools, Slots
from smserve.engine.sessions.store import SessionTable
from smserve.engine.worker import capacity, hardware, lifecycle, readiness
from smserve.engine.worker.served import FAILED, LOADING, NO_TRAITS, READY, ModelTraits
from smserve.errors import HTTPError, ServerError, Unavailable
from smserve.core.metadata import METADATA_FILE, ModelMetadata
from smserve.settings import Settings

__all__ = ["ModelServer", "LOADING", "READY", "FAILED"]

log = logging.getLogger(__name__)


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
        self.model_lock = self.runner.model_lock
        self.pools = pools or capacity.pools(settings, self.workers)
        self.stream_sessions = Slots(settings.max_sessions)
        # Stateful sessions (SageMaker's NEW_SESSION): the worker's, whatever its models.
        self.sessions = sessions if sessions is not None else SessionTable(settings, worker_index)
        self.status = LOADING
        self.error: str | None = None
        self.traits = NO_TRAITS
        self.model = None  # LoadedModel once loaded
        self.hook_contexts: HookContexts | None = None  # once loaded
        self.hook_chain: HookChain | None = None  # once ready
        self.hook_processes = None  # engine/hooks/processes.HookProcesses, when SMSERVE_HOOK_PROCESSES asks

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
                lifecycle.stop_the_server(self.model_dir)
            return
        batching = batch_plan.plan(self.settings, self.model.metadata, self.model.hooks,
                                   declared=os.path.exists(os.path.join(self.model_dir, METADATA_FILE)))
        max_batch = batching.max_batch
        self.runner.trial = batch_plan.Trial() if batching.trial else None
        inline_s = self.settings.inline_pass_ms / 1000.0 if self.model.may_run_inline else 0.0
        predict = self.model.run if self.model.hooks.plain else self.model.predict
        self.runner.start(predict, max_batch, stage=self.model.stage,
                          name=self.name or self.model.metadata.name, inline_pass_s=inline_s)
        if self.name is None:
            # (Not for a multi-model load: a frozen model could never be freed by an unload.)
            lifecycle.freeze_heap()
        self.hook_chain = HookChain(self.model, self.runner, self.pools, self.hook_contexts, self.hook_processes)
        self.traits = ModelTraits(self.model.hooks, batched=self.runner.max_batch_size > 0)
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

        from smserve.engine.model import torch_model
        from smserve.engine.worker import loaded_model as model_module

        device = torch_model.choose_device(self.settings.device, self.worker_index)
        if device.type == "cuda":
            # This thread's current device is the worker's GPU: a model_fn's `.cuda()` and
            # `torch.cuda.current_device()` mean it (codec threads bind before each hook).
            torch.cuda.set_device(device)
        if device.type == "cpu":
            torch.set_num_threads(capacity.torch_threads(self.settings, self.workers))
        self.model = model_module.load_and_warm(self.model_dir, device,
                                                self.settings.autocast, self.settings.compile_mode,
                                                script=toolkit.script_of(self.settings), single=self.name is None,
                                                max_batch=self.settings.max_batch_size)
        self.hook_contexts = HookContexts(self.model_dir, self.model.device)
        self.hook_processes = lifecycle.start_hook_processes(self.settings, self.model.hooks, self.model_dir,
                                                             single=self.name is None)

    def close(self) -> None:
        """Unload (multi-model endpoints): the inference thread ends and the model goes
        with it; the caller gives the memory back (engine/runtime/memory.give_back)."""
        self.runner.stats.ready(False)
        if self.runner.stats.name is not None:
            metrics.forget_model(self.runner.stats.name)
        self.runner.stop()
        if self.hook_processes is not None:
            self.hook_processes.close()
            self.hook_processes = None
        self.status, self.error, self.model = FAILED, "unloaded", None
        self.traits, self.hook_chain = NO_TRAITS, None

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
        """context: the request's, for a predict_fn that takes one (traits.predict_context)."""
        self.check_ready()
        return self.runner.infer(inputs, context)

    def passes(self, inputs: dict[str, np.ndarray]) -> int:
        """How many forward passes a request takes (more than one past the max batch)."""
        return self.runner.passes(inputs)

    def infer_by_pass(self, inputs: dict[str, np.ndarray]):
        self.check_ready()
        return self.runner.infer_by_pass(inputs)

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


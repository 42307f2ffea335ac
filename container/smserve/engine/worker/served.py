"""What routes, protocols and streaming may ask of a worker's server: typed Protocols, so
that they name no concrete class (engine/worker/server.ModelServer is the one served
model; engine/multimodel/server.MultiModelServer serves many, each a ModelServer).
"""

from __future__ import annotations

from typing import Iterator, Protocol, runtime_checkable

import numpy as np

from smserve.core.metadata import ModelMetadata
from smserve.engine.batching.runner import Runner
from smserve.engine.hooks.chain import HookChain
from smserve.engine.hooks.context import HookContexts
from smserve.engine.runtime.threads import Pools, Slots
from smserve.engine.sessions.store import SessionTable
from smserve.settings import Settings

LOADING, READY, FAILED = "loading", "ready", "failed"


class ModelTraits:
    """What the loaded model's hooks do, as the protocols choose by them, all False
    without a ready model. Fixed at load, so plain values a request reads without a
    call; only whether a predict_fn streams is learnt later (from its first iterator),
    so `byte_hooks` asks the hooks, and only when `may_handle_bytes` says it could."""

    __slots__ = ("_hooks", "input_fn", "may_stream", "predict_context", "may_handle_bytes")

    def __init__(self, hooks=None, batched: bool = False):
        self._hooks = hooks  # engine/hooks/script.Hooks
        # input_fn reads request bodies.
        self.input_fn = hooks is not None and hooks.input_fn is not None
        # predict_fn may answer with an iterator: only its result tells.
        self.may_stream = hooks is not None and hooks.may_stream
        # A predict_fn that takes the request's context runs on this request alone: the
        # model is not batched across requests (max batch > 0). (A batched pass's
        # predict_fn gets None.)
        self.predict_context = hooks is not None and hooks.predict_context and not batched
        # input_fn or output_fn handle bytes, or a predict_fn that may stream could.
        self.may_handle_bytes = self.input_fn or self.may_stream or (hooks is not None and hooks.output_fn is not None)

    @property
    def byte_hooks(self) -> bool:
        """input_fn, output_fn or a streaming predict_fn handle bytes."""
        return self.may_handle_bytes and self._hooks.handles_bytes


NO_TRAITS = ModelTraits()


@runtime_checkable
class Serving(Protocol):
    """A worker's server, of one model or many: its lifecycle and readiness, and what
    the worker's models share (threads, stateful sessions)."""

    settings: Settings
    worker_index: int
    workers: int
    state_dir: str | None
    status: str
    pools: Pools
    sessions: SessionTable

    def start(self) -> None: ...

    @property
    def loading(self) -> bool: ...

    def defers_accepting(self) -> bool: ...

    def check_ready(self) -> None: ...

    def check_all_ready(self) -> None: ...


@runtime_checkable
class ServedModel(Serving, Protocol):
    """One model a worker serves: loaded, asked to infer, closed. Once ready, `model`
    is the loaded model, `hook_chain` runs a request through its hooks and
    `hook_contexts` fills in their contexts; `model_lock` is held while its code runs."""

    name: str | None
    error: str | None
    model: object  # engine/worker/loaded_model.LoadedModel once loaded, else None
    runner: Runner
    traits: ModelTraits
    hook_chain: HookChain | None
    hook_contexts: HookContexts | None
    stream_sessions: Slots
    model_lock: object

    def load(self) -> None: ...

    def close(self) -> None: ...

    @property
    def metadata(self) -> ModelMetadata: ...

    def infer(self, inputs: dict[str, np.ndarray], context=None) -> dict[str, np.ndarray]: ...

    def infer_by_pass(self, inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]: ...

    def passes(self, inputs: dict[str, np.ndarray]) -> int: ...

    def stream_items(self, iterator, stream_format) -> Iterator[bytes]: ...

    def close_stream(self, iterator) -> None: ...

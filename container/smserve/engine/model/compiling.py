"""torch.compile of a loaded model (SMSERVE_COMPILE), and the warm-up that pays for it.

compile: torch.compile of the loaded module (an exported program's module, or a
model_fn's nn.Module; TorchScript is left alone), before the warm-up, so the warm-up
pays the compile. If compiling fails, the worker logs a warning and serves the model
uncompiled: a model that serves beats a dead endpoint, and /ping turns 200 only once
the uncompiled model has warmed up in its place.

warm-up: a forward pass on zeros, so the first real request pays no compile or
allocation cost; skipped when the input shapes are not fully known, or when the user's
predict_fn decides what its data looks like.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from smserve.engine.model.torch_model import TorchModel

log = logging.getLogger(__name__)


def compile_model(model, mode: str, backend: str | None = None):
    """torch.compile(model) in mode, or None when the model is not one torch.compile
    takes (TorchScript, a model_fn's non-module object). Compiling happens lazily, at
    the first call (the warm-up). backend: the tests' way to make it fail on purpose."""
    if isinstance(model, torch.jit.ScriptModule):
        log.warning("SMSERVE_COMPILE=%s ignored: torch.compile does not take TorchScript models "
                    "(serve a torch.export model.pt2 to compile it)", mode)
        return None
    if not isinstance(model, torch.nn.Module):
        log.warning("SMSERVE_COMPILE=%s ignored: model_fn returned a %s, not a torch.nn.Module", mode, type(model).__name__)
        return None
    blocker = _compile_blocker()
    if blocker:
        log.warning("SMSERVE_COMPILE=%s ignored, serving the model uncompiled: %s", mode, blocker)
        return None
    if backend is not None:
        return torch.compile(model, backend=backend)
    return torch.compile(model, mode=None if mode == "default" else mode)


def compile_loaded(loaded: TorchModel, mode: str) -> None:
    """The loaded model compiled in mode ("off": left alone), on trial until its warm-up."""
    if mode == "off":
        return
    compiled = compile_model(loaded.model, mode)
    if compiled is not None:
        loaded.model, loaded.uncompiled, loaded.compiled = compiled, loaded.model, mode


def warm_up(loaded: TorchModel, max_batch: int | None = None, own_inputs: bool = True) -> bool:
    """The warm-up; False when it was skipped. own_inputs: the model's own forward
    reads the data (False: a predict_fn decides what its data looks like).

    A compiled model is warmed at batch 1 and 2 (dynamo compiles 1 on its own, then one
    graph for every batch size from 2; reduce-overhead still records a CUDA graph per
    new size as it comes) and at the max batch size (the peak memory is paid now). If
    that fails and the uncompiled model does not, the uncompiled one serves. max_batch:
    the served one (the settings'), else the metadata's."""
    batches = warm_up_inputs(loaded, max_batch) if own_inputs else None
    if batches is None:
        if loaded.uncompiled is not None:
            _tolerate_compile_errors()
            log.warning("SMSERVE_COMPILE: no warm-up (input shapes not fully known, or a predict_fn), so the "
                        "model compiles on its first requests; should that fail, torch logs it and runs it uncompiled")
            loaded.uncompiled = None
        return False
    if loaded.uncompiled is not None:
        try:
            _run(loaded, batches)
        except Exception as e:
            log.warning("SMSERVE_COMPILE=%s failed, serving the model uncompiled: %s: %s",
                        loaded.compiled, type(e).__name__, _first_lines(str(e)))
            log.debug("the compile failure in full", exc_info=True)
            loaded.model, loaded.compiled = loaded.uncompiled, "failed"
            loaded.uncompiled = None
            _run(loaded, batches[:1])
            return True
        # Later recompiles (a new shape) fall back to uncompiled frames, not 500s.
        _tolerate_compile_errors()
        loaded.uncompiled = None
        return True
    _run(loaded, batches)
    return True


def warm_up_inputs(loaded: TorchModel, max_batch: int | None = None) -> list[dict[str, np.ndarray]] | None:
    """Zeros for each batch size the warm-up runs, or None where a shape is not known."""
    metadata = loaded.metadata
    if not metadata.inputs:
        return None
    batched = metadata.max_batch_size > 0
    sizes = [1]
    if batched and loaded.compiled not in ("off", "failed"):
        top = max_batch or metadata.max_batch_size
        sizes = sorted({1, min(2, top), top})
    batches = []
    for size in sizes:
        inputs = {}
        for spec in metadata.inputs:
            shape = metadata.full_shape(spec)
            if shape is None:
                return None
            if batched:
                shape[0] = size
            if any(d < 0 for d in shape) or spec.datatype == "BYTES":
                return None
            inputs[spec.name] = np.zeros(shape, dtype=spec.dtype.dtype)
        batches.append(inputs)
    return batches


def _run(loaded: TorchModel, batches: list[dict[str, np.ndarray]]) -> None:
    for inputs in batches:
        loaded.run(inputs)
    if loaded.device.type == "cuda":
        torch.cuda.synchronize(loaded.device)


def _first_lines(text: str, lines: int = 3) -> str:
    """A compile error's message can hold a whole compiler log."""
    head = text.strip().splitlines()[:lines]
    return " / ".join(head) + (" ..." if len(text.strip().splitlines()) > lines else "")


def _tolerate_compile_errors() -> None:
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True


def _compile_blocker() -> str | None:
    """Why torch.compile would hang this worker, if it would.

    torch.compile starts compiler subprocesses on the calling thread, some with
    capture_output. Where gevent has patched os.close, such a call leaves gevent
    watchers in that (non-loop) thread, and a later subprocess's os.close is deferred
    to a loop that thread never runs: the worker waits forever on a pipe it still holds.
    """
    try:
        from gevent import monkey
    except ImportError:
        return None
    if monkey.is_object_patched("os", "close"):
        return ("this worker runs with gevent's os.close patch, under which torch.compile's compiler "
                "subprocesses deadlock on the inference thread (worker.py: monkey.patch_all(os=False) lifts it)")
    return None

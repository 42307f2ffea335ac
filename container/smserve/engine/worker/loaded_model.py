"""The worker's view of its loaded model: the torch model (engine/model/torch_model.py)
with the user's hooks around it, loaded from the model folder and warmed up.

Runs in the worker process after fork, on the worker's inference thread (and its hook
threads, bind_thread). A predict_fn of the user's replaces the model's own forward; under
SMSERVE_AUTOCAST it runs in torch.autocast too (it is where the forward pass is). A
streaming predict_fn's items and a stream_fn session run outside it (their code runs
later, item by item): they can enter torch.autocast themselves.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from smserve.errors import HTTPError, ServerError
from smserve.engine.model import compiling
from smserve.engine.batching import batchable
from smserve import toolkit
from smserve.engine.model.artifacts import ModelLoadError
from smserve.engine.model.torch_model import (AUTOCAST_DTYPES, TorchModel, converting, load_model_file,
                                              with_platform)
from smserve.engine.hooks.script import Hooks, load_hooks, missing_package_hint, run_load_hook
from smserve.core.metadata import ModelMetadata
from smserve.engine.runtime import main_lane
from smserve.engine.runtime.main_lane import yield_cpu_to_the_loop
from smserve.engine.model.staging import HostStaging

log = logging.getLogger(__name__)

# The device each hook thread was readied for (bind_thread).
_thread_device = threading.local()


@dataclass(kw_only=True)
class LoadedModel(TorchModel):
    hooks: Hooks

    @property
    def may_run_inline(self) -> bool:
        """Its forward passes may run on the event loop's thread (engine/runtime/main_lane.py)."""
        return main_lane.model_allows(cpu=self.device.type == "cpu" and self.staging is None,
                                   own_forward=self.hooks.predict_fn is None,
                                   compiled=self.compiled not in ("off", "failed"),
                                   torch_threads=torch.get_num_threads())

    def predict(self, inputs: dict[str, np.ndarray], context=None, form: batchable.Form | None = None):
        """Run the model (or the user's predict_fn) on named arrays; named arrays back,
        or the iterator a predict_fn answered with (to stream: the server decides).
        context: the request's, for a predict_fn that takes one (None in a batched pass).
        form: the inputs are the leaves of what the model's input_fn returned (or of
        the built-in decoding, for its hooks): rebuilt as it was, its tensors on this
        model's device, and the prediction comes back as predict_fn made it when an
        output_fn is to read it."""
        with converting("the model's input"):
            if form is None:
                data = self.to_model_input(inputs)
            else:
                data = form.rebuild({name: self._leaf(name, leaf, was_tensor)
                                     for (name, leaf), was_tensor in zip(inputs.items(), form.tensors)})
        return self.answer(self.predict_data(data, context), raw=form is not None)

    def predict_value(self, value, context=None):
        """Run the model (or predict_fn) on what input_fn returned when it is no batch
        (engine/batching/batchable.py): whole, its tensors moved to this model's device."""
        with converting("what input_fn returned"):
            data = self.on_device(value)
        return self.answer(self.predict_data(data, context), raw=True)

    def answer(self, prediction, raw: bool):
        """The prediction as the server goes on with it: an iterator to stream as it is,
        the model's own value for an output_fn (raw), else named numpy arrays."""
        if type(prediction) is torch.Tensor and self.staging is None and not (raw and self.hooks.output_fn is not None):
            # The usual answer, one plain tensor: no iterator, nothing staged to copy out.
            return self.outputs_to_numpy(prediction)
        if self.hooks.streamed(prediction) or (raw and self.hooks.output_fn is not None):
            return prediction
        return self.arrays_of(prediction)

    def predict_data(self, data, context=None):
        """The user's predict_fn on data, under autocast where asked, else the model's own forward."""
        if self.hooks.predict_fn is None:
            return self.forward(data)
        with self.precision():
            try:
                if self.hooks.predict_context:
                    return self.hooks.predict_fn(data, self.model, context)
                return self.hooks.predict_fn(data, self.model)
            except HTTPError:
                raise
            except Exception as e:
                # Named for the answer; logged by whoever answers (a batched pass
                # that fails is run again request by request first).
                name = self.hooks.named("predict_fn")
                raise (toolkit.error_status(e, name) or ServerError(
                    f"{name} failed: {type(e).__name__}: {e}{missing_package_hint(e)}")) from e

    def _leaf(self, name: str, leaf, was_tensor: bool):
        """One leaf of a hook's value for the pass: a tensor on this model's device,
        unless it was a numpy array and the user's predict_fn is to read it."""
        if isinstance(leaf, torch.Tensor):
            return self.on_device(leaf)
        if was_tensor or self.hooks.predict_fn is None:
            return self.tensor(name, leaf)
        if self.staging is not None and self.staging.holds(name, leaf):
            return leaf.copy()  # the buffer is rewritten by the next pass
        return leaf

    def input_form(self, inputs: dict[str, np.ndarray]) -> tuple[batchable.Form, dict[str, np.ndarray]]:
        """The built-in codecs' named arrays as the leaves of what to_model_input makes
        of them (one tensor, or a dict in the model's order), for the hooks' path."""
        names = self.in_model_order(inputs)
        container = batchable.ONE if len(names) == 1 else batchable.DICT
        return batchable.Form(container, names, (True,) * len(names)), {name: inputs[name] for name in names}

    def bind_thread(self) -> None:
        """Ready the calling thread (a hook thread) to run this model's hooks, once
        per thread:
        - below the event loop's CPU priority, as the inference thread is: a hook's
          work per request (decoding an image) must not take the core from /ping;
        - one intra-op thread for its torch work: hooks run per request, several
          requests' at once beside the inference thread's passes, and each calling
          thread would get an OpenMP pool of its own, sized like the model's, whose
          threads spin between calls;
        - this model's GPU as its current CUDA device (CUDA's current device is per
          thread), so that `.cuda()` and `torch.cuda.current_device()` in hooks mean
          the worker's GPU."""
        if getattr(_thread_device, "device", None) == self.device:
            return
        yield_cpu_to_the_loop()
        torch.set_num_threads(1)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        _thread_device.device = self.device

    def warm_up(self, max_batch: int | None = None) -> bool:
        """A forward pass on zeros (engine/model/compiling.py), unless the user's
        predict_fn decides what its data looks like. max_batch: the served one."""
        return compiling.warm_up(self, max_batch, own_inputs=self.hooks.predict_fn is None)


def load(model_dir: str, device: torch.device, autocast: str = "off", compile_mode: str = "off",
         script=None, single: bool = True) -> LoadedModel:
    """script: where the hooks are (engine/toolkit.Script); single: one model serves."""
    if not os.path.isdir(model_dir):
        raise ModelLoadError(f"model directory {model_dir} does not exist")
    hooks = load_hooks(model_dir, script, single)
    metadata = ModelMetadata.load(model_dir)
    if hooks.pre_model_fn is not None:
        run_load_hook(hooks, "pre_model_fn", model_dir, device)
    if hooks.model_fn is not None:
        # model_fn's model as it returns it: a predict_fn runs it as it likes.
        model, platform = run_load_hook(hooks, "model_fn", model_dir, device), "pytorch_custom"
    else:
        model, platform, metadata = load_model_file(model_dir, device, metadata, hooks.script)
    if hooks.model_warmup_fn is not None:
        run_load_hook(hooks, "model_warmup_fn", model_dir, device, model)
    if hooks.model_fn is not None and hooks.predict_fn is None and isinstance(model, torch.nn.Module):
        # As the toolkit's default predict_fn runs it: in eval mode (an exported
        # program's module has none to set), on the device.
        with contextlib.suppress(NotImplementedError):
            model.eval()
        model = model.to(device)
    loaded = LoadedModel(model=model, metadata=with_platform(metadata, platform), hooks=hooks, device=device,
                         staging=HostStaging(pin=True) if device.type == "cuda" else None,
                         autocast=AUTOCAST_DTYPES.get(autocast))
    if loaded.autocast is not None:
        loaded.check_autocast()
    compiling.compile_loaded(loaded, compile_mode)
    return loaded


def load_and_warm(model_dir: str, device: torch.device, autocast: str = "off", compile_mode: str = "off",
                  script=None, single: bool = True, max_batch: int | None = None) -> LoadedModel:
    """max_batch: the most records a pass takes (the settings'), which a compiled model is warmed at."""
    started = time.monotonic()
    loaded = load(model_dir, device, autocast, compile_mode, script, single)
    warmed = loaded.warm_up(max_batch)
    log.info(
        "model loaded from %s on %s in %.2fs (%s; autocast %s, compile %s%s)",
        model_dir,
        device,
        time.monotonic() - started,
        "warmed up" if warmed else "no warm-up: input shapes not fully known",
        autocast,
        loaded.compiled,
        loaded.memory_note(),
    )
    return loaded


"""Loading the model in a worker, and running it on named numpy arrays.

Runs in the worker process after fork, on the worker's inference thread: this module
(with staging.py, its pinned input buffers) is the only one that touches CUDA.

Two opt-in speed-ups (settings SMSERVE_AUTOCAST, SMSERVE_COMPILE):
- autocast: the forward pass, or the user's predict_fn (it is where the forward pass
  is), runs under torch.autocast in fp16 or bf16. Outputs declared FP32 come back as
  float32, so clients see the datatype the metadata promises. A streaming predict_fn's
  items and a stream_fn session run outside it (their code runs later, item by item):
  they can enter torch.autocast themselves.
- compile: torch.compile of the loaded module (an exported program's module, or a
  model_fn's nn.Module; TorchScript is left alone), before the warm-up, so the warm-up
  pays the compile. If compiling fails, the worker logs a warning and serves the model
  uncompiled: a model that serves beats a dead endpoint, and /ping turns 200 only once
  the uncompiled model has warmed up in its place.
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

from smserve.errors import BadRequest, HTTPError, ServerError
from smserve.engine.model import artifacts
from smserve.engine.batching import batchable
from smserve.engine.model import derived
from smserve.engine.hooks import toolkit
from smserve.engine.model.conversion import converting, to_numpy
from smserve.engine.model.artifacts import EXPORTED, TORCHSCRIPT, ModelLoadError
from smserve.engine.hooks.script import Hooks, load_hooks, missing_package_hint, run_load_hook
from smserve.core.metadata import ModelMetadata
from smserve.engine.runtime.priority import yield_cpu_to_the_loop
from smserve.engine.model.staging import HostStaging

log = logging.getLogger(__name__)

AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
_HALF = (np.dtype(np.float16),)
# torch.inference_mode() is a Python context around this C++ guard, ~1.5 us an entry
# where the guard alone takes ~0.6: the usual pass enters the guard itself.
_inference_mode = getattr(torch._C, "_InferenceMode", None) or torch.inference_mode
# The device each hook thread was readied for (bind_thread).
_thread_device = threading.local()


def choose_device(preference: str, worker_index: int) -> torch.device:
    """Worker i gets GPU i mod n, so workers spread over the GPUs."""
    if preference == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", worker_index % torch.cuda.device_count())
    if preference == "cuda":
        raise ModelLoadError("SMSERVE_DEVICE=cuda but torch sees no CUDA device")
    return torch.device("cpu")


@dataclass
class LoadedModel:
    model: object
    metadata: ModelMetadata
    hooks: Hooks
    device: torch.device
    # Pinned host buffers that inputs reach the GPU from; None on the CPU.
    staging: HostStaging | None = None
    # torch.float16 / torch.bfloat16 under SMSERVE_AUTOCAST, else None.
    autocast: torch.dtype | None = None
    # The module before torch.compile, while the compiled one is on trial; None when
    # nothing was compiled, or once the warm-up has run the compiled one.
    uncompiled: object = None
    # What SMSERVE_COMPILE achieved: "off", the mode, or "failed" (serving uncompiled).
    compiled: str = "off"

    @property
    def may_run_inline(self) -> bool:
        """Its forward passes may run on the event loop's thread (Runner._forward): a CPU
        model run by our own forward. Not a GPU one (the CUDA device and streams are the
        inference thread's), not a compiled one (a recompile would hold the loop for
        seconds), not a predict_fn of the user's (its code may rely on the thread that
        ran model_fn, as torch's grad mode does), and only with one torch thread (OpenMP
        keeps a pool of threads per calling thread: a second pool, spinning at the loop's
        priority, beside the inference thread's)."""
        return (self.device.type == "cpu" and self.staging is None and self.hooks.predict_fn is None
                and self.compiled in ("off", "failed") and torch.get_num_threads() == 1)

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
        outputs = self.outputs_to_numpy(prediction)
        if self.staging is not None:
            # An output that is a view of an input (an identity model on the CPU) must
            # not change under its request when the next pass reuses the buffer.
            outputs = {k: v.copy() if self.staging.holds_any(v) else v for k, v in outputs.items()}
        return outputs

    def stage(self, name: str, parts: list[np.ndarray]) -> np.ndarray:
        """The runner's concatenation of a batch: into the pinned buffer on a GPU."""
        if not isinstance(parts[0], np.ndarray):  # tensors an input_fn made (on the GPU, say)
            return parts[0] if len(parts) == 1 else torch.cat(parts)
        if self.staging is None or not self.staging.takes(parts):
            return parts[0] if len(parts) == 1 else np.concatenate(parts)
        return self.staging.stage(name, parts)

    def _leaf(self, name: str, leaf, was_tensor: bool):
        """One leaf of a hook's value for the pass: a tensor on this model's device,
        unless it was a numpy array and the user's predict_fn is to read it."""
        if isinstance(leaf, torch.Tensor):
            return self.on_device(leaf)
        if was_tensor or self.hooks.predict_fn is None:
            return self._tensor(name, leaf)
        if self.staging is not None and self.staging.holds(name, leaf):
            return leaf.copy()  # the buffer is rewritten by the next pass
        return leaf

    def on_device(self, value):
        """value with every tensor in it (itself, or inside a tuple, list or dict) on
        this model's device; anything else as it is."""
        if isinstance(value, torch.Tensor):
            return value if value.device == self.device else value.to(self.device, non_blocking=True)
        if isinstance(value, (tuple, list)):
            return type(value)(self.on_device(v) for v in value)
        if isinstance(value, dict):
            return {k: self.on_device(v) for k, v in value.items()}
        return value

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

    def predict_data(self, data, context=None):
        if self.autocast is None and self.hooks.predict_fn is None and type(data) is torch.Tensor:
            # The usual pass (one tensor, the model's own forward, no autocast), without
            # the checks and contexts the other kinds of data need.
            with _inference_mode(True):
                return self.model(data)
        with self.precision():
            if self.hooks.predict_fn is not None:
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
            # A dict's tensors are the model's inputs by name (in its order), a tuple's
            # by position; anything else is its one argument (a list of images too).
            if isinstance(data, dict):
                arguments = list(data.values())
            else:
                arguments = list(data) if isinstance(data, tuple) else [data]
            if not arguments or not all(isinstance(t, torch.Tensor) or _tensors_list(t) for t in arguments):
                raise BadRequest("this model takes numeric tensors; BYTES inputs, and an input_fn's other values, "
                                 "need a predict_fn in code/inference.py")
            with torch.inference_mode():
                return self.model(*arguments)

    def precision(self):
        """torch.autocast in SMSERVE_AUTOCAST's precision, or nothing."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast)

    def to_model_input(self, inputs: dict[str, np.ndarray]):
        """One tensor for a single-input model (what SageMaker's input_fn gives), else a dict."""
        tensors = {name: self._tensor(name, inputs[name]) for name in inputs}
        if len(tensors) == 1:
            return next(iter(tensors.values()))
        return {name: tensors[name] for name in self._in_model_order(tensors)}

    def _in_model_order(self, names) -> tuple[str, ...]:
        """Input names in the model's positional order (the metadata's), then any others
        as they came: a request's order is not the model's."""
        ordered = [spec.name for spec in self.metadata.inputs if spec.name in names]
        return tuple(ordered + [n for n in names if n not in ordered])

    def input_form(self, inputs: dict[str, np.ndarray]) -> tuple[batchable.Form, dict[str, np.ndarray]]:
        """The built-in codecs' named arrays as the leaves of what to_model_input makes
        of them (one tensor, or a dict in the model's order), for the hooks' path."""
        names = self._in_model_order(inputs)
        container = batchable.ONE if len(names) == 1 else batchable.DICT
        return batchable.Form(container, names, (True,) * len(names)), {name: inputs[name] for name in names}

    def _tensor(self, name: str, array: np.ndarray) -> torch.Tensor | np.ndarray:
        if array.dtype == object:
            return array  # BYTES has no tensor form: a predict_fn gets the numpy array of bytes
        if self.staging is not None and (self.staging.holds(name, array) or self.staging.takes([array])):
            # A batch the runner assembled is in the buffer already; a lone request's
            # array is copied in (it replaces the copy a read-only body needs anyway).
            if not self.staging.holds(name, array):
                array = self.staging.stage(name, [array])
            tensor = torch.from_numpy(array).to(self.device, non_blocking=True)
            self.staging.copied(name, self.device)
            return tensor
        flags = array.flags
        if not flags.writeable or not flags.aligned or (array.ndim and min(array.strides) < 0):
            # Views on the request body are read-only; torch wants memory it may write
            # (and warns of any other), and takes no reversed view.
            array = array.copy()
        if not array.dtype.isnative:  # torch takes the machine's byte order only
            array = array.astype(array.dtype.newbyteorder("="))
        tensor = torch.from_numpy(array)
        return tensor if self.device.type == "cpu" else tensor.to(self.device, non_blocking=True)

    def outputs_to_numpy(self, prediction) -> dict[str, np.ndarray]:
        with converting("the model's output"):
            return self._outputs_to_numpy(prediction)

    def _outputs_to_numpy(self, prediction) -> dict[str, np.ndarray]:
        names = [spec.name for spec in self.metadata.outputs]
        if isinstance(prediction, dict):
            return {str(k): self._declared(str(k), to_numpy(v)) for k, v in prediction.items()}
        if isinstance(prediction, (tuple, list)) and prediction and not _is_scalar_list(prediction):
            values = list(prediction)
        else:
            values = [prediction]
        out = {}
        for i, value in enumerate(values):
            name = names[i] if i < len(names) else f"output__{i}"
            out[name] = self._declared(name, to_numpy(value))
        return out

    def _declared(self, name: str, array: np.ndarray) -> np.ndarray:
        """float16 back to float32 where the metadata says FP32, or where autocast made
        it (a model's own half-precision outputs, declared or not, stay half)."""
        if array.dtype not in _HALF:
            return array
        spec = self.metadata.output(name)
        if (spec is not None and spec.datatype == "FP32") or (spec is None and self.autocast is not None):
            return array.astype(np.float32)
        return array

    def warm_up(self, max_batch: int | None = None) -> bool:
        """A forward pass on zeros, so the first real request pays no compile or
        allocation cost. Skipped when the input shapes are not fully known, or when the
        user's predict_fn decides what its data looks like.

        A compiled model is warmed at batch 1 and 2 (dynamo compiles 1 on its own, then
        one graph for every batch size from 2; reduce-overhead still records a CUDA
        graph per new size as it comes) and at the max batch size (the peak memory is
        paid now). If that fails and the uncompiled model does not, the uncompiled one
        serves. max_batch: the served one (the settings'), else the metadata's."""
        batches = self._warm_up_inputs(max_batch)
        if batches is None:
            if self.uncompiled is not None:
                _tolerate_compile_errors()
                log.warning("SMSERVE_COMPILE: no warm-up (input shapes not fully known, or a predict_fn), so the "
                            "model compiles on its first requests; should that fail, torch logs it and runs it uncompiled")
                self.uncompiled = None
            return False
        if self.uncompiled is not None:
            try:
                self._run_warm_up(batches)
            except Exception as e:
                log.warning("SMSERVE_COMPILE=%s failed, serving the model uncompiled: %s: %s",
                            self.compiled, type(e).__name__, _first_lines(str(e)))
                log.debug("the compile failure in full", exc_info=True)
                self.model, self.compiled = self.uncompiled, "failed"
                self.uncompiled = None
                self._run_warm_up(batches[:1])
                return True
            # Later recompiles (a new shape) fall back to uncompiled frames, not 500s.
            _tolerate_compile_errors()
            self.uncompiled = None
            return True
        self._run_warm_up(batches)
        return True

    def _warm_up_inputs(self, max_batch: int | None = None) -> list[dict[str, np.ndarray]] | None:
        if not self.metadata.inputs or self.hooks.predict_fn is not None:
            return None
        batched = self.metadata.max_batch_size > 0
        sizes = [1]
        if batched and self.compiled not in ("off", "failed"):
            top = max_batch or self.metadata.max_batch_size
            sizes = sorted({1, min(2, top), top})
        batches = []
        for size in sizes:
            inputs = {}
            for spec in self.metadata.inputs:
                shape = self.metadata.full_shape(spec)
                if shape is None:
                    return None
                if batched:
                    shape[0] = size
                if any(d < 0 for d in shape) or spec.datatype == "BYTES":
                    return None
                inputs[spec.name] = np.zeros(shape, dtype=spec.dtype.dtype)
            batches.append(inputs)
        return batches

    def _run_warm_up(self, batches: list[dict[str, np.ndarray]]) -> None:
        for inputs in batches:
            self.predict(inputs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def memory_note(self) -> str:
        """Peak GPU memory so far, for the log ("" on the CPU)."""
        if self.device.type != "cuda":
            return ""
        return f", peak GPU memory {torch.cuda.max_memory_allocated(self.device) / 2**20:.0f} MiB"


def _check_autocast(loaded: LoadedModel) -> None:
    """A precision the device cannot run is a load error now, not a 500 per request."""
    try:
        with loaded.precision():
            pass
    except RuntimeError as e:
        raise ModelLoadError(f"SMSERVE_AUTOCAST: {e}") from None
    if (loaded.device.type == "cuda" and loaded.autocast == torch.bfloat16
            and not torch.cuda.is_bf16_supported(including_emulation=False)):
        log.warning("SMSERVE_AUTOCAST=bf16: %s has no native bfloat16 (before Ampere); fp16 is the fast choice there",
                    torch.cuda.get_device_name(loaded.device))


def _first_lines(text: str, lines: int = 3) -> str:
    """A compile error's message can hold a whole compiler log."""
    head = text.strip().splitlines()[:lines]
    return " / ".join(head) + (" ..." if len(text.strip().splitlines()) > lines else "")


def _tolerate_compile_errors() -> None:
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True


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


def _tensors_list(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, torch.Tensor) for t in value)


def _is_scalar_list(value) -> bool:
    return all(isinstance(v, (int, float, bool)) for v in value)


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
        model = run_load_hook(hooks, "model_fn", model_dir, device)
        platform = "pytorch_custom"
    elif os.path.exists(os.path.join(model_dir, EXPORTED)):
        program = artifacts.load_exported(os.path.join(model_dir, EXPORTED))
        model = program.module().to(device)
        platform = "pytorch_torchexport"
        if metadata is None:
            metadata = derived.from_export(program)
            derived.log_derived(model_dir, EXPORTED, metadata)
    elif (lone := artifacts.torchscript_file(model_dir, hooks.script)) is not None:
        model = artifacts.load_torchscript(lone, map_location=device)
        platform = "pytorch_torchscript"
        if metadata is None:
            metadata = derived.from_torchscript(model)
            derived.log_derived(model_dir, os.path.basename(lone), metadata)
    else:
        raise ModelLoadError(
            f"{model_dir} holds neither {EXPORTED} (torch.export) nor {TORCHSCRIPT} (TorchScript) nor one other "
            f"*.pt/*.pth TorchScript file, and {hooks.script} defines no model_fn"
        )
    if hooks.model_warmup_fn is not None:
        run_load_hook(hooks, "model_warmup_fn", model_dir, device, model)
    if hooks.model_fn is not None and hooks.predict_fn is None and isinstance(model, torch.nn.Module):
        # As the toolkit's default predict_fn runs it: in eval mode (an exported
        # program's module has none to set), on the device.
        with contextlib.suppress(NotImplementedError):
            model.eval()
        model = model.to(device)
    if metadata is None:
        metadata = ModelMetadata(platform=platform)
    elif metadata.platform == ModelMetadata.platform:
        metadata = ModelMetadata(**{**metadata.__dict__, "platform": platform})
    loaded = LoadedModel(model=model, metadata=metadata, hooks=hooks, device=device,
                         staging=HostStaging(pin=True) if device.type == "cuda" else None,
                         autocast=AUTOCAST_DTYPES.get(autocast))
    if loaded.autocast is not None:
        _check_autocast(loaded)
    if compile_mode != "off":
        compiled = compile_model(model, compile_mode)
        if compiled is not None:
            loaded.model, loaded.uncompiled, loaded.compiled = compiled, model, compile_mode
    return loaded


def load_and_warm(model_dir: str, device: torch.device, autocast: str = "off", compile_mode: str = "off",
                  script=None, single: bool = True, max_batch: int | None = None) -> LoadedModel:
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


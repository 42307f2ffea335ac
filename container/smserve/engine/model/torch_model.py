"""The torch model on its device: its file loaded (load_model_file), named numpy arrays
made into its input tensors, its own forward pass (under autocast where asked), and its
outputs made into numpy arrays whatever tensor they are, a failure to convert a named
500, never an unhandled error.

Runs in the worker process after fork, on the worker's inference thread: this module
(with staging.py, its pinned input buffers) is where tensors reach the device.

autocast (SMSERVE_AUTOCAST): the forward pass runs under torch.autocast in fp16 or
bf16. Outputs declared FP32 come back as float32, so clients see the datatype the
metadata promises.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass

import numpy as np
import torch

from smserve.core.metadata import ModelMetadata
from smserve.engine.model import artifacts, derived
from smserve.engine.model.artifacts import EXPORTED, TORCHSCRIPT, ModelLoadError
from smserve.engine.model.staging import HostStaging
from smserve.errors import BadRequest, Named500

log = logging.getLogger(__name__)

AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
_HALF = (np.dtype(np.float16),)
# torch.inference_mode() is a Python context around this C++ guard, which the usual
# pass enters itself: the context costs more than the guard.
_inference_mode = getattr(torch._C, "_InferenceMode", None) or torch.inference_mode
# The tensor dtypes numpy holds as they are; any other (bfloat16, the float8 kinds)
# answers as float32.
NUMPY_DTYPES = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
                torch.uint32, torch.uint64, torch.float16, torch.float32, torch.float64, torch.complex64,
                torch.complex128}


def choose_device(preference: str, worker_index: int) -> torch.device:
    """Worker i gets GPU i mod n, so workers spread over the GPUs."""
    if preference == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", worker_index % torch.cuda.device_count())
    if preference == "cuda":
        raise ModelLoadError("SMSERVE_DEVICE=cuda but torch sees no CUDA device")
    return torch.device("cpu")


def load_model_file(model_dir: str, device: torch.device, metadata: ModelMetadata | None,
                    script: str) -> tuple[object, str, ModelMetadata | None]:
    """The model file model_dir holds, loaded onto device: (the model, its platform, the
    metadata, read off the model where the folder declares none). script: the hooks'
    script, which defines no model_fn (named in the errors)."""
    if os.path.exists(os.path.join(model_dir, EXPORTED)):
        program = artifacts.load_exported(os.path.join(model_dir, EXPORTED))
        model = program.module().to(device)
        if metadata is None:
            metadata = derived.from_export(program)
            derived.log_derived(model_dir, EXPORTED, metadata)
        return model, "pytorch_torchexport", metadata
    lone = artifacts.torchscript_file(model_dir, script)
    if lone is None:
        raise ModelLoadError(f"{model_dir} holds neither {EXPORTED} (torch.export) nor {TORCHSCRIPT} (TorchScript) nor "
                             f"one other *.pt/*.pth TorchScript file, and {script} defines no model_fn")
    model = artifacts.load_torchscript(lone, map_location=device)
    if metadata is None:
        metadata = derived.from_torchscript(model)
        derived.log_derived(model_dir, os.path.basename(lone), metadata)
    return model, "pytorch_torchscript", metadata


def with_platform(metadata: ModelMetadata | None, platform: str) -> ModelMetadata:
    """The metadata, its platform the loaded model's where it declares none."""
    if metadata is None:
        return ModelMetadata(platform=platform)
    if metadata.platform == ModelMetadata.platform:
        return ModelMetadata(**{**metadata.__dict__, "platform": platform})
    return metadata


@dataclass
class TorchModel:
    model: object
    metadata: ModelMetadata
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

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model's own forward pass on named arrays; named arrays back. The runner's
        pass for a model with no hooks around its forward (Hooks.plain)."""
        with converting("the model's input"):
            data = self.to_model_input(inputs)
        return self.arrays_of(self.forward(data))

    def arrays_of(self, prediction) -> dict[str, np.ndarray]:
        """A prediction as named numpy arrays, none of them a view of a staged input
        buffer: an output that is a view of an input (an identity model on the CPU) must
        not change under its request when the next pass reuses the buffer."""
        outputs = self.outputs_to_numpy(prediction)
        if self.staging is not None:
            outputs = {k: v.copy() if self.staging.holds_any(v) else v for k, v in outputs.items()}
        return outputs

    def forward(self, data):
        """The model's own forward pass on data: one tensor, or a dict (its tensors are
        the model's inputs by name, in its order) or tuple (by position) of them."""
        if self.autocast is None and type(data) is torch.Tensor:
            # The usual pass (one tensor, no autocast), without the checks and contexts
            # the other kinds of data need.
            with _inference_mode(True):
                return self.model(data)
        with self.precision():
            # Anything else is its one argument (a list of images too).
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

    def check_autocast(self) -> None:
        """A precision the device cannot run is a load error now, not a 500 per request."""
        try:
            with self.precision():
                pass
        except RuntimeError as e:
            raise ModelLoadError(f"SMSERVE_AUTOCAST: {e}") from None
        if (self.device.type == "cuda" and self.autocast == torch.bfloat16
                and not torch.cuda.is_bf16_supported(including_emulation=False)):
            log.warning("SMSERVE_AUTOCAST=bf16: %s has no native bfloat16 (before Ampere); fp16 is the fast choice "
                        "there", torch.cuda.get_device_name(self.device))

    def stage(self, name: str, parts: list[np.ndarray]) -> np.ndarray:
        """The runner's concatenation of a batch: into the pinned buffer on a GPU."""
        if not isinstance(parts[0], np.ndarray):  # tensors an input_fn made (on the GPU, say)
            return parts[0] if len(parts) == 1 else torch.cat(parts)
        if self.staging is None or not self.staging.takes(parts):
            return parts[0] if len(parts) == 1 else np.concatenate(parts)
        return self.staging.stage(name, parts)

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

    def to_model_input(self, inputs: dict[str, np.ndarray]):
        """One tensor for a single-input model (what SageMaker's input_fn gives), else a dict."""
        tensors = {name: self.tensor(name, inputs[name]) for name in inputs}
        if len(tensors) == 1:
            return next(iter(tensors.values()))
        return {name: tensors[name] for name in self.in_model_order(tensors)}

    def in_model_order(self, names) -> tuple[str, ...]:
        """Input names in the model's positional order (the metadata's), then any others
        as they came: a request's order is not the model's."""
        ordered = [spec.name for spec in self.metadata.inputs if spec.name in names]
        return tuple(ordered + [n for n in names if n not in ordered])

    def tensor(self, name: str, array: np.ndarray) -> torch.Tensor | np.ndarray:
        """An input array as a tensor on this model's device (BYTES stays an array)."""
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
        """A prediction (a tensor, a tuple or list of them, or a dict by name) as named
        arrays: the metadata's output names by position, else output__<i>."""
        with converting("the model's output"):
            if isinstance(prediction, dict):
                return {str(k): self._declared(str(k), to_numpy(v)) for k, v in prediction.items()}
            if isinstance(prediction, (tuple, list)) and prediction and not _is_scalar_list(prediction):
                values = list(prediction)
            else:
                values = [prediction]
            names = [spec.name for spec in self.metadata.outputs]
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

    def memory_note(self) -> str:
        """Peak GPU memory so far, for the log ("" on the CPU)."""
        if self.device.type != "cuda":
            return ""
        return f", peak GPU memory {torch.cuda.max_memory_allocated(self.device) / 2**20:.0f} MiB"


def to_numpy(value) -> np.ndarray:
    """An output as a numpy array, whatever tensor it is: dense, on the CPU, in a dtype
    numpy has (bfloat16 and the float8 kinds as float32: BF16 travels as the upper
    half of float32)."""
    if isinstance(value, torch.Tensor):
        if (value.is_cpu and value.layout is torch.strided and value.dtype in NUMPY_DTYPES and not (
                value.requires_grad or value.is_conj() or value.is_neg() or value.is_nested)):
            return value.numpy()  # a plain tensor (most outputs): a view, nothing to convert
        value = value.detach()
        if value.device.type == "meta":
            raise ValueError("it is a meta tensor, which holds no data")
        if value.is_nested:
            raise ValueError("it is a nested tensor, whose rows differ in shape: return a dense tensor, "
                             "or write the answer in an output_fn")
        if value.layout != torch.strided:
            value = value.to_dense()
        if value.is_quantized:
            value = value.dequantize()
        value = value.cpu().resolve_conj().resolve_neg()
        if value.dtype not in NUMPY_DTYPES:
            value = value.float()
        return value.numpy()
    array = np.asarray(value)
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))


def converting(what: str) -> Named500:
    """A value that cannot be made into what comes next (a tensor moved to the device,
    an output made into an array) is a 500 that says so, never an unhandled error."""
    return Named500(f"{what} cannot be used")


def _tensors_list(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, torch.Tensor) for t in value)


def _is_scalar_list(value) -> bool:
    return all(isinstance(v, (int, float, bool)) for v in value)

"""Loading the model in a worker, and running it on named numpy arrays.

Runs in the worker process after fork, on the worker's inference thread: this is the
only module that touches CUDA.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from . import datatypes
from .errors import BadRequest
from .hooks import Hooks, load_hooks
from .metadata import ModelMetadata, TensorSpec

log = logging.getLogger(__name__)

EXPORTED = "model.pt2"
TORCHSCRIPT = "model.pt"


class ModelLoadError(RuntimeError):
    pass


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

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model (or the user's predict_fn) on named arrays; named arrays back."""
        data = self.to_model_input(inputs)
        return self.outputs_to_numpy(self.predict_data(data))

    def predict_data(self, data):
        if self.hooks.predict_fn is not None:
            return self.hooks.predict_fn(data, self.model)
        if any(not isinstance(t, torch.Tensor) for t in (data.values() if isinstance(data, dict) else [data])):
            raise BadRequest("this model takes numeric tensors; BYTES inputs need a predict_fn in code/inference.py")
        with torch.inference_mode():
            if isinstance(data, dict):
                return self.model(*data.values())
            return self.model(data)

    def to_model_input(self, inputs: dict[str, np.ndarray]):
        """One tensor for a single-input model (what SageMaker's input_fn gives), else a dict."""
        tensors = {name: self._tensor(inputs[name]) for name in inputs}
        if len(tensors) == 1:
            return next(iter(tensors.values()))
        # Positional order is the model's, not the request's.
        ordered = [spec.name for spec in self.metadata.inputs if spec.name in tensors]
        return {name: tensors[name] for name in ordered + [n for n in tensors if n not in ordered]}

    def _tensor(self, array: np.ndarray) -> torch.Tensor | np.ndarray:
        if array.dtype == object:
            return array  # BYTES has no tensor form: a predict_fn gets the numpy array of bytes
        if not array.flags.writeable or not array.flags.aligned:
            # Views on the request body are read-only; torch wants memory it may write.
            array = array.copy()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.from_numpy(array).to(self.device, non_blocking=True)

    def outputs_to_numpy(self, prediction) -> dict[str, np.ndarray]:
        names = [spec.name for spec in self.metadata.outputs]
        if isinstance(prediction, dict):
            return {str(k): _to_numpy(v) for k, v in prediction.items()}
        if isinstance(prediction, (tuple, list)) and prediction and not _is_scalar_list(prediction):
            values = list(prediction)
        else:
            values = [prediction]
        out = {}
        for i, value in enumerate(values):
            name = names[i] if i < len(names) else f"output__{i}"
            out[name] = _to_numpy(value)
        return out

    def warm_up(self) -> bool:
        """One forward pass on zeros, so the first real request pays no compile or
        allocation cost. Skipped when the input shapes are not fully known, or when the
        user's predict_fn decides what its data looks like."""
        if not self.metadata.inputs or self.hooks.predict_fn is not None:
            return False
        inputs = {}
        for spec in self.metadata.inputs:
            shape = self.metadata.full_shape(spec)
            if self.metadata.max_batch_size > 0:
                shape[0] = 1
            if any(d < 0 for d in shape) or spec.datatype == "BYTES":
                return False
            inputs[spec.name] = np.zeros(shape, dtype=spec.dtype.dtype)
        self.predict(inputs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return True


def _is_scalar_list(value) -> bool:
    return all(isinstance(v, (int, float, bool)) for v in value)


def _to_numpy(value) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.dtype == torch.bfloat16:
            # numpy has no bfloat16; BF16 travels as the upper half of float32.
            value = value.float()
        return value.cpu().numpy()
    return np.asarray(value)


def load(model_dir: str, device: torch.device) -> LoadedModel:
    if not os.path.isdir(model_dir):
        raise ModelLoadError(f"model directory {model_dir} does not exist")
    hooks = load_hooks(model_dir)
    metadata = ModelMetadata.load(model_dir)
    if hooks.model_fn is not None:
        # As in SageMaker's toolkit, model_fn owns its model's device and mode.
        model = hooks.model_fn(model_dir)
        platform = "pytorch_custom"
    elif os.path.exists(os.path.join(model_dir, EXPORTED)):
        program = torch.export.load(os.path.join(model_dir, EXPORTED))
        model = program.module().to(device)
        platform = "pytorch_torchexport"
        if metadata is None:
            metadata = _metadata_from_export(program)
    elif os.path.exists(os.path.join(model_dir, TORCHSCRIPT)):
        model = torch.jit.load(os.path.join(model_dir, TORCHSCRIPT), map_location=device).eval()
        platform = "pytorch_torchscript"
        if metadata is None:
            metadata = _metadata_from_torchscript(model)
    else:
        raise ModelLoadError(
            f"{model_dir} holds neither {EXPORTED} (torch.export) nor {TORCHSCRIPT} (TorchScript), "
            "and code/inference.py defines no model_fn"
        )
    if metadata is None:
        metadata = ModelMetadata(platform=platform)
    elif metadata.platform == ModelMetadata.platform:
        metadata = ModelMetadata(**{**metadata.__dict__, "platform": platform})
    return LoadedModel(model=model, metadata=metadata, hooks=hooks, device=device)


def _metadata_from_export(program) -> ModelMetadata:
    """Names, datatypes and shapes from the exported graph; symbolic dims become -1."""
    user_inputs = set(program.graph_signature.user_inputs)
    inputs = []
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in user_inputs:
            value = node.meta.get("val")
            inputs.append(_spec_from_fake(node.name, value))
    outputs = []
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    for i, arg in enumerate(output_node.args[0] if isinstance(output_node.args[0], (list, tuple)) else [output_node.args[0]]):
        value = getattr(arg, "meta", {}).get("val")
        outputs.append(_spec_from_fake(f"output__{i}", value))
    batched = bool(inputs) and all(spec.shape[:1] == (-1,) for spec in inputs)
    if batched:
        # A leading dynamic dimension is the batch: batch requests together.
        inputs = [TensorSpec(s.name, s.datatype, s.shape[1:]) for s in inputs]
        outputs = [TensorSpec(s.name, s.datatype, s.shape[1:]) for s in outputs]
    return ModelMetadata(
        platform="pytorch_torchexport",
        max_batch_size=64 if batched else 0,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
    )


def _spec_from_fake(name: str, value) -> TensorSpec:
    if not isinstance(value, torch.Tensor):
        return TensorSpec(name, "FP32", (-1,))
    shape = tuple(d if isinstance(d, int) else -1 for d in value.shape)
    return TensorSpec(name, datatypes.TORCH_TO_V2.get(str(value.dtype), "FP32"), shape)


def _metadata_from_torchscript(model) -> ModelMetadata:
    """TorchScript keeps argument names, not shapes: inputs are named, shapes unknown."""
    try:
        arguments = model.forward.schema.arguments[1:]  # skip self
        names = [a.name for a in arguments]
    except (AttributeError, RuntimeError):
        names = ["input__0"]
    return ModelMetadata(
        platform="pytorch_torchscript",
        inputs=tuple(TensorSpec(n, "FP32", (-1,)) for n in names),
        outputs=(TensorSpec("output__0", "FP32", (-1,)),),
    )


def load_and_warm(model_dir: str, device: torch.device) -> LoadedModel:
    started = time.monotonic()
    loaded = load(model_dir, device)
    warmed = loaded.warm_up()
    log.info(
        "model loaded from %s on %s in %.2fs (%s)",
        model_dir,
        device,
        time.monotonic() - started,
        "warmed up" if warmed else "no warm-up: input shapes not fully known",
    )
    return loaded


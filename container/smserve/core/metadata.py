"""The model's metadata: its inputs, outputs, batching and labels.

Read from `metadata.json` in the model directory (format in README.md), or derived from
the model when that file is absent. Plain data: no torch, no Flask.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from smserve.core import datatypes

METADATA_FILE = "metadata.json"


class MetadataError(ValueError):
    """metadata.json is missing a field or has a wrong one."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    # Shape of one sample when the model batches (max_batch_size > 0), else the whole
    # tensor's shape. -1 marks a variable dimension. None: not known (a TorchScript
    # model without metadata.json, or a metadata.json that gives none): any rank and
    # size is taken, and the model's own error answers a wrong one.
    shape: tuple[int, ...] | None
    labels: tuple[str, ...] | None = None

    @property
    def dtype(self) -> datatypes.DataType:
        return datatypes.BY_NAME[self.datatype]


@dataclass(frozen=True)
class ModelMetadata:
    name: str = "model"
    version: str = "1"
    platform: str = "pytorch_torchscript"
    max_batch_size: int = 0
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = field(default_factory=tuple)

    def full_shape(self, spec: TensorSpec) -> list[int] | None:
        """The shape as clients see it: batching models get a leading -1. None when
        the shape is not known."""
        if spec.shape is None:
            return None
        return ([-1] if self.max_batch_size > 0 else []) + list(spec.shape)

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((t for t in self.outputs if t.name == name), None)

    def to_v2(self) -> dict:
        """The KServe v2 model metadata response."""
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": self.platform,
            "inputs": [self._tensor_v2(t) for t in self.inputs],
            "outputs": [self._tensor_v2(t) for t in self.outputs],
        }

    def _tensor_v2(self, spec: TensorSpec) -> dict:
        # KServe v2 metadata has no way to say "any rank": an unknown shape reads [-1].
        shape = self.full_shape(spec)
        return {"name": spec.name, "datatype": spec.datatype, "shape": [-1] if shape is None else shape}

    def describe(self) -> str:
        """One line on the inputs, outputs and batching, for the log."""
        def tensors(specs):
            return ", ".join(f"{t.name} ({t.datatype}, {_shape_text(self.full_shape(t))})" for t in specs) or "none"

        batching = (f"max_batch_size {self.max_batch_size} (dimension 0 is the batch)" if self.max_batch_size > 0
                    else "max_batch_size 0 (each request is one forward pass, as sent)")
        return f"inputs {tensors(self.inputs)}; outputs {tensors(self.outputs)}; {batching}"

    @classmethod
    def from_dict(cls, data: dict, **defaults) -> "ModelMetadata":
        if not isinstance(data, dict):
            raise MetadataError("metadata must be a JSON object")
        try:
            max_batch = int(data.get("max_batch_size", defaults.get("max_batch_size", 0)))
        except (TypeError, ValueError):
            raise MetadataError("max_batch_size must be an integer") from None
        if max_batch < 0:
            raise MetadataError("max_batch_size must be >= 0")
        return cls(
            name=str(data.get("name", defaults.get("name", "model"))),
            version=str(data.get("version", defaults.get("version", "1"))),
            platform=str(data.get("platform", defaults.get("platform", "pytorch_torchscript"))),
            max_batch_size=max_batch,
            inputs=tuple(_tensor(t, "inputs") for t in _list(data, "inputs")),
            outputs=tuple(_tensor(t, "outputs") for t in _list(data, "outputs")),
        )

    @classmethod
    def load(cls, model_dir: str, **defaults) -> "ModelMetadata | None":
        path = os.path.join(model_dir, METADATA_FILE)
        if not os.path.exists(path):
            return None
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except json.JSONDecodeError as e:
            raise MetadataError(f"{path}: not valid JSON: {e}") from None
        try:
            return cls.from_dict(data, **defaults)
        except MetadataError as e:
            raise MetadataError(f"{path}: {e}") from None


def _list(data: dict, key: str) -> list:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise MetadataError(f"'{key}' must be a list")
    return value


def _tensor(t: object, where: str) -> TensorSpec:
    if not isinstance(t, dict) or not isinstance(t.get("name"), str):
        raise MetadataError(f"each of '{where}' must be an object with a string 'name'")
    name = t["name"]
    datatype = t.get("datatype", "FP32")
    if datatype not in datatypes.BY_NAME:
        raise MetadataError(f"{where} '{name}': unknown datatype {datatype!r}; one of {', '.join(datatypes.BY_NAME)}")
    # No shape (or null) is an unknown one: nothing to check requests against.
    shape = t.get("shape")
    if shape is not None and (not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in shape)):
        raise MetadataError(f"{where} '{name}': shape must be a list of integers >= -1, or null (not known)")
    labels = t.get("labels")
    if labels is not None:
        if not isinstance(labels, list):
            raise MetadataError(f"{where} '{name}': labels must be a list of strings")
        labels = tuple(str(x) for x in labels)
    return TensorSpec(name=name, datatype=datatype, shape=None if shape is None else tuple(shape), labels=labels)


def _shape_text(shape: list[int] | None) -> str:
    return "any shape" if shape is None else str(shape)


"""What a model file says of its inputs and outputs when no metadata.json does: names,
datatypes and shapes from a torch.export program's graph; argument names and the
number of outputs from a TorchScript module (which keeps no shapes). The start log
says what was derived, and how to change it."""

from __future__ import annotations

import logging

import torch

from smserve.core import datatypes
from smserve.core.metadata import METADATA_FILE, ModelMetadata, TensorSpec

log = logging.getLogger(__name__)


def from_export(program) -> ModelMetadata:
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


def from_torchscript(model) -> ModelMetadata:
    """TorchScript keeps argument names, not shapes (a traced module forgets its
    example's once saved): inputs are named, their shapes unknown (None), so requests
    of any rank reach the model as sent. Its return type says how many outputs there
    are: a tuple of n is output__0 ... output__{n-1}.

    No dynamic batching (max_batch_size 0): nothing in the file says dimension 0 is a
    batch, and concatenating requests (or splitting a big one) along a dimension that
    is not would mix samples without an error. metadata.json turns it on."""
    try:
        arguments = model.forward.schema.arguments[1:]  # skip self
        names = [a.name for a in arguments]
    except (AttributeError, RuntimeError):
        names = ["input__0"]
    return ModelMetadata(
        platform="pytorch_torchscript",
        inputs=tuple(TensorSpec(n, "FP32", None) for n in names),
        outputs=tuple(TensorSpec(f"output__{i}", "FP32", None) for i in range(torchscript_output_count(model) or 1)),
    )


def torchscript_output_count(model) -> int | None:
    """How many outputs forward returns: 1 for a tensor, n for a tuple of n; None when
    its type cannot say (a list or a dict: counted or named only when it runs)."""
    try:
        returned = model.forward.schema.returns[0].type
    except (AttributeError, IndexError, RuntimeError):
        return None
    if isinstance(returned, torch.TupleType):
        return len(returned.elements())
    if isinstance(returned, (torch.ListType, torch.DictType)):
        return None
    return 1


def log_derived(model_dir: str, artifact: str, metadata: ModelMetadata) -> None:
    """Say what was derived without metadata.json, and how to change it."""
    unknown = any(spec.shape is None for spec in metadata.inputs)
    log.info(
        "no %s in %s: derived from %s: %s.%s To change it, write %s "
        "(`make new-model DIR=%s` writes what was derived here, each field explained): "
        "input shapes%s, max_batch_size > 0 to batch requests together along dimension 0, "
        "output names, class labels",
        METADATA_FILE, model_dir, artifact, metadata.describe(),
        " TorchScript records no shapes: requests of any shape reach the model as sent (a wrong "
        "one fails in the model, a 500), and nothing says dimension 0 is a batch, so requests "
        "are not batched together." if unknown else "",
        METADATA_FILE, model_dir, " (checked before the model runs, 400 otherwise)" if unknown else "",
    )

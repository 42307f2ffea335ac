"""A raw binary v2 request (header length 0): the body is the model's one input, its
shape deduced from the byte count (Triton's rules, PROTOCOL.md)."""

from __future__ import annotations

import math

import numpy as np

from smserve.codecs.v2.tensors import element_count, from_binary
from smserve.core.inference import InferenceRequest
from smserve.core.metadata import ModelMetadata, TensorSpec
from smserve.errors import BadRequest


def decode_raw(view: memoryview, metadata: ModelMetadata) -> InferenceRequest:
    """A raw binary request: the body is the model's one input (Triton's rules)."""
    model = metadata.name
    if len(metadata.inputs) != 1:
        raise BadRequest(
            f"Raw request must only have 1 input (found 1) to be deduced but got {len(metadata.inputs)} inputs "
            f"in '{model}' model configuration"
        )
    spec = metadata.inputs[0]
    dt = spec.dtype
    if spec.shape is None:
        raise BadRequest(
            f"The shape of the raw input '{spec.name}' can not be deduced because the model's shape is not known "
            "(declare it in metadata.json, or send a KServe v2 header that gives it)"
        )
    batch = [1] if metadata.max_batch_size > 0 else []
    if dt.is_bytes:
        # The body is one bare element; there is no length prefix to read.
        if tuple(spec.shape) != (1,):
            raise BadRequest(f"For BYTE datatype raw input '{spec.name}', the model must have input shape [1]")
        array = np.empty(1, dtype=object)
        array[0] = bytes(view)
        return _raw_request(spec, array.reshape(batch + [1]))
    dims = list(spec.shape)
    variable = [i for i, d in enumerate(dims) if d < 0]
    if len(variable) > 1:
        raise BadRequest(
            f"The shape of the raw input '{spec.name}' can not be deduced because there are more than one "
            "variable-sized dimension"
        )
    if variable:
        per_unit = math.prod(d for d in dims if d >= 0) * dt.size
        if per_unit == 0 or len(view) % per_unit:
            if not (per_unit == 0 and len(view) == 0):
                raise BadRequest(
                    f"input byte size mismatch for input '{spec.name}' for model '{model}'. "
                    f"Expected a multiple of {per_unit}, got {len(view)}"
                )
            dims[variable[0]] = 0
        else:
            dims[variable[0]] = len(view) // per_unit
    shape = batch + dims
    count = element_count(shape, dt, spec.name)
    return _raw_request(spec, from_binary(view, dt, shape, count, spec.name, model))


def _raw_request(spec: TensorSpec, array: np.ndarray) -> InferenceRequest:
    return InferenceRequest(
        inputs={spec.name: array},
        datatypes={spec.name: spec.datatype},
        outputs=None,
        binary_output=True,
        raw=True,
    )

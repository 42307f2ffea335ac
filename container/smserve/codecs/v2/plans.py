"""Binary v2 requests' JSON headers, kept once decoded as plans.

A client sends one JSON header again and again (the same inputs, shapes and outputs,
only the tensors' bytes differ), so a binary request's header, once decoded, is kept as
a plan: a look-up and a view per input instead of a walk of the JSON. Kept by the
header's bytes, for the model it was checked against; cleared when full. Only small
headers are planned (a JSON input's data makes a header big, and is never planned).
"""

from __future__ import annotations

from smserve import memo
from smserve.codecs.v2.tensors import from_binary
from smserve.core.inference import InferenceRequest
from smserve.core.metadata import ModelMetadata

PLANS_KEPT = 256
PLANNED_HEADER_BYTES = 4096
_plans: dict[bytes, "Plan"] = {}


def key_of(view: memoryview, length: int, header_length: int | None) -> bytes | None:
    """The header's bytes, by which its plan is kept; None where no plan is kept (a
    whole-JSON body, or a big header)."""
    return view[:length].tobytes() if header_length is not None and length <= PLANNED_HEADER_BYTES else None


def planned(key: bytes, metadata: ModelMetadata, view: memoryview, length: int) -> InferenceRequest | None:
    """The request its kept plan makes of this body; None without a plan for this
    header and model, or when the body does not fit it (the full decode says why)."""
    plan = _plans.get(key)
    if plan is None or plan.metadata is not metadata:
        return None
    return plan.request(view, length)


def keep(key: bytes, metadata: ModelMetadata, binary: list[tuple], length: int, request: InferenceRequest) -> None:
    """Keep the plan of a header whose inputs were all binary."""
    memo.keep(_plans, key, Plan(metadata, binary, length, request), PLANS_KEPT)


class Plan:
    """A decoded header whose inputs are all binary: what each request with it is made of."""

    __slots__ = ("metadata", "inputs", "size", "datatypes", "outputs", "binary_output", "id", "parameters")

    def __init__(self, metadata: ModelMetadata, inputs: list[tuple], header_length: int, request: InferenceRequest):
        self.metadata = metadata
        self.inputs = tuple(inputs)  # (name, datatype, shape, count, size), in the body's order
        self.size = header_length + sum(size for *_, size in inputs)  # the body's length
        # (Copies: the request this plan was made from is its caller's.)
        self.datatypes = dict(request.datatypes)
        self.outputs = None if request.outputs is None else list(request.outputs)
        self.binary_output = request.binary_output
        self.id = request.id
        self.parameters = dict(request.parameters)

    def request(self, view: memoryview, offset: int) -> InferenceRequest | None:
        """None when the body's length is not the header's (the full decode says why)."""
        if len(view) != self.size:
            return None
        arrays = {}
        for name, dt, shape, count, size in self.inputs:
            # (Per request: a BYTES tensor's elements, a BOOL tensor's bytes.)
            arrays[name] = from_binary(view[offset:offset + size], dt, shape, count, name, self.metadata.name)
            offset += size
        return InferenceRequest(inputs=arrays, datatypes=dict(self.datatypes),
                                outputs=None if self.outputs is None else list(self.outputs),
                                binary_output=self.binary_output, raw=False, id=self.id,
                                parameters=dict(self.parameters))

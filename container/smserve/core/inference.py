"""Protocol-neutral inference request and response: what the codecs produce and consume.

The runner sees only named numpy arrays; the codecs see only these objects and bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)  # (frozen: a kept v2 header's plan hands the same ones to each request)
class RequestedOutput:
    name: str
    # None: the request did not say; the protocol's default applies.
    binary: bool | None = None
    # > 0: return the top-k classes of this output instead of its values.
    classification: int = 0


@dataclass
class InferenceRequest:
    # Input name -> array, in the order the request listed them.
    inputs: dict[str, np.ndarray]
    # Input name -> v2 datatype as sent (BF16 arrives as float32 arrays).
    datatypes: dict[str, str] = field(default_factory=dict)
    # None: every model output, in the model's order.
    outputs: list[RequestedOutput] | None = None
    # `binary_data_output`: the encoding of outputs the request did not list.
    binary_output: bool = False
    # A raw binary request (header length 0): every output is binary.
    raw: bool = False
    id: str | None = None
    parameters: dict = field(default_factory=dict)


@dataclass
class OutputTensor:
    name: str
    datatype: str
    data: np.ndarray
    binary: bool = False


@dataclass
class InferenceResponse:
    model_name: str
    model_version: str
    outputs: list[OutputTensor]
    id: str | None = None
    parameters: dict = field(default_factory=dict)

"""The one table of tensor datatypes: KServe v2 name, numpy dtype, byte size.

Every codec, the metadata loader and the model runner read this table; nothing else
spells out a datatype's size or numpy equivalent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DataType:
    name: str  # the KServe v2 / Triton name, e.g. "FP32"
    dtype: np.dtype  # numpy dtype of the decoded array (little-endian where it matters)
    size: int  # bytes per element on the wire; 0 for BYTES (variable length)
    json_ok: bool = True  # may travel as JSON numbers/strings

    @property
    def is_bytes(self) -> bool:
        return self.name == "BYTES"


# BF16 has no numpy dtype: it is decoded to float32 (the upper 16 bits of each float32).
_TABLE = (
    DataType("BOOL", np.dtype(np.bool_), 1),
    DataType("UINT8", np.dtype("<u1"), 1),
    DataType("UINT16", np.dtype("<u2"), 2),
    DataType("UINT32", np.dtype("<u4"), 4),
    DataType("UINT64", np.dtype("<u8"), 8),
    DataType("INT8", np.dtype("<i1"), 1),
    DataType("INT16", np.dtype("<i2"), 2),
    DataType("INT32", np.dtype("<i4"), 4),
    DataType("INT64", np.dtype("<i8"), 8),
    DataType("FP16", np.dtype("<f2"), 2, json_ok=False),
    DataType("BF16", np.dtype("<f4"), 2, json_ok=False),
    DataType("FP32", np.dtype("<f4"), 4),
    DataType("FP64", np.dtype("<f8"), 8),
    DataType("BYTES", np.dtype(np.object_), 0),
)

BY_NAME: dict[str, DataType] = {t.name: t for t in _TABLE}

# numpy dtype -> v2 datatype, for outputs. float32 maps to FP32 (not BF16); bytes and
# str arrays map to BYTES.
_BY_KIND = {t.dtype.newbyteorder("=") if t.dtype.kind != "O" else t.dtype: t for t in _TABLE if t.name != "BF16"}


def by_name(name: str) -> DataType | None:
    return BY_NAME.get(name)


def from_numpy(dtype: np.dtype) -> DataType:
    """The v2 datatype an array of this dtype is sent as."""
    dtype = np.dtype(dtype)
    if dtype.kind in ("S", "U", "O"):
        return BY_NAME["BYTES"]
    found = _BY_KIND.get(dtype.newbyteorder("="))
    if found is None:
        raise TypeError(f"no KServe v2 datatype for numpy dtype {dtype}")
    return found


# torch dtype names -> v2 names, so model metadata can be derived from a torch model
# without this module importing torch.
TORCH_TO_V2 = {
    "torch.bool": "BOOL",
    "torch.uint8": "UINT8",
    "torch.uint16": "UINT16",
    "torch.uint32": "UINT32",
    "torch.uint64": "UINT64",
    "torch.int8": "INT8",
    "torch.int16": "INT16",
    "torch.int32": "INT32",
    "torch.int64": "INT64",
    "torch.float16": "FP16",
    "torch.bfloat16": "BF16",
    "torch.float32": "FP32",
    "torch.float64": "FP64",
}

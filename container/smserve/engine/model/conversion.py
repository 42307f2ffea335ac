"""What a model's torch values become for the server: numpy arrays for the encoders,
whatever the tensor (dense, on the CPU, in a dtype numpy has), and a failure to make
them a named 500, never an unhandled error."""

from __future__ import annotations

import numpy as np
import torch

from smserve.errors import Named500


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


# The tensor dtypes numpy holds as they are; any other (bfloat16, the float8 kinds)
# answers as float32.
NUMPY_DTYPES = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
                torch.uint32, torch.uint64, torch.float16, torch.float32, torch.float64, torch.complex64,
                torch.complex128}


def converting(what: str) -> Named500:
    """A value that cannot be made into what comes next (a tensor moved to the device,
    an output made into an array) is a 500 that says so, never an unhandled error."""
    return Named500(f"{what} cannot be used")

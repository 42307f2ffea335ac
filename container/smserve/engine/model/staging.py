"""Page-locked host buffers that a pass's inputs are assembled in, for a GPU model.

A copy to the GPU from ordinary (pageable) memory goes through the driver's bounce
buffer and holds the calling thread until it is done, whatever `non_blocking` says;
from page-locked ("pinned") memory it is one DMA the GPU runs by itself. So on a CUDA
device the runner's concatenation of a batch's requests writes straight into a pinned
buffer (one per input name, reused across passes, grown by doubling), and the model
copies from there with non_blocking=True: one host copy and one device copy per input
per pass. On the CPU nothing is staged (torch_model.TorchModel keeps no HostStaging).

A buffer is written again only once the GPU has finished reading it: each copy records
a CUDA event, and the next write waits on it (usually long done: the pass's outputs
came back to the host after it).
"""

from __future__ import annotations

import math

import numpy as np
import torch

MIN_BYTES = 64 * 1024
# Inputs larger than this take the pageable path: page-locked memory is RAM the kernel
# can never reclaim, and at this size the copy is bandwidth-bound either way.
MAX_BYTES = 64 * 1024 * 1024


class _Buffer:
    def __init__(self, nbytes: int, pin: bool):
        self.tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        self.host = self.tensor.numpy()
        self.event = None  # torch.cuda.Event of the last copy out of it

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()


class HostStaging:
    """pin=False keeps the same logic in ordinary memory: the tests run it on a CPU."""

    def __init__(self, pin: bool = True, max_bytes: int = MAX_BYTES):
        self.pin = pin
        self.max_bytes = max_bytes
        self._buffers: dict[str, _Buffer] = {}

    def capacity(self, name: str) -> int:
        buffer = self._buffers.get(name)
        return 0 if buffer is None else buffer.host.nbytes

    def takes(self, parts: list[np.ndarray]) -> bool:
        """Numeric arrays, together within max_bytes."""
        return parts[0].dtype != object and sum(p.nbytes for p in parts) <= self.max_bytes

    def stage(self, name: str, parts: list[np.ndarray]) -> np.ndarray:
        """The parts concatenated along dimension 0 (one part: copied), in name's buffer.

        The result is valid until the next stage() of the same name."""
        first = parts[0]
        # Native byte order: torch takes no other, and the copy converts for free.
        dtype = first.dtype.newbyteorder("=")
        if first.ndim == 0 or len(parts) == 1:
            shape = first.shape
        else:
            shape = (sum(p.shape[0] for p in parts),) + first.shape[1:]
        nbytes = math.prod(shape) * dtype.itemsize
        buffer = self._buffer(name, nbytes)
        buffer.wait()
        out = buffer.host[:nbytes].view(dtype).reshape(shape)
        if len(parts) == 1:
            np.copyto(out, first, casting="equiv")
        else:
            np.concatenate(parts, out=out, casting="equiv")
        return out

    def holds(self, name: str, array: np.ndarray) -> bool:
        """array lies in name's buffer (the runner staged it already)."""
        buffer = self._buffers.get(name)
        return buffer is not None and np.may_share_memory(array, buffer.host)

    def holds_any(self, array: np.ndarray) -> bool:
        return any(np.may_share_memory(array, b.host) for b in self._buffers.values())

    def copied(self, name: str, device: torch.device) -> None:
        """A non-blocking copy out of name's buffer was queued on device's current stream."""
        if device.type != "cuda":
            return
        buffer = self._buffers[name]
        if buffer.event is None:
            buffer.event = torch.cuda.Event()
        buffer.event.record(torch.cuda.current_stream(device))

    def _buffer(self, name: str, nbytes: int) -> _Buffer:
        buffer = self._buffers.get(name)
        if buffer is not None and buffer.host.nbytes >= nbytes:
            return buffer
        if buffer is not None:
            # torch does not know our copies read it: it must not reuse the block early.
            buffer.wait()
        # Powers of two: a few growths reach the largest batch, and pinning is slow.
        size = max(MIN_BYTES, 1 << max(nbytes - 1, 0).bit_length())
        buffer = self._buffers[name] = _Buffer(size, self.pin)
        return buffer

"""What crosses between a worker and its hook processes (engine/hooks/processes.py), and
the worker's end of their pipes.

Arrays and dense CPU tensors cross through shared memory: the writer makes a file in
/dev/shm that has no name (O_TMPFILE), reserves its pages (posix_fallocate: a full
/dev/shm is an error here, never a SIGBUS when the mapping is written) and writes them;
the reader opens it through /proc/<writer>/fd/<n> and maps it. No name is left in
/dev/shm on any path, a process killed included: the memory goes with the last
descriptor and mapping. The writer keeps its descriptors (`held`) until the
reader has mapped them: a hook process until the worker sends MAPPED, the worker
until the process answers. Anything else is pickled.

The worker waits on a process's pipe and on the process itself (a pidfd), each wait
bounded by the call's deadline: a process that dies is noticed at once, even where a
grandchild still holds its pipe ends; one that hangs is ended by the caller.
"""

from __future__ import annotations

import mmap
import os
import pickle
import select
import struct
import tempfile
import time

import numpy as np
from gevent import monkey

from smserve.engine.batching.batchable import is_tensor
from smserve.errors import ServerError

# Arrays this big or bigger cross through shared memory; smaller ones in the pickle.
SHARED_BYTES = 64 * 1024
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
LENGTH = struct.Struct("<Q")
_MIB = 1 << 20
# The hook threads are real threads: gevent's poll would wait on a hub of their own.
_poll = monkey.get_original("select", "poll")
# Where a pidfd is missing (Linux before 5.3), how often a wait looks at the process.
_NO_PIDFD_CHECK_S = 0.2


# The worker to a hook process, after mapping the files of its answer: let them go.
MAPPED = "mapped"


class SharedMemoryFull(ServerError):
    """Arrays that do not fit in what /dev/shm has free."""


class Deadline(Exception):
    """The process did not answer by the call's deadline."""


# ---------------------------------------------------------------- what crosses


class _Shared:
    """An array or a dense CPU tensor's bytes in an unlinked shared memory file, by its
    writer's descriptor."""

    __slots__ = ("pid", "fd", "dtype", "shape", "tensor")

    def __init__(self, pid: int, fd: int, dtype: str, shape: tuple, tensor: bool):
        self.pid, self.fd, self.dtype, self.shape, self.tensor = pid, fd, dtype, shape, tensor

    def __getstate__(self):
        return self.pid, self.fd, self.dtype, self.shape, self.tensor

    def __setstate__(self, state):
        self.pid, self.fd, self.dtype, self.shape, self.tensor = state


def shareable(value, held: list[int]):
    """value with its big arrays and dense CPU tensors (itself, or in a tuple, list or
    dict) written to shared memory, their descriptors appended to held (release() them
    once the reader has mapped them); anything else as it is, to be pickled. On an
    error, what it wrote is released."""
    mark = len(held)
    try:
        return _shareable(value, held)
    except BaseException:
        release(held[mark:])
        del held[mark:]
        raise


def _shareable(value, held: list[int]):
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "biufc" and value.nbytes >= SHARED_BYTES:
            return _write(np.ascontiguousarray(value), value.dtype.str, False, None, held)
        return value
    if is_tensor(value) and value.device.type not in ("cpu", "meta") and str(value.layout) == "torch.strided":
        value = value.detach().cpu()  # a hook process never touches the GPU: it gets CPU tensors
    if _is_dense_cpu_tensor(value):
        if value.nbytes < SHARED_BYTES:
            return value
        import torch

        raw = value.detach().contiguous().view(torch.uint8).numpy()  # any dtype's bytes, bfloat16's too
        return _write(raw, str(value.dtype).removeprefix("torch."), True, tuple(value.shape), held)
    if isinstance(value, (tuple, list)):
        return type(value)(_shareable(v, held) for v in value)
    if isinstance(value, dict):
        return {k: _shareable(v, held) for k, v in value.items()}
    return value


def restored(value):
    """shareable's value as it was: each shared array mapped (no copy)."""
    if isinstance(value, _Shared):
        return _read(value)
    if isinstance(value, (tuple, list)):
        return type(value)(restored(v) for v in value)
    if isinstance(value, dict):
        return {k: restored(v) for k, v in value.items()}
    return value


def shares(value) -> bool:
    """Whether value (as shareable made it) holds an array in shared memory."""
    if isinstance(value, _Shared):
        return True
    if isinstance(value, (tuple, list)):
        return any(shares(v) for v in value)
    if isinstance(value, dict):
        return any(shares(v) for v in value.values())
    return False


def release(held: list[int]) -> None:
    """Close a writer's descriptors (the memory goes once no mapping holds it)."""
    for fd in held:
        try:
            os.close(fd)
        except OSError:
            pass


def _is_dense_cpu_tensor(value) -> bool:
    return (is_tensor(value) and str(value.layout) == "torch.strided" and not value.is_nested
            and value.device.type == "cpu" and not value.is_quantized)


def _write(array: np.ndarray, dtype: str, tensor: bool, shape: tuple | None, held: list[int]) -> _Shared:
    fd = _nameless_file()
    try:
        size = max(array.nbytes, 1)
        try:
            os.posix_fallocate(fd, 0, size)  # its pages now, or ENOSPC: never a SIGBUS below
        except OSError as e:
            raise SharedMemoryFull(_full(size, e)) from None
        with mmap.mmap(fd, size) as target:
            np.frombuffer(target, np.uint8, array.nbytes)[:] = array.reshape(-1).view(np.uint8)
    except BaseException:
        os.close(fd)
        raise
    held.append(fd)
    return _Shared(os.getpid(), fd, dtype, tuple(array.shape) if shape is None else shape, tensor)


def _nameless_file() -> int:
    """A new file in SHM_DIR that has no name: the descriptor is the file."""
    try:
        return os.open(SHM_DIR, os.O_TMPFILE | os.O_RDWR, 0o600)
    except (AttributeError, OSError):  # (a kernel or file system without O_TMPFILE)
        fd, path = tempfile.mkstemp(prefix=f"smserve-hook-{os.getpid()}-", dir=SHM_DIR)
        os.unlink(path)
        return fd


def _full(size: int, error: OSError) -> str:
    try:
        stat = os.statvfs(SHM_DIR)
        room = f" ({stat.f_bavail * stat.f_frsize / _MIB:.1f} MiB free of {stat.f_blocks * stat.f_frsize / _MIB:.1f} MiB)"
    except OSError:
        room = ""
    return (f"an array of {size / _MIB:.1f} MiB does not fit in {SHM_DIR}{room}: give the container a bigger "
            f"{SHM_DIR} (docker run --shm-size; SageMaker sizes it by instance) [{os.strerror(error.errno)}]")


def _read(shared: _Shared):
    fd = os.open(f"/proc/{shared.pid}/fd/{shared.fd}", os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        memory = mmap.mmap(fd, size)  # the memory lives as long as the array
    finally:
        os.close(fd)
    if not shared.tensor:
        dtype = np.dtype(shared.dtype)
        return np.frombuffer(memory, dtype, int(np.prod(shared.shape, dtype=np.int64))).reshape(shared.shape)
    import torch

    dtype = getattr(torch, shared.dtype)
    elements = int(np.prod(shared.shape, dtype=np.int64))
    if elements == 0:
        return torch.empty(shared.shape, dtype=dtype)
    return torch.frombuffer(memory, dtype=dtype, count=elements).reshape(shared.shape)


# ---------------------------------------------------------------- the pipes


def send(pipe, message) -> None:
    """The process's side: a blocking write of one message."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(LENGTH.pack(len(data)) + data)
    pipe.flush()


def receive(pipe):
    """The process's side: a blocking read of one message (EOFError: the worker is gone)."""
    head = pipe.read(LENGTH.size)
    if len(head) < LENGTH.size:
        raise EOFError
    return pickle.loads(pipe.read(LENGTH.unpack(head)[0]))


class Channel:
    """The worker's end of one process's pipes (non-blocking), and its pidfd; every
    wait ends at the deadline (Deadline) or at the process's death (EOFError)."""

    def __init__(self, proc, requests_fd: int, answers_fd: int):
        self.proc, self.requests, self.answers = proc, requests_fd, answers_fd
        os.set_blocking(requests_fd, False)
        os.set_blocking(answers_fd, False)
        try:
            self.death = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            self.death = None
        self._writable = self._poller(requests_fd, select.POLLOUT)
        self._readable = self._poller(answers_fd, select.POLLIN)

    def _poller(self, fd: int, event: int):
        poller = _poll()
        poller.register(fd, event)
        if self.death is not None:
            poller.register(self.death, select.POLLIN)
        return poller

    def send(self, message, deadline: float) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(LENGTH.pack(len(data)) + data)
        while view:
            try:
                view = view[os.write(self.requests, view):]
            except BlockingIOError:  # the pipe is full: the process reads, dies or hangs
                self._wait(self._writable, self.requests, deadline)

    def receive(self, deadline: float):
        return pickle.loads(self._read(LENGTH.unpack(self._read(LENGTH.size, deadline))[0], deadline))

    def _read(self, size: int, deadline: float) -> bytearray:
        data = bytearray(size)
        view, got = memoryview(data), 0
        while got < size:
            try:
                n = os.readv(self.answers, [view[got:]])
            except BlockingIOError:  # nothing yet: the process works, dies or hangs
                self._wait(self._readable, self.answers, deadline)
                continue
            if n == 0:
                raise EOFError("its pipe closed")
            got += n
        return data

    def _wait(self, poller, fd: int, deadline: float) -> None:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Deadline
            wait = left if self.death is not None else min(left, _NO_PIDFD_CHECK_S)
            ready = dict(poller.poll(wait * 1000))
            if fd in ready:  # (its pipe first: an answer written before the process ended is read)
                return
            if self.death in ready or (self.death is None and self.proc.poll() is not None):
                raise EOFError("the process ended")

    def close(self) -> None:
        for fd in (self.requests, self.answers, self.death):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass


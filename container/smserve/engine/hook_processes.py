"""A model's input_fn and output_fn in processes of their own (SMSERVE_HOOK_PROCESSES=N).

Hook threads share the worker's GIL with its event loop: an input_fn that parses a
5 MB JSON array holds the GIL for ~90 ms at a time, and /ping waits behind it; many
cores feeding one GPU decode JPEG one GIL at a time. Opted into, each worker starts N
processes that import code/inference.py themselves and run input_fn and output_fn there,
each with its own interpreter and GIL. A hook thread hands a request to an idle one over
a pipe and waits on it with the GIL released.

What crosses, and how:
- a request: its body, content type, and its context's fields (headers, path, query,
  target model, session ID), pickled; the hook's custom attributes for the answer come
  back;
- arrays and dense CPU tensors, each way: through shared memory (a file in /dev/shm
  written once, mapped by the other side and unlinked at once), never pickled element by
  element; anything else (a list, a PIL image, a sparse tensor) is pickled.

What such hooks cannot do: touch the model or anything model_fn set up (they run in
another process, which never calls model_fn), and a stateful session's state (they see
`context.session` as None: a model that keeps sessions runs its hooks on threads, as
the start log says). Tensors they make are on the CPU; the server moves them to the
device. A process that dies (a crash in the hook's native code) fails the requests it
held with a 500, and another takes its place.

The processes are plain children of the worker, spoken to by raw pipes from real
threads: no gevent, no multiprocessing manager threads. They end when the worker
does (their pipe closes).
"""

from __future__ import annotations

import _queue
import logging
import mmap
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import traceback
from itertools import count

import numpy as np

from smserve import files
from smserve.engine.batchable import is_tensor
from smserve.errors import ServerError

log = logging.getLogger(__name__)

# Arrays this big or bigger cross through shared memory; smaller ones in the pickle.
SHARED_BYTES = 64 * 1024
_SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
_LENGTH = struct.Struct("<Q")
_names = count()


# ---------------------------------------------------------------- what crosses


class _Shared:
    """An array or a dense CPU tensor's bytes in a shared memory file, by name."""

    __slots__ = ("path", "dtype", "shape", "tensor")

    def __init__(self, path: str, dtype: str, shape: tuple, tensor: bool):
        self.path, self.dtype, self.shape, self.tensor = path, dtype, shape, tensor

    def __getstate__(self):
        return self.path, self.dtype, self.shape, self.tensor

    def __setstate__(self, state):
        self.path, self.dtype, self.shape, self.tensor = state


def shareable(value):
    """value with its big arrays and dense CPU tensors (itself, or in a tuple, list or
    dict) written to shared memory; anything else as it is, to be pickled."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "biufc" and value.nbytes >= SHARED_BYTES:
            return _write(np.ascontiguousarray(value), value.dtype.str, tensor=False)
        return value
    if is_tensor(value) and value.device.type not in ("cpu", "meta") and str(value.layout) == "torch.strided":
        value = value.detach().cpu()  # a hook process never touches the GPU: it gets CPU tensors
    if _is_dense_cpu_tensor(value):
        if value.nbytes < SHARED_BYTES:
            return value
        import torch

        raw = value.detach().contiguous().view(torch.uint8).numpy()  # any dtype's bytes, bfloat16's too
        return _write(raw, str(value.dtype).removeprefix("torch."), tensor=True, shape=tuple(value.shape))
    if isinstance(value, (tuple, list)):
        return type(value)(shareable(v) for v in value)
    if isinstance(value, dict):
        return {k: shareable(v) for k, v in value.items()}
    return value


def restored(value):
    """shareable's value as it was: each shared array mapped (no copy) and its file gone."""
    if isinstance(value, _Shared):
        return _read(value)
    if isinstance(value, (tuple, list)):
        return type(value)(restored(v) for v in value)
    if isinstance(value, dict):
        return {k: restored(v) for k, v in value.items()}
    return value


def _discard(value) -> None:
    """Remove the files of shareable's arrays in value that no one will read."""
    if isinstance(value, _Shared):
        files.remove(value.path)
    elif isinstance(value, (tuple, list)):
        for v in value:
            _discard(v)
    elif isinstance(value, dict):
        for v in value.values():
            _discard(v)


def _discard_written_by(pid: int) -> None:
    """Remove every array file process `pid` wrote (it has ended: none will be read)."""
    prefix = f"smserve-hook-{pid}-"
    try:
        with os.scandir(_SHM_DIR) as entries:
            for entry in entries:
                if entry.name.startswith(prefix):
                    files.remove(entry.path)
    except OSError:
        pass


def _is_dense_cpu_tensor(value) -> bool:
    return (is_tensor(value) and str(value.layout) == "torch.strided" and not value.is_nested
            and value.device.type == "cpu" and not value.is_quantized)


def _write(array: np.ndarray, dtype: str, tensor: bool, shape: tuple | None = None) -> _Shared:
    path = os.path.join(_SHM_DIR, f"smserve-hook-{os.getpid()}-{next(_names)}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        size = max(array.nbytes, 1)
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as target:
            np.frombuffer(target, np.uint8, array.nbytes)[:] = array.reshape(-1).view(np.uint8)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return _Shared(path, dtype, tuple(array.shape) if shape is None else shape, tensor)


def _read(shared: _Shared):
    fd = os.open(shared.path, os.O_RDWR)
    try:
        os.unlink(shared.path)  # mapped below: the memory lives as long as the array
        size = os.fstat(fd).st_size
        memory = mmap.mmap(fd, size)
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


def _send(pipe, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(_LENGTH.pack(len(data)) + data)
    pipe.flush()


def _receive(pipe):
    head = pipe.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError
    data = pipe.read(_LENGTH.unpack(head)[0])
    return pickle.loads(data)


# ---------------------------------------------------------------- the worker's side


class HookProcessDied(ServerError):
    """The process running a request's hook ended before it answered."""


class HookProcesses:
    """N processes running one model's input_fn and output_fn; call() from real
    threads only (the hook threads): it blocks its thread, never the loop."""

    def __init__(self, model_dir: str, processes: int, single: bool = True):
        """single: one model serves (its script may be in SAGEMAKER_SUBMIT_DIRECTORY)."""
        self.model_dir, self.single = model_dir, single
        self._idle = _queue.SimpleQueue()  # a C queue: a thread blocks in get() with the GIL released
        from gevent import monkey  # (here: the hook processes themselves import no gevent)

        self._lock = monkey.get_original("_thread", "allocate_lock")()  # real: hook threads take it, gevent's is unsafe there
        self._children: list[_Child] = []
        for _ in range(processes):
            child = _Child(model_dir, single)
            self._children.append(child)
        for child in self._children:
            child.wait_ready()
            self._idle.put(child)

    @property
    def pids(self) -> list[int]:
        return [child.proc.pid for child in self._children]

    def input_fn(self, body: bytes, content_type: str, context):
        return self._call("input_fn", (body, content_type), context)

    def output_fn(self, prediction, accept: str, context):
        return self._call("output_fn", (shareable(prediction), accept), context)

    def _call(self, hook: str, args: tuple, context):
        fields = _fields(context) if context is not None else None
        child = self._idle.get()
        try:
            ok, value, attributes = child.call((hook, args, fields))
        except (EOFError, OSError) as e:
            code = child.proc.wait(timeout=5) if child.proc.poll() is None else child.proc.returncode
            # What neither side will read now: the arrays sent to it, and any it wrote for
            # an answer it never sent (files in RAM, kept until unlinked).
            _discard(args)
            _discard_written_by(child.proc.pid)
            child = self._replace(child)
            raise HookProcessDied(f"{hook}'s process ended before answering (exit code {code}; a new one took its "
                                  f"place): {type(e).__name__}: {e}") from None
        except Exception as e:  # noqa: BLE001 - an answer that does not unpickle here (the pipe stays in step)
            _discard_written_by(child.proc.pid)  # (it waits for its next request: nothing of its is in flight)
            raise ServerError(f"{hook}'s answer could not be read from its process: {type(e).__name__}: {e}") from e
        finally:
            if child is not None:
                self._idle.put(child)
        if context is not None and attributes is not None:
            context.response_custom_attributes = attributes
        if ok:
            return restored(value)
        raise value

    def _replace(self, dead: "_Child") -> "_Child | None":
        dead.close()
        try:
            child = _Child(self.model_dir, self.single)
            child.wait_ready()
        except Exception as e:  # noqa: BLE001 - the pool goes on smaller; said once
            log.error("a hook process could not be started again: %s: %s", type(e).__name__, e)
            return None
        with self._lock:
            self._children = [c for c in self._children if c is not dead] + [child]
        return child

    def close(self) -> None:
        for child in self._children:
            child.close()


def _fields(context) -> dict:
    return {"headers": dict(context.headers.items()), "path": context.path, "query_string": context.query_string,
            "target_model": context.target_model, "session_id": context.session_id,
            "device": str(context.device) if context.device is not None else None,
            "system_properties": getattr(context, "system_properties", None)}


class _Child:
    def __init__(self, model_dir: str, single: bool):
        requests_r, requests_w = os.pipe()
        answers_r, answers_w = os.pipe()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen([sys.executable, "-m", "smserve.engine.hook_processes", model_dir,
                                      str(requests_r), str(answers_w), "single" if single else "one-of-many"],
                                     pass_fds=(requests_r, answers_w), env=env, stdin=subprocess.DEVNULL)
        os.close(requests_r)
        os.close(answers_w)
        self.requests = os.fdopen(requests_w, "wb")
        self.answers = os.fdopen(answers_r, "rb")

    def wait_ready(self) -> None:
        ok, error = _receive(self.answers)
        if not ok:
            raise RuntimeError(f"a hook process could not load code/: {error}")

    def call(self, message):
        _send(self.requests, message)
        return _receive(self.answers)

    def close(self) -> None:
        for pipe in (self.requests, self.answers):
            try:
                pipe.close()
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.terminate()


# ---------------------------------------------------------------- the process's side


def _serve(model_dir: str, requests_fd: int, answers_fd: int, single: bool) -> None:
    import signal

    # The worker ends it by closing its pipe, after the requests in flight: a SIGTERM to
    # the process group at shutdown must not cut one off.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    requests = os.fdopen(requests_fd, "rb")
    answers = os.fdopen(answers_fd, "wb")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s")
    try:
        import torch

        torch.set_num_threads(1)  # a request's hook, per process: the cores are the processes'
        from smserve.core.context import RequestContext
        from smserve.engine import toolkit
        from smserve.engine.hooks import load_hooks
        from smserve.settings import Settings

        # The script the worker's settings name (SAGEMAKER_PROGRAM): the same environment.
        hooks = load_hooks(model_dir, toolkit.script_of(Settings.from_env()), single)
    except BaseException as e:  # noqa: BLE001 - said to the worker, which refuses to start
        _send(answers, (False, f"{type(e).__name__}: {e}"))
        return
    _send(answers, (True, None))
    while True:
        try:
            hook, args, fields = _receive(requests)
        except EOFError:
            return
        context = None
        if fields is not None:
            context = RequestContext({k.upper(): v for k, v in fields["headers"].items()}, fields["path"],
                                     fields["query_string"], fields["target_model"])
            context.session_id = fields["session_id"]
            context.device = torch.device(fields["device"]) if fields["device"] else None
            if fields["system_properties"] is not None:
                context.system_properties = fields["system_properties"]
        try:
            function = getattr(hooks, hook)
            if hook == "output_fn":
                args = (restored(args[0]), args[1])
            value = function(*args, context) if context is not None else function(*args)
            answer = (True, shareable(value), None)
        except BaseException as e:  # noqa: BLE001 - the worker names the hook and answers
            answer = (False, _portable(e), None)
        if context is not None:
            answer = (*answer[:2], context.response_custom_attributes)
        try:
            _send(answers, answer)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            _send(answers, (False, TypeError(f"{hook} returned a value that cannot leave its process: "
                                             f"{type(e).__name__}: {e}"), None))


def _portable(error: BaseException) -> BaseException:
    """The hook's exception as the worker can receive it: itself where it pickles (the
    worker tells a client's fault from the hook's by its type), with the traceback
    from this process as a note; else a RuntimeError that says what it was."""
    note = "".join(traceback.format_exception(error)).rstrip()
    try:
        portable = pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001
        portable = RuntimeError(f"{type(error).__name__}: {error}")
    portable.add_note(f"in its hook process:\n{note}")
    return portable


if __name__ == "__main__":
    # Through the module by its name, not __main__: what it pickles (_Shared) must be
    # found by that name in the worker.
    from smserve.engine import hook_processes

    hook_processes._serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "single")

"""A model's input_fn and output_fn in processes of their own (SMSERVE_HOOK_PROCESSES=N).

Hook threads share the worker's GIL with its event loop: an input_fn that parses a
big JSON array holds the GIL for its whole parse, and /ping waits behind it; many
cores feeding one GPU decode JPEG one GIL at a time. Opted into, each worker starts N
processes that import code/inference.py themselves and run input_fn and output_fn there,
each with its own interpreter and GIL. A hook thread hands a request to an idle one over
a pipe and waits on it with the GIL released.

What crosses, and how (engine/hooks/transport.py):
- a request: its body, content type, and its context's fields (headers, path, query,
  target model, session ID), pickled; the hook's custom attributes come back with it;
- arrays and dense CPU tensors, each way: through shared memory (unlinked /dev/shm
  files, reserved before they are written: a full /dev/shm is a 500 that says so),
  never pickled element by element; anything else (a list, a PIL image, a sparse
  tensor) is pickled.

What such hooks cannot do: touch the model or anything model_fn set up (they run in
another process, which never calls model_fn), and a stateful session's state (they see
`context.session` as None: a model that keeps sessions runs its hooks on threads, as
the start log says). Tensors they make are on the CPU; the server moves them to the
device.

Faults: a process that dies (a crash in the hook's native code) fails the request it
held with a 500 at once (the worker watches the process, not only its pipe, which a
grandchild may hold), and another takes its place; one that does not answer by the
request's deadline (SAGEMAKER_MODEL_SERVER_TIMEOUT) is killed and replaced; a worker
none of whose processes could be started again answers 503, /ping included. The
processes are plain children of the worker, spoken to by raw pipes from real threads
(no gevent, no multiprocessing manager threads), and are killed when the worker ends,
however it ends (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import _queue
import logging
import os
import pickle
import signal
import subprocess
import sys
import time
import traceback
import weakref

from gevent import monkey

from smserve.engine.hooks.script import import_path
from smserve.engine.hooks.transport import MAPPED, Channel, Deadline, SharedMemoryFull, receive, release, restored, \
    send, shareable, shares
from smserve.errors import ServerError, Unavailable
from smserve.settings import child_environment

log = logging.getLogger(__name__)

# A process that has not imported code/ in this long never will.
START_S = 300
_RealLock = monkey.get_original("threading", "Lock")  # taken by real threads (the hook threads)
_start_thread = monkey.get_original("_thread", "start_new_thread")
_pools = weakref.WeakSet()  # every pool of this process's, for end_all


class HookProcessDied(ServerError):
    """The process running a request's hook ended before it answered."""


def end_all() -> None:
    """The worker's exit: every hook process of its ends now, a hung one included."""
    for pool in list(_pools):
        pool.close()


# ---------------------------------------------------------------- the worker's side


class HookProcesses:
    """N processes running one model's input_fn and output_fn; call() from real
    threads only (the hook threads): it blocks its thread, never the loop.
    timeout_s: the request deadline, past which a call's process is ended."""

    def __init__(self, model_dir: str, processes: int, timeout_s: float, single: bool = True):
        """single: one model serves (its script may be in SAGEMAKER_SUBMIT_DIRECTORY)."""
        self.model_dir, self.single, self.timeout_s = model_dir, single, timeout_s
        self._idle = _queue.SimpleQueue()  # a C queue: a thread blocks in get() with the GIL released
        self._lock = _RealLock()
        self._to_start = _queue.SimpleQueue()  # the pids of ended processes, to replace
        self._closed = False
        self._starting = 0  # processes being started in place of ended ones
        self._children: list[_Child] = []
        try:
            for _ in range(processes):
                self._children.append(_Child(model_dir, single))
            for child in self._children:
                child.wait_ready()
        except BaseException:
            self.close()
            raise
        for child in self._children:
            self._idle.put(child)
        _start_thread(self._starter, ())
        _pools.add(self)

    @property
    def pids(self) -> list[int]:
        return [child.proc.pid for child in self._children]

    def check(self) -> None:
        """Unavailable where no process is left to run a hook (none could be started again)."""
        if not self._children and not self._starting:
            raise Unavailable("no hook process runs in this worker (SMSERVE_HOOK_PROCESSES): none could be started "
                              "again after one ended (the log says why)")

    def input_fn(self, body: bytes, content_type: str, context):
        return self._call("input_fn", (body, content_type), context, [])

    def output_fn(self, prediction, accept: str, context):
        held: list[int] = []
        try:
            prediction = shareable(prediction, held)
        except SharedMemoryFull as e:
            raise SharedMemoryFull(f"output_fn's prediction cannot reach its hook process: {e}") from None
        return self._call("output_fn", (prediction, accept), context, held)

    def _call(self, hook: str, args: tuple, context, held: list[int]):
        deadline = time.monotonic() + self.timeout_s
        try:
            fields = _fields(context) if context is not None else None
            child = self._free(deadline)
            try:
                ok, value, attributes = child.call((hook, args, fields), deadline)
                if shares(value):
                    value = restored(value)  # mapped while the process still holds its files
                    _say_mapped(child, deadline)
            except Deadline:
                log.error("%s's process (pid %d) did not answer within %s s (SAGEMAKER_MODEL_SERVER_TIMEOUT): "
                          "ended, a new one takes its place", hook, child.proc.pid, self.timeout_s)
                self._end(child)
                child = None
                raise ServerError(f"{hook} did not answer within {self.timeout_s} s: its process was ended") from None
            except (EOFError, OSError) as e:
                code = child.end()
                self._end(child)
                child = None
                raise HookProcessDied(f"{hook}'s process ended before answering (exit code {code}; a new one took "
                                      f"its place): {type(e).__name__}: {e}") from None
            except Exception as e:  # noqa: BLE001 - an answer that does not unpickle here (the pipe stays in step)
                raise ServerError(f"{hook}'s answer could not be read from its process: {type(e).__name__}: {e}") from e
            finally:
                if child is not None:
                    self._idle.put(child)
        finally:
            release(held)  # the process mapped them, or never will
        if context is not None and attributes is not None:
            context.response_custom_attributes = attributes
        if ok:
            return value
        raise value

    def _free(self, deadline: float) -> "_Child":
        """An idle process, waiting for one until the deadline."""
        self.check()
        try:
            child = self._idle.get(timeout=max(0.0, deadline - time.monotonic()))
        except _queue.Empty:
            raise ServerError(f"no hook process was free within {self.timeout_s} s") from None
        if child is None:  # the pool is empty or closed: the next waiter hears it too
            self._idle.put(None)
            self.check()
            raise Unavailable("the hook processes were closed")
        return child

    def _end(self, child: "_Child") -> None:
        """child is no more (dead, or killed here): another starts in its place, on the
        pool's starter thread (the request that saw it end is answered meanwhile)."""
        child.end()
        with self._lock:
            self._children = [c for c in self._children if c is not child]
            if self._closed:
                return
            self._starting += 1
        self._to_start.put(child.proc.pid)

    def _starter(self) -> None:
        """The pool's own thread, which starts every replacement: a process is killed
        when the thread that started it ends (PR_SET_PDEATHSIG), and this one lasts."""
        while (ended := self._to_start.get()) is not None:
            new = error = None
            try:
                new = _Child(self.model_dir, self.single)
                new.wait_ready()
            except Exception as e:  # noqa: BLE001 - said below
                if new is not None:
                    new.end()
                new, error = None, e
            with self._lock:
                self._starting -= 1
                kept = new is not None and not self._closed
                if kept:
                    self._children.append(new)
                gone = not self._children and not self._starting
            if kept:
                log.info("hook process %d took the place of %d", new.proc.pid, ended)
                self._idle.put(new)
            elif new is not None:
                new.end()  # (the pool closed meanwhile)
            else:
                log.error("a hook process could not be started again: %s: %s", type(error).__name__, error)
                if gone:
                    self._idle.put(None)  # wakes whoever waits for a process: none is coming

    def close(self) -> None:
        """Every process ends now (killed: one may hang); their files go with them."""
        _pools.discard(self)
        with self._lock:
            self._closed = True
            children, self._children = self._children, []
        for child in children:
            child.end()
        self._idle.put(None)
        self._to_start.put(None)


def _say_mapped(child: "_Child", deadline: float) -> None:
    """Tells the process it may let its answer's files go (else held until its next call);
    one that ended meanwhile is noticed at its next call: this answer is whole."""
    try:
        child.channel.send(MAPPED, deadline)
    except (Deadline, EOFError, OSError):
        pass


def _fields(context) -> dict:
    return {"headers": dict(context.headers.items()), "path": context.path, "query_string": context.query_string,
            "target_model": context.target_model, "session_id": context.session_id,
            "device": str(context.device) if context.device is not None else None,
            "system_properties": getattr(context, "system_properties", None)}


class _Child:
    def __init__(self, model_dir: str, single: bool):
        requests_r, requests_w = os.pipe()
        answers_r, answers_w = os.pipe()
        env = child_environment(PYTHONPATH=import_path())
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "smserve.engine.hooks.processes", model_dir,
                                          str(requests_r), str(answers_w), "single" if single else "one-of-many",
                                          str(os.getpid())],
                                         pass_fds=(requests_r, answers_w), env=env, stdin=subprocess.DEVNULL)
        except BaseException:
            os.close(requests_w)
            os.close(answers_r)
            raise
        finally:
            os.close(requests_r)
            os.close(answers_w)
        self.channel = Channel(self.proc, requests_w, answers_r)
        self._ended = False

    def wait_ready(self) -> None:
        try:
            ok, error = self.channel.receive(time.monotonic() + START_S)
        except Deadline:
            raise RuntimeError(f"a hook process did not load code/ within {START_S} s") from None
        except (EOFError, OSError) as e:
            raise RuntimeError(f"a hook process ended while it loaded code/ (exit code {self.proc.poll()}): "
                               f"{type(e).__name__}: {e}") from None
        if not ok:
            raise RuntimeError(f"a hook process could not load code/: {error}")

    def call(self, message, deadline: float):
        self.channel.send(message, deadline)
        return self.channel.receive(deadline)

    def end(self) -> int | None:
        """Kill it (where it runs still) and reap it: its exit code (None: not reaped)."""
        if not self._ended:
            self._ended = True
            if self.proc.poll() is None:
                self.proc.kill()
            self.channel.close()
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None


# ---------------------------------------------------------------- the process's side


def _end_with(worker: int) -> None:
    """Killed when the worker ends, however it ends: a hung hook never outlives it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != worker:  # it ended before the line above
        os._exit(0)


def _serve(model_dir: str, requests_fd: int, answers_fd: int, single: bool, worker: int) -> None:
    _end_with(worker)
    # The worker ends it (pipe closed, or killed), after the requests in flight: a
    # SIGTERM to the process group at shutdown must not cut one off.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for fd in (requests_fd, answers_fd):
        os.set_inheritable(fd, False)  # a program a hook starts must not hold them
    requests = os.fdopen(requests_fd, "rb")
    answers = os.fdopen(answers_fd, "wb")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s")
    try:
        import torch

        torch.set_num_threads(1)  # a request's hook, per process: the cores are the processes'
        from smserve.core.context import RequestContext
        from smserve import toolkit
        from smserve.engine.hooks.script import load_hooks
        from smserve.settings import Settings

        # The script the worker's settings name (SAGEMAKER_PROGRAM): the same environment.
        hooks = load_hooks(model_dir, toolkit.script_of(Settings.from_env()), single)
    except BaseException as e:  # noqa: BLE001 - said to the worker, which refuses to start
        send(answers, (False, f"{type(e).__name__}: {e}"))
        return
    send(answers, (True, None))
    held: list[int] = []  # the last answer's files, kept until the worker has mapped them
    while True:
        try:
            message = receive(requests)
        except EOFError:
            return
        release(held)  # the worker mapped them: it says so (MAPPED) before anything else
        held = []
        if message == MAPPED:
            continue
        hook, args, fields = message
        context = None
        if fields is not None:
            context = RequestContext({k.upper(): v for k, v in fields["headers"].items()}, fields["path"],
                                     fields["query_string"], fields["target_model"])
            context.session_id = fields["session_id"]
            context.device = torch.device(fields["device"]) if fields["device"] else None
            if fields["system_properties"] is not None:
                context.system_properties = fields["system_properties"]
        answer = _answer(hooks, hook, args, context, held)
        try:
            send(answers, answer)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            release(held)
            held = []
            send(answers, (False, ServerError(f"{hook} failed: its value cannot leave its hook process: "
                                              f"{type(e).__name__}: {e}"), None))
        message = hook = args = fields = context = answer = None  # (the last request's body goes now)


def _answer(hooks, hook: str, args: tuple, context, held: list[int]) -> tuple:
    """(ok, the hook's value or exception, the custom attributes it set)."""
    try:
        function = getattr(hooks, hook)
        if hook == "output_fn":
            args = (restored(args[0]), args[1])
        elif hook == "input_fn":  # decoded here, off the worker's GIL
            from smserve import toolkit  # imported by _serve already: a look-up

            args = (toolkit.text_body(args[0], args[1], hooks.named(hook)), args[1])
        value = function(*args, context) if context is not None else function(*args)
    except BaseException as e:  # noqa: BLE001 - the worker names the hook and answers
        answer = (False, _portable(e))
    else:
        try:
            answer = (True, shareable(value, held))
        except SharedMemoryFull as e:
            answer = (False, SharedMemoryFull(f"{hook}'s value cannot reach the worker: {e}"))
        except BaseException as e:  # noqa: BLE001
            answer = (False, _portable(e))
    return (*answer, context.response_custom_attributes if context is not None else None)


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
    # Through the module by its name, not __main__: what it pickles must be found by
    # that name in the worker.
    from smserve.engine.hooks import processes

    processes._serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "single", int(sys.argv[5]))

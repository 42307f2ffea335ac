"""The real threads the engine's work runs on, and the hop from the event loop to them.

The inference thread (`ModelThread`): one real OS thread that runs every call into the
model, and the cheapest way for a greenlet to hand it work and get the result back.
gevent's ThreadPool does this in general form: per call it makes a result object with
its own async watcher, starts it, wakes the thread through a gevent-aware queue and
adjusts the pool's size, more Python time per request than a small model's forward pass
on one core. Here a call is one put on a C queue (the thread blocks in its get with the
GIL released), and results come back through one async watcher made once: the thread
appends to a deque and signals it (a signal already pending is not repeated), and the
loop's callback hands each result to the greenlet waiting for it.

The pools a worker's models share (`Pools`): gevent's pools start a thread only when one
is wanted: codec threads decode and encode big bodies, session threads run stream_fn
sessions (one each), hook threads run the models' input_fn and output_fn. The calling
greenlet waits for its thread; the loop does not.
"""

from __future__ import annotations

import _queue
import collections
from dataclasses import dataclass
from typing import Callable

from gevent import get_hub, monkey
from gevent.hub import Waiter
from gevent.threadpool import ThreadPool

_start_thread = monkey.get_original("_thread", "start_new_thread")
_STOP = object()


class Dropped(Exception):
    """A call whose caller left before the thread began it: never run."""


class ModelThread:
    """call(fn, *args) runs fn on the thread and returns (ok, value): fn's result, or the
    exception it raised (never raised on the thread, where nobody would see it). A caller
    interrupted while its call still waits for the thread takes the call back with it."""

    def __init__(self, first: Callable[[], None] | None = None):
        self._tasks = _queue.SimpleQueue()  # the C queue, never gevent's: the thread blocks in get()
        self._done: collections.deque = collections.deque()
        # Keeps the loop alive only while a call is out (a waiting greenlet must not see
        # "this operation would block forever"), not for the thread's whole life.
        self._signal = get_hub().loop.async_(ref=False)
        self._signal.start(self._deliver)
        self._out = 0  # calls handed to the thread whose result has not come back
        self._stopped = False
        if first is not None:
            self._tasks.put((None, first, ()))
        _start_thread(self._run, ())

    def call(self, fn: Callable, *args) -> tuple[bool, object]:
        if self._stopped:
            return False, RuntimeError("the inference thread has stopped")
        waiter = Waiter()
        if not self._out:
            self._signal.ref = True
        self._out += 1
        task = [waiter, fn, args]
        self._tasks.put(task)
        try:
            return waiter.get()
        except BaseException:
            # Its caller is gone (past its answer's deadline, killed): a call the thread
            # has not begun is dropped, and what it holds is freed now, not after it ran.
            task[1:] = [None, None]
            raise

    def stop(self) -> None:
        """The thread ends once the calls queued before this one have run."""
        if not self._stopped:
            self._stopped = True
            self._tasks.put(_STOP)

    # ------------------------------------------------------------ the thread's side

    def _run(self) -> None:
        tasks, done, signal = self._tasks, self._done, self._signal
        while True:
            task = tasks.get()
            if task is _STOP:
                # The watcher belongs to the loop's thread: closed there, from the loop.
                done.append(None)
                signal.send()
                return
            waiter, fn, args = task  # (one step under the GIL: a drop comes before it or after)
            if fn is None:
                result = (False, Dropped())
            else:
                try:
                    result = (True, fn(*args))
                except BaseException as e:  # noqa: BLE001 - handed back to the waiting greenlet
                    result = (False, e)
            if waiter is None:
                continue
            done.append((waiter, result))
            signal.send()
            del task, waiter, fn, args, result  # nothing of this call outlives it on the thread

    # ------------------------------------------------------------ the loop's side

    def _deliver(self) -> None:
        done = self._done
        while done:
            item = done.popleft()
            if item is None:
                self._signal.stop()
                self._signal.close()
                return
            waiter, result = item
            self._out -= 1
            if not self._out:
                self._signal.ref = False
            waiter.switch(result)


# ---- The pools a worker's models share

# Bodies (and outputs) from this size on are decoded (encoded) on a codec thread.
OFFLOAD_BYTES = 256 * 1024


@dataclass(frozen=True)
class Pools:
    codec: ThreadPool
    session: ThreadPool
    hooks: ThreadPool

    @classmethod
    def sized(cls, codec: int, session: int, hooks: int) -> "Pools":
        return cls(ThreadPool(codec), ThreadPool(session), ThreadPool(hooks))

    def offload(self, size: int, fn, *args):
        """Run a decode or encode: inline when it is small (a thread hop costs more than
        the work), on a codec thread when its cost grows with a big body, so the event
        loop keeps answering /ping meanwhile."""
        if size < OFFLOAD_BYTES:
            return fn(*args)
        return on_thread(self.codec, fn, args)

    def on_hooks(self, fn, *args):
        """fn on a hook thread, whatever its cost: a hook of the user's, whose cost is
        not known from the body's size."""
        return on_thread(self.hooks, fn, args)

    def on_session(self, lock, fn, *args):
        """fn on a stream_fn session's thread, holding lock (the model lock, shared with
        the inference thread) only while fn runs."""
        return on_thread(self.session, fn, args, lock)


class Slots:
    """A count of held things bounded by `most` (a worker's stream_fn sessions)."""

    def __init__(self, most: int):
        self.most = most
        self.held = 0

    def take(self) -> bool:
        """Count one in, unless `most` are held."""
        if self.held >= self.most:
            return False
        self.held += 1
        return True

    def give_back(self) -> None:
        self.held -= 1


def on_thread(pool, fn, args, lock=None):
    """fn(*args) on one of pool's threads (holding lock, if given, while it runs); the
    calling greenlet waits, the loop does not. fn's exception is raised here, in the
    caller: it travels back as a value, since the pool would print a traceback for what
    is often a client's 4xx."""
    ok, value = pool.apply(_captured, (fn, args, lock))
    if ok:
        return value
    raise value


def _captured(fn, args, lock):
    if lock is not None:
        lock.acquire()
    try:
        return True, fn(*args)
    except BaseException as e:  # noqa: BLE001 - re-raised on the event loop's side
        return False, e
    finally:
        if lock is not None:
            lock.release()

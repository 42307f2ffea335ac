"""Where torch may run on the event loop's thread: its main greenlet, never another.

torch records a C++ stack trace for every error it raises: c10::Error's constructor walks
the stack with glibc's backtrace(). A greenlet other than a thread's main one runs on a
slice of the thread's stack whose older frames are not its own: below its first frame lie
whatever frames the hub had there when it first switched in, long since overwritten. The
unwinder follows them into garbage and the process dies of SIGSEGV where Python would
have raised (a bfloat16 tensor's `.numpy()`, a sparse tensor sliced, a meta tensor
moved: each killed a worker, with every request and session it held). A real thread,
and a thread's main greenlet, run on the thread's own stack, which unwinds to its real
bottom, so there a torch error is an exception like any other.

So on the loop's thread torch runs only on the main greenlet. A worker's main greenlet
serves this lane (`run`): it parks in the hub, and a greenlet with torch work (an
inline forward pass, a hook's tensors cut or joined for the batcher) switches straight
to it with `call(fn, *args)` and gets the result back by a switch: two greenlet switches,
microseconds, where a hand-off to a real thread costs the GIL twice each way. Real
threads (the inference thread, the hook and codec threads) call torch directly.
"""

from __future__ import annotations

import _queue
import collections
from typing import Callable

import gevent
from gevent import get_hub
from gevent.hub import Waiter
from gevent import monkey
from greenlet import getcurrent

_thread_id = monkey.get_original("_thread", "get_ident")  # the OS thread's, whatever gevent patched
_start_thread = monkey.get_original("_thread", "start_new_thread")

_STOP = object()


class _Lane:
    def __init__(self):
        self.main = None  # the main greenlet while it serves the lane
        self.thread = None  # its thread's ident
        # The main greenlet waits for work (parked in the hub, or in the switch that
        # answered the last call): a caller may switch straight to it. Not while a call
        # runs: a call that blocks on the hub (a lock) has the hub switch back to it.
        self.idle = False
        self.queued: collections.deque = collections.deque()  # calls made while it was busy


_lane = _Lane()


def on_own_stack() -> bool:
    """Whether the calling code runs where torch's errors unwind safely: a real thread,
    or a thread's main greenlet (its parent is None)."""
    return getcurrent().parent is None


def call(fn: Callable, *args):
    """fn(*args) where a torch error is an exception, not a crash: here when the caller
    is on its thread's own stack, else on the main greenlet (or, where no worker serves
    the lane, as in a unit test's greenlets, on a real thread while this one waits
    without yielding: the call keeps its place among the greenlets, as a direct call
    would)."""
    current = getcurrent()
    lane = _lane
    if current.parent is None or (lane.main is not None and _thread_id() != lane.thread):
        # A thread's own stack, or another thread than the loop's (a hook or codec
        # thread of gevent's pool: its one greenlet lives as long as the thread, above
        # a main greenlet that never runs again, so the frames below it stay whole).
        return fn(*args)
    if lane.main is None:
        return _aside(fn, args)
    if lane.idle:
        lane.idle = False
        ok, value = lane.main.switch((current, fn, args))
    else:
        waiter = Waiter()
        lane.queued.append((waiter, fn, args))
        ok, value = waiter.get()
    if ok:
        return value
    raise value


def run(fn: Callable, *args):
    """fn(*args) in a greenlet of its own, while the calling main greenlet serves the
    lane until it ends; its result, or its exception raised here. A worker's whole life
    runs so (http/worker.py)."""
    if getcurrent().parent is not None or _lane.main is not None:
        raise RuntimeError("the main lane is served by a thread's main greenlet, once")
    outcome: list = []

    def body():
        try:
            outcome.append((True, fn(*args)))
        except BaseException as e:  # noqa: BLE001 - raised again by the main greenlet
            outcome.append((False, e))
        _stop()

    gevent.spawn(body)
    _serve()
    ok, value = outcome[0]
    if ok:
        return value
    raise value


def _stop() -> None:
    lane = _lane
    if lane.idle:
        lane.idle = False
        lane.main.switch(_STOP)
    else:
        lane.queued.append(_STOP)


def _serve() -> None:
    lane, hub = _lane, get_hub()
    lane.main, lane.thread = getcurrent(), _thread_id()
    reply = None  # (caller, outcome): owed to a caller that switched here
    try:
        while True:
            while lane.queued:
                task = lane.queued.popleft()
                if task is _STOP:
                    return
                waiter, fn, args = task
                hub.loop.run_callback(waiter.switch, _outcome(fn, args))
            lane.idle = True
            if reply is None:
                task = hub.switch()  # the hub runs the worker; a caller switches back here
            else:
                caller, outcome = reply
                reply = None
                task = caller.switch(outcome)
            lane.idle = False
            if task is _STOP:
                return
            caller, fn, args = task
            reply = (caller, _outcome(fn, args))
    finally:
        lane.main, lane.idle = None, False


_aside_tasks: _queue.SimpleQueue | None = None


def _aside(fn: Callable, args: tuple):
    """fn(*args) on a raw thread of its own, this thread blocked meanwhile (no switch)."""
    global _aside_tasks
    if _aside_tasks is None:
        _aside_tasks = _queue.SimpleQueue()
        _start_thread(_run_aside, (_aside_tasks,))
    reply = _queue.SimpleQueue()
    _aside_tasks.put((fn, args, reply))
    ok, value = reply.get()
    if ok:
        return value
    raise value


def _run_aside(tasks: _queue.SimpleQueue) -> None:
    while True:
        fn, args, reply = tasks.get()
        reply.put(_outcome(fn, args))
        del fn, args, reply


def _outcome(fn: Callable, args: tuple) -> tuple[bool, object]:
    try:
        return True, fn(*args)
    except BaseException as e:  # noqa: BLE001 - handed back to the caller
        return False, e

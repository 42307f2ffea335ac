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

Also here, the rest of what runs on the loop's thread and before whom:
- the loop's priority: the threads that run model and hook code are niced
  (`yield_cpu_to_the_loop`), so /ping and every request's bytes come first; and its
  poll clock (`poll_clock`): when the loop last polled its sockets;
- when a forward pass may run inline, on this lane, instead of on the inference thread
  (`InlinePasses`): a hand-off there and back costs two thread switches and the GIL
  passing twice each way, more than a small model's whole pass on one core. The loop is
  held while a pass runs inline, so one does only when every rule agrees: the model
  allows it (`model_allows`: a CPU model run by our own forward, one torch thread, not
  compiled); passes of about its size (the same bit length of rows) were measured
  shorter than SMSERVE_INLINE_PASS_MS in CPU time and have not held the loop past it
  time after time lately; the loop has polled within INLINE_POLL_S, so /ping never
  waits behind a run of them; and no other thread holds the model (the runner checks
  that last, with the model's lock).
"""

from __future__ import annotations

import _queue
import collections
import logging
import os
import threading
import time
from typing import Callable

import gevent
from gevent import get_hub
from gevent.hub import Waiter
from gevent import monkey
from greenlet import getcurrent

log = logging.getLogger(__name__)

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
        # The last call's outcome, taken by its caller once switched back to: handed over
        # here, not as the switch's argument, which the main greenlet's frame would hold
        # while parked (its inputs and answer alive until the next call).
        self.outcome: tuple[bool, object] | None = None


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
        lane.main.switch((current, fn, args))
        (ok, value), lane.outcome = lane.outcome, None
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
    caller = None  # owed its outcome (lane.outcome): it switched here
    try:
        while True:
            while lane.queued:
                task = lane.queued.popleft()
                if task is _STOP:
                    return
                waiter, fn, args = task
                hub.loop.run_callback(waiter.switch, _outcome(fn, args))
                task = waiter = fn = args = None
            lane.idle = True
            if caller is None:
                task = hub.switch()  # the hub runs the worker; a caller switches back here
            else:
                task, caller = caller, None
                task = task.switch()  # the caller takes lane.outcome
            lane.idle = False
            if task is _STOP:
                return
            caller, fn, args = task
            lane.outcome = _outcome(fn, args)
            task = fn = args = None  # (nothing of a call stays referenced here while parked)
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


# ---- The loop's priority and its poll clock


# The inference thread's nice value, above the event loop's: the loop's short per-request
# work (and /ping) comes first, the model gets every cycle the loop leaves.
INFERENCE_NICE = 10


class _PollClock:
    """When the event loop last polled its sockets (time.monotonic): set by a check
    watcher, which libev runs right after each poll. (The loop's own `now()` will not
    do: gevent.sleep and the callback runner update it in the middle of a turn.)"""

    def __init__(self, loop):
        self.at = time.monotonic()
        self._watcher = loop.check(ref=False)
        self._watcher.start(self._polled)

    def _polled(self) -> None:
        self.at = time.monotonic()

    def others_ready(self) -> bool:
        """Whether watchers the last poll found ready are still waiting to run this turn
        (libev's pending count): other greenlets, whose requests' bytes came in with the
        running one's. False where the loop cannot say (libuv)."""
        return bool(getattr(self._watcher.loop, "pendingcnt", 0))


_clocks: dict = {}


def poll_clock() -> _PollClock:
    """The running loop's poll clock (one a loop, made on first use)."""
    loop = get_hub().loop
    clock = _clocks.get(id(loop))
    if clock is None or clock._watcher.loop is not loop:
        clock = _clocks[id(loop)] = _PollClock(loop)
    return clock


def yield_cpu_to_the_loop() -> None:
    """Lower the calling thread's CPU priority (Linux: nice applies per thread)."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + INFERENCE_NICE)
    except (AttributeError, OSError) as e:  # not Linux, or a sandbox that forbids it
        log.debug("this thread keeps its priority: %s", e)


# ---- Inline passes

# Inline passes run only while the event loop has polled its sockets within this many
# seconds: a run of them never keeps /ping waiting longer.
INLINE_POLL_S = 0.010
# A size whose inline passes took longer than the limit INLINE_STRIKES times in a row
# goes to the thread for INLINE_PAUSE_S.
INLINE_STRIKES = 3
INLINE_PAUSE_S = 10.0


def model_allows(cpu: bool, own_forward: bool, compiled: bool, torch_threads: int) -> bool:
    """Whether a model's passes may ever run inline. cpu: on the CPU with no staging
    (a GPU's device and streams are the inference thread's). own_forward: no predict_fn
    of the user's (its code may rely on the thread that ran model_fn, as torch's grad
    mode does). compiled: a recompile would hold the loop for seconds. torch_threads:
    OpenMP keeps a pool per calling thread, and a second pool would spin at the loop's
    priority beside the inference thread's."""
    return cpu and own_forward and not compiled and torch_threads == 1


class InlinePasses:
    """One model's record of its passes' times, by size, and the rules above applied to
    each next pass."""

    def __init__(self, limit_s: float = 0.0):
        self.limit_s = limit_s  # passes measured shorter run inline (0: never)
        self._took: dict[int, float] = {}  # the last pass's seconds, by the bit length of its rows
        self._paused_until: dict[int, float] = {}  # sizes kept off the loop, until when (monotonic)
        self._strikes: dict[int, int] = {}  # inline passes in a row that ran past the limit, by size
        self._polled = poll_clock()

    def admits(self, rows: int) -> bool:
        """Whether a pass of `rows` records may run inline now (the model's lock aside)."""
        bucket = rows.bit_length()
        took = self._took.get(bucket)
        now = time.monotonic()
        return (took is not None and took < self.limit_s and now - self._polled.at < INLINE_POLL_S
                and now >= self._paused_until.get(bucket, 0.0))

    def run(self, rows: int, fn: Callable, args: tuple) -> tuple[float, object]:
        """fn(*args) inline, and when it started; its time by the clock recorded."""
        started = time.monotonic()
        try:
            return started, call(fn, *args)
        finally:
            self._ran_inline(rows.bit_length(), started, time.monotonic() - started)

    def measured(self, rows: int, cpu_s: float) -> None:
        """A pass of `rows` records took cpu_s of CPU on the inference thread."""
        self._took[rows.bit_length()] = cpu_s

    def _ran_inline(self, bucket: int, started: float, held: float) -> None:
        self._took[bucket] = held
        if held < self.limit_s:
            self._strikes[bucket] = 0
        elif self._strikes.get(bucket, 0) + 1 < INLINE_STRIKES:
            self._strikes[bucket] = self._strikes.get(bucket, 0) + 1
        else:
            # Short in CPU on the thread, long by the clock here, time after time: it
            # waits on something (threads it forked, I/O). (Once could be preemption.)
            self._strikes[bucket] = 0
            self._paused_until[bucket] = started + held + INLINE_PAUSE_S


def timed(fn, args):
    """On the inference thread: when fn started (after its wait for the thread), its
    result, and the CPU seconds it took: what it would hold the loop's thread for if it
    ran there. (Not the wall time: on a core the loop keeps busy, the inference thread's
    passes are preempted by the loop, and measured by the clock they would look long,
    and stay on this thread, for as long as that load lasts.)"""
    started = time.monotonic()
    cpu = time.thread_time()
    result = fn(*args)
    return started, result, time.thread_time() - cpu

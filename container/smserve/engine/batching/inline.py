"""When a forward pass may run inline, on the event loop's own thread, instead of on the
inference thread: the whole policy, in one place.

A hand-off to the inference thread and back costs two thread switches and the GIL
passing twice each way; on one core that is more than a small model's whole forward
pass (docs/performance.md). The loop is held while a pass runs inline, so one does only
when every rule here agrees:
- the model allows it (`model_allows`): a CPU model run by our own forward, with one
  torch thread, not compiled;
- passes of about its size (the same bit length of rows) were measured shorter than
  the limit (SMSERVE_INLINE_PASS_MS) in CPU time, and have not held the loop past it
  time after time lately;
- the loop has polled its sockets within INLINE_POLL_S, so /ping is never kept waiting
  behind a run of inline passes (else the pass goes to the thread and the loop polls);
- no other thread holds the model (a stream_fn session's step): the loop never blocks
  on it (the runner checks this last, with the model's lock).
An inline pass runs on the loop thread's main greenlet, where torch's errors unwind
safely (engine/runtime/main_lane.py).
"""

from __future__ import annotations

import time
from typing import Callable

from smserve.engine.runtime import main_lane
from smserve.engine.runtime.priority import poll_clock

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
            return started, main_lane.call(fn, *args)
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

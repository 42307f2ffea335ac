"""Who gets a core first: the event loop, which answers /ping and moves every request's
bytes, before the threads that run model and hook code; and when the loop last polled
its sockets, which decides whether a short forward pass may run on its thread
(engine/batching/inline.py), and whether that poll left other greenlets ready to run
(runner.Runner._outside_batcher)."""

from __future__ import annotations

import logging
import os
import threading
import time

from gevent import get_hub

log = logging.getLogger(__name__)

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

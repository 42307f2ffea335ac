"""Counts kept in plain Python between flushes, written to prometheus_client's values
once a second.

In multiprocess mode every `inc` or `observe` takes prometheus_client's lock, checks
the pid and writes the value into its mmap'd file, and a request records several
(its count, its duration, its queue wait, its pass, its pending count): a visible
share of the server's CPU per request. Here a request costs a few additions; `flush` writes the
sums. The worker's sampler flushes every FLUSH_INTERVAL_S, and the worker that answers
a scrape flushes first, so a scrape sees its own counts exactly and its siblings' at
most a second old. A worker killed with SIGKILL loses at most its last second of
counts: what it had flushed stays in its files, so no sum ever goes backwards.

Everything here runs on the worker's event loop only (recording and flushing alike), so
it needs no lock of its own.
"""

from __future__ import annotations

from bisect import bisect_left

FLUSH_INTERVAL_S = 1.0

_dirty: list = []  # tallies with something to write since the last flush


class Count:
    """A counter child's increments since the last flush."""

    __slots__ = ("child", "pending", "dirty")

    def __init__(self, child):
        self.child = child
        self.pending = 0.0
        self.dirty = False

    def inc(self, amount: float = 1.0) -> None:
        self.pending += amount
        if not self.dirty:
            self.dirty = True
            _dirty.append(self)

    def flush(self) -> None:
        if self.pending:
            self.child.inc(self.pending)
            self.pending = 0.0


class Observations:
    """A histogram child's observations since the last flush: per bucket and their sum.
    Written through the child's own bucket and sum values, so the files hold exactly
    what child.observe would have written."""

    __slots__ = ("child", "bounds", "counts", "total", "dirty")

    def __init__(self, child):
        self.child = child
        self.bounds = tuple(child._upper_bounds)  # noqa: SLF001 - +Inf last, as observe() reads them
        self.counts = [0] * len(self.bounds)
        self.total = 0.0
        self.dirty = False

    def observe(self, amount: float) -> None:
        # The first bucket whose upper bound is >= amount, as Histogram.observe picks it.
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.total += amount
        if not self.dirty:
            self.dirty = True
            _dirty.append(self)

    def flush(self) -> None:
        buckets = self.child._buckets  # noqa: SLF001 - the values observe() itself writes
        for i, n in enumerate(self.counts):
            if n:
                buckets[i].inc(n)
                self.counts[i] = 0
        if self.total:
            self.child._sum.inc(self.total)  # noqa: SLF001
            self.total = 0.0


class Level:
    """A gauge child set to this process's current level at each flush (requests
    pending): a change costs nothing until then."""

    __slots__ = ("child", "value", "written", "dirty")

    def __init__(self, child):
        self.child = child
        self.value = 0
        self.written = None
        self.dirty = False

    def add(self, delta: int) -> None:
        self.value += delta
        if not self.dirty:
            self.dirty = True
            _dirty.append(self)

    def flush(self) -> None:
        if self.value != self.written:
            self.child.set(self.value)
            self.written = self.value


def flush() -> None:
    """Write every tally's news to its prometheus_client value."""
    global _dirty
    dirty, _dirty = _dirty, []
    for tally in dirty:
        tally.dirty = False
        tally.flush()

"""Requests cut into forward passes and passes cut back into requests: the row
arithmetic of the batcher (engine/batching/runner.py), on named arrays, the chunks it
queues, and its queue of them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import gevent.queue
import numpy as np
from gevent.event import AsyncResult

from smserve.engine.batching import batchable
from smserve.errors import BadRequest

Arrays = dict[str, np.ndarray]


def records_in(data) -> int:
    """The records a model's input holds, for the metrics: dimension 0 of its (first)
    array or tensor, or its length; 1 for anything else."""
    if isinstance(data, dict) and data:
        data = next(iter(data.values()))
    shape = getattr(data, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else 1
    if isinstance(data, (list, tuple)):
        return len(data)
    return 1


def concatenate(name: str, parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts)


def pass_rows(rows: int, size: int) -> list[int]:
    """The records of each pass a request of `rows` records takes at `size` a pass (one
    pass of 0 for an empty request)."""
    return [min(size, rows - start) for start in range(0, max(rows, 1), size)]


def rows_of(inputs: Arrays) -> int:
    counts = {a.shape[0] if a.ndim else 1 for a in inputs.values()}
    if len(counts) != 1:
        raise BadRequest(f"inputs disagree on the batch dimension: {sorted(counts)}")
    return counts.pop()


def split_outputs(outputs: Arrays, rows: list[int]) -> list[Arrays]:
    total = sum(rows)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise ValueError(f"output {name!r} has shape {list(array.shape)}, not {total} rows")
    parts = []
    start = 0
    for n in rows:
        parts.append({name: array[start:start + n] for name, array in outputs.items()})
        start += n
    return parts


@dataclass
class Chunk:
    """One pass's worth of a request: its records, or (past the max batch size) one
    chunk of them, linked to the next chunk."""

    inputs: Arrays
    rows: int
    # None: the built-in codecs' named arrays. Else the form of what a model's input_fn
    # returned (engine/batching/batchable.py): its leaves are the inputs, its prediction is cut
    # back by batchable.split.
    form: batchable.Form | None = None
    result: AsyncResult = field(default_factory=AsyncResult)
    queued: float = field(default_factory=time.monotonic)
    # The request's next chunk: queued once the batcher takes this one, behind whatever
    # other requests wait by then, so that passes of different requests take turns.
    follow: "Chunk | None" = None
    signature: tuple = ()
    # Its request has gone (past its answer's deadline, or its stream closed): the
    # batcher passes it by, and its inputs are let go at once.
    dropped: bool = False

    def __post_init__(self):
        # Requests batch together only when everything but dimension 0 agrees. Made
        # once, where the chunk is made: a tensor's shape is read where torch may raise.
        if self.form is not None:
            self.signature = self.form.signature(self.inputs)
        else:
            self.signature = tuple((name, a.dtype.str, a.shape[1:]) for name, a in self.inputs.items())

    def drop(self) -> None:
        self.dropped = True
        self.inputs = self.follow = None


def cut(inputs: Arrays, size: int, form: batchable.Form | None) -> list[Chunk]:
    """A request's chunks of at most `size` records, each linked to the next."""
    chunks = [Chunk({k: v[i * size : i * size + rows] for k, v in inputs.items()}, rows, form)
              for i, rows in enumerate(pass_rows(rows_of(inputs), size))]
    for chunk, following in zip(chunks, chunks[1:]):
        chunk.follow = following
    return chunks


class ChunkQueue:
    """The batcher's queue of chunks. A request's first chunk is queued when it comes,
    each next one when the batcher takes the one before: a request of thousands of
    passes does not stand ahead of one that arrives after its first pass, and a request
    alone still has its next chunk queued while a pass runs."""

    def __init__(self):
        self._queue: gevent.queue.Queue = gevent.queue.Queue()
        self._held: Chunk | None = None  # taken but did not fit the last batch

    def qsize(self) -> int:
        return self._queue.qsize()

    def empty(self) -> bool:
        """Nothing queued, nor held over from the last batch."""
        return self._held is None and not self._queue.qsize()

    def answers(self, chunks: list[Chunk]) -> Iterator:
        """Each of a request's chunks' answers, in order, as each pass ends. Every chunk
        is dropped at the end: one still queued is left without a pass, one answered
        lets its inputs go."""
        try:
            self._queue.put(chunks[0])
            for chunk in chunks:
                yield chunk.result.get()
        finally:
            for chunk in chunks:
                chunk.drop()

    def first(self) -> Chunk:
        """The next batch's first chunk: the one held over, else the next one queued
        (waiting for it)."""
        first = self._held if self._held is not None and not self._held.dropped else None
        self._held = None
        while first is None:
            first = self._take(self._queue.get())
        return first

    def gather(self, first: Chunk, max_rows: int, delay_s: float, alone: Callable[[], bool]) -> list[Chunk]:
        """first and the chunks queued within delay_s after it that fit beside it: up to
        max_rows records, all of its signature. The first that does not fit is held for
        the next batch. alone(): batching has ended meanwhile (the rest run alone)."""
        batch, rows, signature = [first], first.rows, first.signature
        deadline = time.monotonic() + delay_s
        while rows < max_rows and not alone():
            remaining = deadline - time.monotonic()
            try:
                item = self._take(self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait())
            except gevent.queue.Empty:
                break
            if item is None:
                continue
            if rows + item.rows > max_rows or item.signature != signature:
                self._held = item
                break
            batch.append(item)
            rows += item.rows
        return batch

    def _take(self, item: Chunk) -> Chunk | None:
        """The batcher takes item: its request's next chunk queues behind those waiting.
        None for an item whose request has gone."""
        if item.dropped:
            return None
        if item.follow is not None:
            self._queue.put(item.follow)
            item.follow = None
        return item

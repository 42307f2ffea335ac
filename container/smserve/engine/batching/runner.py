"""Feeds the model from one real OS thread, batching requests that arrive together.

HTTP I/O runs in gevent greenlets; a forward pass would stall them all, so every call
into the model runs on the inference thread (model_thread.py). Requests queue up for
the batcher greenlet, whose next pass takes as many as fit in the model's max batch
size, concatenated along dimension 0; one that fills a pass by itself and finds the
model idle goes straight to a pass of its own.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterator

import gevent
import numpy as np
from gevent.lock import Semaphore
from gevent.queue import Queue
from gevent import monkey

from smserve import metrics
from smserve.engine.batching import plan as batch_plan
from smserve.engine.batching import batchable
from smserve.engine.runtime import main_lane
from smserve.engine.batching.passes import Arrays, Chunk, concatenate, cut, pass_rows, records_in, rows_of, split_outputs
from smserve.engine.batching.batchable import is_stream
from smserve.errors import user_frames_first
from smserve.engine.runtime.model_thread import ModelThread
from smserve.engine.runtime.priority import poll_clock, yield_cpu_to_the_loop
from smserve.errors import HTTPError, Named500, ServerError

log = logging.getLogger(__name__)

# (input name, the requests' arrays) -> one array, concatenated along dimension 0.
Stage = Callable[[str, list[np.ndarray]], np.ndarray]
# A real lock: model code runs on real threads, which must block on it without the hub.
_RealLock = monkey.get_original("threading", "Lock")
_QUEUED = object()  # Runner._direct's answer for a request that goes to the batcher


class Runner:
    def __init__(self, max_batch_size: int = 0, max_delay_s: float = 0.0):
        # The inference thread's first task, before any model code: threads it starts
        # (torch's intra-op pool) inherit its priority.
        self.thread = ModelThread(first=yield_cpu_to_the_loop)
        # Held by whatever thread runs model code: the inference thread here, and the
        # session threads of stream_fn sessions (websocket.py) while their code runs.
        self.model_lock = _RealLock()
        # Forward passes run, and how many of them served more than one request.
        self.passes_run = 0
        self.batched_passes = 0
        self.max_batch_size = max_batch_size
        self.max_delay_s = max_delay_s
        # Forward passes that take less than this run on the event loop's own thread
        # (start: 0 for a model they may not); see _forward.
        self.inline_pass_s = 0.0
        self._pass_s: dict[int, float] = {}  # the last pass's seconds, by the bit length of its rows
        # Sizes whose inline pass held the loop past the limit, and until when (monotonic)
        # they go to the thread whatever their CPU time says.
        self._no_inline_until: dict[int, float] = {}
        self._long_inline: dict[int, int] = {}  # inline passes in a row that ran past it, by size
        self._polled = poll_clock()
        # A request the batcher has taken and is waiting to run (for the gate): the
        # model is not idle meanwhile, though the queue is empty.
        self._waiting: Chunk | None = None
        self._predict: Callable[[Arrays], Arrays] | None = None
        self._stage: Stage = concatenate
        self._queue: Queue = Queue()
        self._held: Chunk | None = None  # taken from the queue but did not fit the last batch
        # A pass's prediction could not be cut back into its requests (batchable.split):
        # the model's own requests (a form's) run alone from then on.
        self.unsplittable = False
        # Batching turned on by a setting for a model without metadata.json (batch_plan.Trial).
        self.trial: batch_plan.Trial | None = None
        # Held by whichever runs a forward pass: the batcher, or a request that found the
        # model idle and went straight to a pass of its own.
        self._gate = Semaphore(1)
        self._batcher = None
        # The model's metrics (its name is known once it is loaded: start).
        self.stats = metrics.ModelStats(None)

    def call(self, fn: Callable, *args):
        """Run fn on the inference thread; the calling greenlet waits, the loop does not.
        fn's exception is raised here, in the caller (it travels back as a value, so
        nothing prints a traceback of its own for what is often a 400 or a 500 logged
        already)."""
        ok, value = self.thread.call(_holding, self.model_lock, fn, args)
        if ok:
            return value
        raise value

    def start(self, predict: Callable[[Arrays], Arrays], max_batch_size: int | None = None,
              stage: Stage | None = None, name: str | None = None, inline_pass_s: float = 0.0) -> None:
        """stage: where a batch's inputs are concatenated (a GPU model's pinned buffers).
        name: the model's, which labels its metrics. Whoever unloads the model later
        says so with `runner.stats.ready(False)`; its counters stay. inline_pass_s: a
        pass measured shorter than this runs on the loop's thread (0: never)."""
        self.inline_pass_s = inline_pass_s
        if name is not None:
            self.stats = metrics.model(name)
            self.stats.ready(True)
        self._predict = _guarded(predict)
        if stage is not None:
            self._stage = stage
        if max_batch_size is not None:
            self.max_batch_size = max_batch_size
        if self.max_batch_size > 0 and self._batcher is None:
            self._batcher = gevent.spawn(self._batch_loop)

    def stop(self) -> None:
        """End the batcher and the inference thread (a multi-model unload, once the
        model's requests have finished): nothing may hold the model after this."""
        if self._batcher is not None:
            self._batcher.kill()
            self._batcher = None
        self._predict = None
        self.thread.stop()

    def infer(self, inputs: Arrays, context=None, form: batchable.Form | None = None) -> Arrays:
        """Named arrays in, named arrays out, batched with whatever else is waiting.
        context: the request's, for a predict_fn that takes one; only an unbatched
        model's pass is one request's, so a batched pass gets None. form: the leaves are
        what a model's input_fn returned (engine/batching/batchable.py), and what comes back is
        this request's part of the model's prediction (or its named arrays)."""
        if (self.unsplittable and (form is not None or self.trial)) or self._untried_cut(inputs):
            # The model's predictions could not be cut back into requests: each runs alone.
            return self._lone(inputs, context, form)
        outputs = self._direct(inputs, context, form)
        if outputs is not _QUEUED:
            return outputs
        results = list(self._queued(inputs, form))
        if len(results) == 1:
            return results[0]
        if any(is_stream(r) for r in results):
            return self._whole(results, inputs, context, form)
        if form is not None:
            try:
                return main_lane.call(batchable.join, results, pass_rows(rows_of(inputs), self.max_batch_size))
            except batchable.Unsplittable as e:  # its passes' answers are no request's: it runs whole
                log.warning("the model's answers to the %d passes of one request cannot be joined (%s): it runs "
                            "again as one pass", len(results), e)
                return self._lone(inputs, context, form)
        return {name: np.concatenate([r[name] for r in results]) for name in results[0]}

    def passes(self, inputs: Arrays) -> int:
        if self.max_batch_size <= 0 or not inputs or (self.trial and self.unsplittable) or self._untried_cut(inputs):
            return 1
        return max(1, -(-rows_of(inputs) // self.max_batch_size))

    def _untried_cut(self, inputs: Arrays) -> bool:
        """A request bigger than a pass while batching is on trial and no pass has
        vouched for it yet: it runs whole, as in the containers, since its passes'
        answers joined may not be its answer (one number a pass, say)."""
        return (self.trial is not None and not self.trial.tried and self.max_batch_size > 0 and bool(inputs)
                and rows_of(inputs) > self.max_batch_size)

    def infer_by_pass(self, inputs: Arrays, context=None) -> Iterator[Arrays]:
        """The outputs of each forward pass, in order, as each pass ends. A request
        bigger than the model's max batch size runs as several passes, all queued at
        once so they follow each other without a gap."""
        outputs = self._direct(inputs, context)
        if outputs is not _QUEUED:
            yield outputs
            return
        passes = self._queued(inputs)
        first = next(passes)
        if is_stream(first):
            yield self._whole([first, *passes], inputs, context)
            return
        yield first
        yield from passes

    def _whole(self, results: list, inputs: Arrays, context, form=None):
        """The model answered the passes of a request bigger than the max batch size with
        iterators (a predict_fn that streams, found out on this request): one stream
        cannot be made of several, so they are closed unread and the request runs as one
        call on all its records, as every request does once the model is known to
        stream (hooks.streams: the hooks' path, never batched)."""
        for result in results:
            if is_stream(result) and hasattr(result, "close"):
                self.call(result.close)
        return self._lone(inputs, context, form)

    def _lone(self, inputs: Arrays, context, form=None):
        """The request whole, as one pass outside the batcher."""
        if self._predict is None:
            raise ServerError("model is not loaded")
        try:
            return self._pass(records_in(inputs), self._predict, inputs, context, form)
        except HTTPError as e:
            log_model_failure(e)
            raise

    def _direct(self, inputs: Arrays, context, form=None):
        """The outputs of a request that runs as one pass of its own, outside the
        batcher; _QUEUED when it goes to the batcher instead."""
        if self._predict is None:
            raise ServerError("model is not loaded")
        if self.max_batch_size <= 0 or not inputs:
            return self._lone(inputs, context, form)
        rows = rows_of(inputs)
        if rows == self.max_batch_size and self._idle() and not self._polled.others_ready():
            # A request that fills a pass by itself, with no pass to wait for and no other
            # request about to be read: nothing can join it, so it skips the batcher's
            # queue and its hand-offs. A smaller one is queued even when the model is
            # idle, so requests read in the same turn of the loop join it; a full one is
            # queued when other greenlets are ready, so their decodes run first and the
            # passes back to back (docs/performance.md).
            return self._pass_alone(inputs, rows, form)
        return _QUEUED

    def _queued(self, inputs: Arrays, form=None) -> Iterator[Arrays]:
        """The outputs of each of the request's passes, in order. Its first chunk is
        queued now, each next one when the batcher takes the one before (_take): a
        request of 6,000 passes does not stand ahead of one that arrives after its first
        pass, and a request alone still has its next chunk queued while a pass runs."""
        # (A model's own tensors are sliced where torch may raise: engine/runtime/main_lane.py.)
        size = self.max_batch_size
        chunks = cut(inputs, size, form) if form is None else main_lane.call(cut, inputs, size, form)
        self.stats.pending(1)
        try:
            self._queue.put(chunks[0])
            for chunk in chunks:
                yield chunk.result.get()
        finally:
            self.stats.pending(-1)
            for chunk in chunks:  # (one still queued leaves it without a pass; one answered lets its inputs go)
                chunk.drop()

    def _take(self, item: Chunk) -> Chunk | None:
        """The batcher takes item: its request's next chunk queues behind those waiting.
        None for an item whose request has gone."""
        if item.dropped:
            return None
        if item.follow is not None:
            self._queue.put(item.follow)
            item.follow = None
        return item

    def call_pass(self, fn: Callable, *args, records: Callable[[], int]):
        """fn on the inference thread as one pass outside the batcher (a user's hooks),
        counted as the batcher counts its passes. records(): how many records the pass
        held, asked once it ended well."""
        try:
            return self._counted(lambda: self.call(_timed, _named_failure, (fn, args))[:2], records)
        except HTTPError as e:
            log_model_failure(e)
            raise

    def _pass(self, rows: int, fn: Callable, *args):
        """One forward pass outside the batcher (an unbatched model, a request that
        fills a pass alone), counted as the batcher counts its passes."""
        return self._counted(lambda: self._forward(rows, fn, args), lambda: rows)

    def _counted(self, run: Callable[[], tuple[float, object]], records: Callable[[], int]):
        """run() -> (when it started, its result), counted in the model's metrics."""
        queued = time.monotonic()
        self.stats.pending(1)
        try:
            started, result = run()
        finally:
            self.stats.pending(-1)
        self.stats.waited(queued, started)
        self.stats.ran(records())
        return result

    def _forward(self, rows: int, fn: Callable, args: tuple) -> tuple[float, object]:
        """fn(*args), a forward pass of `rows` records, and when it started: on the
        inference thread, or, when the last pass of about as many rows (the same bit
        length) took less than inline_pass_s, right here on the loop's thread.

        A hand-off to the inference thread and back costs two thread switches and the
        GIL passing twice each way; on one core that was more than a small model's whole
        forward pass (docs/performance.md: +30 % req/s at batch 1 and 256 inline). The
        loop is held meanwhile, so a pass runs inline only while (a) passes of its size
        are measured short, (b) the loop has polled its sockets within INLINE_POLL_S
        (else this pass goes to the thread, and the loop polls while it runs: /ping is
        never kept waiting behind a run of inline passes), and (c) no other thread
        holds the model (a stream_fn session's step): the loop never blocks on it."""
        bucket = rows.bit_length()
        took = self._pass_s.get(bucket)
        if (took is not None and took < self.inline_pass_s and time.monotonic() - self._polled.at < INLINE_POLL_S
                and time.monotonic() >= self._no_inline_until.get(bucket, 0.0) and self.model_lock.acquire(False)):
            try:
                started = time.monotonic()
                try:
                    # On the main greenlet: torch's errors crash any other (engine/runtime/main_lane.py).
                    return started, main_lane.call(fn, *args)
                finally:
                    held = time.monotonic() - started
                    self._pass_s[bucket] = held
                    if held < self.inline_pass_s:
                        self._long_inline[bucket] = 0
                    elif self._long_inline.get(bucket, 0) + 1 < INLINE_STRIKES:
                        self._long_inline[bucket] = self._long_inline.get(bucket, 0) + 1
                    else:
                        # Short in CPU on the thread, long by the clock here, time after time:
                        # it waits on something (threads it forked, I/O). Not inline for a
                        # while. (Once could be the host preempting this one pass.)
                        self._long_inline[bucket] = 0
                        self._no_inline_until[bucket] = started + held + INLINE_PAUSE_S
            finally:
                self.model_lock.release()
        started, result, self._pass_s[bucket] = self.call(_timed, fn, args)
        return started, result

    def _idle(self) -> bool:
        """No pass runs, none is queued and no delay asks to gather: a request may run alone."""
        return (self.max_delay_s <= 0 and not self._gate.locked() and self._held is None and self._waiting is None
                and not self._queue.qsize())

    def _pass_alone(self, inputs: Arrays, rows: int, form=None) -> Arrays:
        with self._gate:
            self.passes_run += 1
            try:
                return self._pass(rows, self._predict, inputs, None, form)
            except HTTPError as e:
                log_model_failure(e)
                raise

    def _batch_loop(self) -> None:
        while True:
            first = self._held if self._held is not None and not self._held.dropped else None
            self._held = None
            while first is None:
                first = self._take(self._queue.get())
            self._waiting = first  # (not idle: a full request read meanwhile queues behind it)
            try:
                with self._gate:  # a lone request's pass ends first; what queued meanwhile joins
                    self._waiting = None
                    self._gather_and_run(first)
            finally:
                self._waiting = None

    def _gather_and_run(self, first: Chunk) -> None:
        batch = self._next_batch(first)
        try:
            self._run(batch)
        except Exception:  # never let the batcher die: every waiter must get an answer
            log.exception("batcher failed")
            for item in batch:
                if not item.result.ready():
                    item.result.set_exception(ServerError("inference failed"))

    def _next_batch(self, first: Chunk) -> list[Chunk]:
        batch, rows, signature = [first], first.rows, first.signature
        deadline = time.monotonic() + self.max_delay_s
        # (A trial that ended meanwhile: the requests it left in the queue run alone too.)
        while rows < self.max_batch_size and not (self.trial and self.unsplittable):
            remaining = deadline - time.monotonic()
            try:
                item = self._take(self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait())
            except gevent.queue.Empty:
                break
            if item is None:
                continue
            if rows + item.rows > self.max_batch_size or item.signature != signature:
                self._held = item
                break
            batch.append(item)
            rows += item.rows
        return batch

    def _run(self, batch: list[Chunk]) -> None:
        batch = [item for item in batch if not item.dropped]  # (gone while the gate was waited for)
        if not batch:
            return
        self.passes_run += 1
        started = time.monotonic()
        for item in batch:
            self.stats.waited(item.queued, started)
        if len(batch) > 1:
            self.batched_passes += 1
            log.debug("pass of %d requests (%d rows); %d of %d passes batched so far",
                      len(batch), sum(item.rows for item in batch), self.batched_passes, self.passes_run)
        if len(batch) == 1:
            self._run_alone(batch[0])
            return
        arrays = {name: [item.inputs[name] for item in batch] for name in batch[0].inputs}
        form = batch[0].form  # (one form in a batch: it is part of the signature)
        rows = [item.rows for item in batch]
        try:
            _, outputs = self._forward(sum(rows), self._predict_parts, (arrays, form))
            # (A model's own prediction is cut where torch may raise: engine/runtime/main_lane.py.)
            parts = split_outputs(outputs, rows) if form is None else main_lane.call(batchable.split, outputs, rows)
        except batchable.Unsplittable as e:
            # Not a request's fault, nor a pass's: the model's answers have no batch
            # dimension. Said once; from now on its requests run alone.
            log.warning("the model's prediction for a pass of %d requests cannot be cut back into them (%s): "
                        "from now on each request runs alone. A predict_fn that batches returns a tensor or "
                        "array (or a tuple, list or dict of them) with one row per record", len(batch), e)
            self.unsplittable = True
            for item in batch:
                self._run_alone(item)
            return
        except Exception as e:  # one request's input may have broken the pass: find it
            log.warning("batched pass of %d requests failed (%s); running them one by one", len(batch), e)
            for item in batch:
                self._run_alone(item)
            if self.trial and all(item.result.successful() for item in batch):
                self.trial.end(self, f"a pass of {len(batch)} requests failed where each of them alone did not")
            return
        if self.trial and not self.trial.check(self, batch, parts):
            return
        self.stats.ran(sum(item.rows for item in batch))
        for item, part in zip(batch, parts):
            item.result.set(part)

    def _predict_parts(self, parts: dict[str, list[np.ndarray]], form=None) -> Arrays:
        # Concatenated on the inference thread: the event loop never pays for a large
        # batch's copy, and a staging buffer is only ever touched by model code.
        return self._predict({name: self._stage(name, arrays) for name, arrays in parts.items()}, None, form)

    def _run_alone(self, item: Chunk) -> None:
        if item.dropped:  # (gone while its batch's pass ran)
            return
        try:
            _, outputs = self._forward(item.rows, self._predict, (item.inputs, None, item.form))
            self.stats.ran(item.rows)
            item.result.set(outputs)
        except HTTPError as e:
            log_model_failure(e)
            item.result.set_exception(e)


# Inline passes (Runner._forward) run only while the event loop has polled its sockets
# within this many seconds: a run of them never keeps /ping waiting longer.
INLINE_POLL_S = 0.010
# A size whose inline passes took longer than the limit INLINE_STRIKES times in a row
# goes to the thread for INLINE_PAUSE_S.
INLINE_STRIKES = 3
INLINE_PAUSE_S = 10.0


def _holding(lock, fn, args):
    with lock:
        return fn(*args)


def _guarded(predict: Callable[[Arrays], Arrays]) -> Callable[[Arrays], Arrays]:
    """The model's own exceptions become a 500 that carries their message (and the
    exception as its cause, for log_model_failure). Not logged here: a batched pass that
    fails is run again request by request, and only those answers are final."""

    def run(inputs: Arrays, context=None, form=None) -> Arrays:
        # (predict takes a context and a form only when a request's are given.)
        if form is not None:
            return _named_failure(predict, (inputs, context, form))
        return _named_failure(predict, (inputs,) if context is None else (inputs, context))

    return run


def _named_failure(fn: Callable, args: tuple):
    """fn(*args), the model's own exceptions a 500 that carries their message: for the
    batcher's passes (_guarded) and a hook's passes outside it (call_pass)."""
    with Named500("model failed"):
        return fn(*args)


def log_model_failure(error: HTTPError) -> None:
    """One ERROR record, with the model's own traceback, for a request the model failed:
    the traceback of the code that raised, not of the machinery that carried it back."""
    if error.status >= 500 and error.__cause__ is not None and not error.logged:
        cause = error.__cause__
        log.error("%s: %s: %s", error.message.split(":")[0], type(cause).__name__, cause,
                  exc_info=user_frames_first(cause))
        error.logged = True


def _timed(fn, args):
    """When fn started (after its wait for the inference thread), its result, and the
    CPU seconds it took on this thread: what it would hold the loop's thread for if it
    ran there. (Not the wall time: on a core the loop keeps busy, the inference thread's
    passes are preempted by the loop, and measured by the clock they would look long,
    and stay on this thread, for as long as that load lasts.)"""
    started = time.monotonic()
    cpu = time.thread_time()
    result = fn(*args)
    return started, result, time.thread_time() - cpu

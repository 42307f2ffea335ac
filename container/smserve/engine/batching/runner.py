"""Feeds the model from one real OS thread, batching requests that arrive together.

HTTP I/O runs in gevent greenlets; a forward pass would stall them all, so model code
runs on the inference thread (engine/runtime/threads.py), or inline on the loop's own thread
where engine/runtime/main_lane.py allows it. Requests queue up for the batcher greenlet,
whose next pass takes as many as fit in the model's max batch size, concatenated along
dimension 0; one that fills a pass by itself and finds the model idle goes straight to
a pass of its own.

A pass runs in one of three ways: `_run_pass` runs any forward pass, inline or on the
thread; `_unbatched` counts and logs a pass outside the batcher (a request run whole
by `_whole`, a hook's pass by `call_pass`); `_run_batch` runs the batcher's passes.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterator

import gevent
import numpy as np
from gevent import monkey
from gevent.lock import Semaphore

from smserve import metrics
from smserve.core.reply import is_stream
from smserve.engine.batching import batchable
from smserve.engine.batching import plan as batch_plan
from smserve.engine.batching.passes import (Arrays, Chunk, ChunkQueue, concatenate, cut, pass_rows, records_in, rows_of,
                                            split_outputs)
from smserve.engine.runtime import main_lane
from smserve.engine.runtime.main_lane import InlinePasses, poll_clock, timed, yield_cpu_to_the_loop
from smserve.engine.runtime.threads import ModelThread
from smserve.errors import HTTPError, Named500, ServerError, user_frames_first

log = logging.getLogger(__name__)

# (input name, the requests' arrays) -> one array, concatenated along dimension 0.
Stage = Callable[[str, list[np.ndarray]], np.ndarray]
# A real lock: model code runs on real threads, which must block on it without the hub.
_RealLock = monkey.get_original("threading", "Lock")
_QUEUED = object()  # Runner._outside_batcher's answer for a request that goes to the batcher


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
        # Which passes run on the event loop's own thread (start: none until told).
        self.inline = InlinePasses()
        self._polled = poll_clock()
        # A request the batcher has taken and is waiting to run (for the gate): the
        # model is not idle meanwhile, though the queue is empty.
        self._waiting: Chunk | None = None
        self._predict: Callable[[Arrays], Arrays] | None = None
        self._stage: Stage = concatenate
        self._queue = ChunkQueue()
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
        pass measured shorter than this runs on the loop's thread (0: never;
        engine/runtime/main_lane.py)."""
        self.inline.limit_s = inline_pass_s
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

    # ------------------------------------------------------------ requests

    def infer(self, inputs: Arrays, context=None, form: batchable.Form | None = None) -> Arrays:
        """Named arrays in, named arrays out, batched with whatever else is waiting.
        context: the request's, for a predict_fn that takes one; only an unbatched
        model's pass is one request's, so a batched pass gets None. form: the leaves are
        what a model's input_fn returned (engine/batching/batchable.py), and what comes back is
        this request's part of the model's prediction (or its named arrays)."""
        if (self.unsplittable and (form is not None or self.trial)) or self._untried_cut(inputs):
            # The model's predictions could not be cut back into requests: each runs alone.
            return self._whole(inputs, context, form)
        outputs = self._outside_batcher(inputs, context, form)
        if outputs is not _QUEUED:
            return outputs
        results = list(self._through_batcher(inputs, form))
        if len(results) == 1:
            return results[0]
        if any(is_stream(r) for r in results):
            return self._whole_after_streams(results, inputs, context, form)
        if form is not None:
            try:
                return main_lane.call(batchable.join, results, pass_rows(rows_of(inputs), self.max_batch_size))
            except batchable.Unsplittable as e:  # its passes' answers are no request's: it runs whole
                log.warning("the model's answers to the %d passes of one request cannot be joined (%s): it runs "
                            "again as one pass", len(results), e)
                return self._whole(inputs, context, form)
        return {name: np.concatenate([r[name] for r in results]) for name in results[0]}

    def infer_by_pass(self, inputs: Arrays, context=None) -> Iterator[Arrays]:
        """The outputs of each forward pass, in order, as each pass ends. A request
        bigger than the model's max batch size runs as several passes, all queued at
        once so they follow each other without a gap."""
        outputs = self._outside_batcher(inputs, context)
        if outputs is not _QUEUED:
            yield outputs
            return
        passes = self._through_batcher(inputs)
        first = next(passes)
        if is_stream(first):
            yield self._whole_after_streams([first, *passes], inputs, context)
            return
        yield first
        yield from passes

    def passes(self, inputs: Arrays) -> int:
        if self.max_batch_size <= 0 or not inputs or (self.trial and self.unsplittable) or self._untried_cut(inputs):
            return 1
        return max(1, -(-rows_of(inputs) // self.max_batch_size))

    def call_pass(self, fn: Callable, *args, records: Callable[[], int]):
        """fn on the inference thread (never inline: a user's hooks) as one pass outside
        the batcher. records(): how many records the pass held, asked once it ended well."""
        return self._unbatched(lambda: self.call(timed, _named_failure, (fn, args))[:2], records)

    def _untried_cut(self, inputs: Arrays) -> bool:
        """A request bigger than a pass while batching is on trial and no pass has
        vouched for it yet: it runs whole, as in the containers, since its passes'
        answers joined may not be its answer (one number a pass, say)."""
        return (self.trial is not None and not self.trial.tried and self.max_batch_size > 0 and bool(inputs)
                and rows_of(inputs) > self.max_batch_size)

    def _outside_batcher(self, inputs: Arrays, context, form=None):
        """The outputs of a request that runs as one pass of its own: batching is off, or
        it fills a pass and finds the model idle. _QUEUED when it goes to the batcher."""
        if self._predict is None:
            raise ServerError("model is not loaded")
        if self.max_batch_size <= 0 or not inputs:
            return self._whole(inputs, context, form)
        rows = rows_of(inputs)
        if rows == self.max_batch_size and self._idle() and not self._polled.others_ready():
            # A request that fills a pass by itself, with no pass to wait for and no other
            # request about to be read: nothing can join it, so it skips the batcher's
            # queue and its hand-offs. A smaller one is queued even when the model is
            # idle, so requests read in the same turn of the loop join it; a full one is
            # queued when other greenlets are ready, so their decodes run first and the
            # passes back to back (docs/performance.md).
            with self._gate:
                self.passes_run += 1
                return self._whole(inputs, None, form, rows)
        return _QUEUED

    def _idle(self) -> bool:
        """No pass runs, none is queued and no delay asks to gather: a request may run alone."""
        return self.max_delay_s <= 0 and not self._gate.locked() and self._waiting is None and self._queue.empty()

    def _through_batcher(self, inputs: Arrays, form=None) -> Iterator[Arrays]:
        """The outputs of each of the request's passes, in order, as the batcher runs
        them (passes.ChunkQueue: its chunks take turns with other requests')."""
        # (A model's own tensors are sliced where torch may raise: engine/runtime/main_lane.py.)
        size = self.max_batch_size
        chunks = cut(inputs, size, form) if form is None else main_lane.call(cut, inputs, size, form)
        self.stats.pending(1)
        try:
            yield from self._queue.answers(chunks)
        finally:
            self.stats.pending(-1)

    def _whole_after_streams(self, results: list, inputs: Arrays, context, form=None):
        """The model answered the passes of a request bigger than the max batch size with
        iterators (a predict_fn that streams, found out on this request): one stream
        cannot be made of several, so they are closed unread and the request runs as one
        call on all its records, as every request does once the model is known to
        stream (hooks.streams: the hooks' path, never batched)."""
        for result in results:
            if is_stream(result) and hasattr(result, "close"):
                self.call(result.close)
        return self._whole(inputs, context, form)

    # ------------------------------------------------------------ passes

    def _whole(self, inputs: Arrays, context, form=None, rows: int | None = None):
        """The request whole, as one pass outside the batcher (rows: its records, when
        counted already)."""
        predict = self._predict
        if predict is None:
            raise ServerError("model is not loaded")
        rows = records_in(inputs) if rows is None else rows
        return self._unbatched(lambda: self._run_pass(rows, predict, (inputs, context, form)), lambda: rows)

    def _unbatched(self, run: Callable[[], tuple[float, object]], records: Callable[[], int]):
        """run() -> (when it started, its result): a pass outside the batcher, counted in
        the model's metrics as the batcher counts its passes, its failure logged."""
        try:
            queued = time.monotonic()
            self.stats.pending(1)
            try:
                started, result = run()
            finally:
                self.stats.pending(-1)
            self.stats.waited(queued, started)
            self.stats.ran(records())
            return result
        except HTTPError as e:
            log_model_failure(e)
            raise

    def _run_pass(self, rows: int, fn: Callable, args: tuple) -> tuple[float, object]:
        """fn(*args), a forward pass of `rows` records, and when it started: inline on the
        loop's thread where engine/runtime/main_lane.py admits it and no other thread holds
        the model (the loop never blocks on it), else on the inference thread."""
        if self.inline.admits(rows) and self.model_lock.acquire(False):
            try:
                return self.inline.run(rows, fn, args)
            finally:
                self.model_lock.release()
        started, result, cpu = self.call(timed, fn, args)
        self.inline.measured(rows, cpu)
        return started, result

    # ------------------------------------------------------------ the batcher

    def _batch_loop(self) -> None:
        # (One batch a call: nothing of the last batch stays referenced while the loop
        # waits for the next, so a request's values go with it.)
        while True:
            self._next_batch(self._queue.first())

    def _next_batch(self, first: Chunk) -> None:
        self._waiting = first  # (not idle: a full request read meanwhile queues behind it)
        try:
            with self._gate:  # a lone request's pass ends first; what queued meanwhile joins
                self._waiting = None
                self._gather_and_run(first)
        finally:
            self._waiting = None

    def _gather_and_run(self, first: Chunk) -> None:
        # (A trial that ended meanwhile: the requests it left in the queue run alone too.)
        batch = self._queue.gather(first, self.max_batch_size, self.max_delay_s,
                                   lambda: bool(self.trial and self.unsplittable))
        try:
            self._run_batch(batch)
        except Exception:  # never let the batcher die: every waiter must get an answer
            log.exception("batcher failed")
            for item in batch:
                if not item.result.ready():
                    item.result.set_exception(ServerError("inference failed"))

    def _run_batch(self, batch: list[Chunk]) -> None:
        batch = [item for item in batch if not item.dropped]  # (gone while the gate was waited for)
        if not batch:
            return
        self.passes_run += 1
        started = time.monotonic()
        for item in batch:
            self.stats.waited(item.queued, started)
        if len(batch) == 1:
            self._answer_alone(batch[0])
            return
        self.batched_passes += 1
        log.debug("pass of %d requests (%d rows); %d of %d passes batched so far",
                  len(batch), sum(item.rows for item in batch), self.batched_passes, self.passes_run)
        arrays = {name: [item.inputs[name] for item in batch] for name in batch[0].inputs}
        form = batch[0].form  # (one form in a batch: it is part of the signature)
        rows = [item.rows for item in batch]
        try:
            _, outputs = self._run_pass(sum(rows), self._predict_parts, (arrays, form))
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
                self._answer_alone(item)
            return
        except Exception as e:  # one request's input may have broken the pass: find it
            log.warning("batched pass of %d requests failed (%s); running them one by one", len(batch), e)
            for item in batch:
                self._answer_alone(item)
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

    def _answer_alone(self, item: Chunk) -> None:
        """One of the batcher's chunks as a pass of its own, its answer set."""
        if item.dropped:  # (gone while its batch's pass ran)
            return
        try:
            _, outputs = self._run_pass(item.rows, self._predict, (item.inputs, None, item.form))
            self.stats.ran(item.rows)
            item.result.set(outputs)
        except HTTPError as e:
            log_model_failure(e)
            item.result.set_exception(e)


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


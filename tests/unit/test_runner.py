"""The batching runner: requests that arrive together share one forward pass."""

import gc
import os
import threading
import time
import weakref

import gevent
import gevent.socket
import numpy as np
import pytest

from smserve.errors import BadRequest, ServerError
from smserve.engine.batching.runner import Runner


class RecordingModel:
    def __init__(self, delay=0.05):
        self.batches = []
        self.threads = set()
        self.delay = delay

    def __call__(self, inputs):
        self.threads.add(threading.get_ident())
        x = inputs["x"]
        self.batches.append(len(x))
        time.sleep(self.delay)  # a real thread: the event loop keeps running
        if np.any(x < 0):
            raise ValueError("negative input")
        return {"y": x * 2}


def run_concurrently(runner, requests):
    jobs = [gevent.spawn(runner.infer, {"x": r}) for r in requests]
    gevent.joinall(jobs)
    return jobs


def test_concurrent_requests_are_batched_and_split_back_in_order():
    model = RecordingModel()
    runner = Runner()
    runner.start(model, max_batch_size=64)
    requests = [np.full((i + 1, 3), i, dtype=np.float32) for i in range(8)]
    jobs = run_concurrently(runner, requests)
    for request, job in zip(requests, jobs):
        np.testing.assert_array_equal(job.value["y"], request * 2)
    assert sum(model.batches) == sum(len(r) for r in requests)
    assert max(model.batches) > 8, model.batches  # several requests shared a pass
    assert threading.get_ident() not in model.threads  # never on the event loop's thread


def test_a_request_larger_than_the_max_batch_runs_in_chunks():
    model = RecordingModel(delay=0)
    runner = Runner()
    runner.start(model, max_batch_size=16)
    x = np.arange(50 * 2, dtype=np.float32).reshape(50, 2)
    out = runner.infer({"x": x})
    np.testing.assert_array_equal(out["y"], x * 2)
    assert model.batches == [16, 16, 16, 2]


def test_requests_of_different_shapes_are_not_mixed():
    model = RecordingModel()
    runner = Runner()
    runner.start(model, max_batch_size=64)
    jobs = run_concurrently(runner, [np.ones((2, 3), np.float32), np.ones((2, 4), np.float32), np.ones((2, 3), np.float32)])
    assert [j.value["y"].shape for j in jobs] == [(2, 3), (2, 4), (2, 3)]


def test_one_failing_request_does_not_fail_its_batch_mates():
    model = RecordingModel()
    runner = Runner()
    runner.start(model, max_batch_size=64)
    requests = [np.ones((2, 3), np.float32), -np.ones((2, 3), np.float32), np.ones((1, 3), np.float32)]
    jobs = run_concurrently(runner, requests)
    assert jobs[0].successful() and jobs[2].successful()
    assert isinstance(jobs[1].exception, ServerError)
    assert "negative input" in jobs[1].exception.message


def test_inputs_that_disagree_on_batch_size_are_a_bad_request():
    runner = Runner()
    runner.start(lambda inputs: inputs, max_batch_size=8)
    with pytest.raises(BadRequest):
        runner.infer({"a": np.ones((2, 1)), "b": np.ones((3, 1))})


def test_a_model_without_batching_gets_each_request_whole():
    model = RecordingModel(delay=0)
    runner = Runner()
    runner.start(model, max_batch_size=0)
    out = runner.infer({"x": np.ones((300, 2), np.float32)})
    assert out["y"].shape == (300, 2) and model.batches == [300]


def test_model_code_runs_below_the_event_loops_cpu_priority():
    """The inference thread (and the threads it starts, such as torch's intra-op pool)
    runs at INFERENCE_NICE above the loop's nice value, so /ping and request I/O get the
    CPU first when forward passes keep a core busy."""
    import os

    from smserve.engine.runtime.main_lane import INFERENCE_NICE

    loop_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    runner = Runner()

    def niceness():
        own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        seen = []
        child = threading.Thread(target=lambda: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        child.start()
        child.join()
        return own, seen[0]

    own, started = runner.call(niceness)
    expected = min(19, loop_nice + INFERENCE_NICE)
    assert (own, started) == (expected, expected)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == loop_nice


# ---------------------------------------------------------------- passes on the loop's thread


class ThreadModel:
    """Says which thread ran each pass; each pass keeps its thread's CPU busy for at
    least `delay` seconds (a pass is measured in the CPU time it takes)."""

    def __init__(self, delay=0.0):
        self.threads = []
        self.delay = delay

    def __call__(self, inputs):
        self.threads.append(threading.get_ident())
        busy_until = time.thread_time() + self.delay
        while time.thread_time() < busy_until:
            pass
        return {"y": inputs["x"] + 1}


def _fresh_loop_turn():
    gevent.sleep(0.001)  # the loop polls its sockets: as between requests


@pytest.mark.parametrize("max_batch", [0, 4])
def test_a_pass_measured_short_runs_on_the_loops_thread_the_first_of_its_size_does_not(max_batch):
    model = ThreadModel()
    runner = Runner()
    runner.start(model, max_batch_size=max_batch, inline_pass_s=0.5)
    here = threading.get_ident()
    x = np.zeros((4, 2), np.float32)
    for _ in range(3):
        _fresh_loop_turn()
        np.testing.assert_array_equal(runner.infer({"x": x})["y"], x + 1)
    assert model.threads[0] != here  # not measured yet: the inference thread
    assert model.threads[1:] == [here, here]
    # Another size (another bit length of rows) is measured on its own first.
    _fresh_loop_turn()
    runner.infer({"x": np.zeros((1, 2), np.float32)})
    assert model.threads[3] != here


def test_a_pass_measured_long_stays_on_the_inference_thread():
    model = ThreadModel(delay=0.02)
    runner = Runner()
    runner.start(model, max_batch_size=0, inline_pass_s=0.01)
    for _ in range(3):
        _fresh_loop_turn()
        runner.infer({"x": np.zeros((2, 2), np.float32)})
    assert threading.get_ident() not in model.threads


def test_without_an_inline_limit_every_pass_goes_to_the_inference_thread():
    model = ThreadModel()
    runner = Runner()
    runner.start(model, max_batch_size=0)
    for _ in range(3):
        _fresh_loop_turn()
        runner.infer({"x": np.zeros((2, 2), np.float32)})
    assert threading.get_ident() not in model.threads


def test_a_loop_that_has_not_polled_lately_hands_the_pass_to_the_thread():
    """A run of inline passes must not keep /ping waiting: once the loop has gone
    INLINE_POLL_S without polling its sockets, the next pass goes to the thread (and
    the loop polls while it runs)."""
    from smserve.engine.runtime import main_lane as inline_module

    model = ThreadModel()
    runner = Runner()
    runner.start(model, max_batch_size=0, inline_pass_s=0.5)
    x = np.zeros((2, 2), np.float32)
    runner.infer({"x": x})  # measured
    _fresh_loop_turn()
    runner.infer({"x": x})
    assert model.threads[-1] == threading.get_ident()
    busy_until = time.monotonic() + 2 * inline_module.INLINE_POLL_S
    while time.monotonic() < busy_until:  # this greenlet's own work, without a yield
        pass
    runner.infer({"x": x})
    assert model.threads[-1] != threading.get_ident()


@pytest.mark.parametrize("together", [True, False])
def test_full_requests_read_in_one_turn_run_their_passes_back_to_back(together, monkeypatch):
    """Full requests whose bytes came in with others' (the loop's poll found them all
    ready) queue, so the passes run one after another once all are read; a full request
    with no other ready goes straight to its pass, as before."""
    if not hasattr(gevent.get_hub().loop, "pendingcnt"):
        pytest.skip("this gevent loop (libuv) does not count its ready watchers: every full request goes straight on")
    events = []

    def model(inputs):
        events.append("pass")
        return {"y": inputs["x"]}

    from smserve.engine.runtime import main_lane as inline_module

    # Every pass inline, however late a loaded machine runs this after the poll: a pass
    # on the thread would let a waiting greenlet's "answered" in between passes.
    monkeypatch.setattr(inline_module, "INLINE_POLL_S", 60.0)
    runner = Runner()
    runner.start(model, max_batch_size=4, inline_pass_s=60.0)
    x = np.zeros((4, 2), np.float32)
    runner.infer({"x": x})  # the size measured: later passes run inline
    events.clear()
    pipes = [os.pipe() for _ in range(3)]

    def request(read_end):
        gevent.socket.wait_read(read_end)
        os.read(read_end, 1)
        events.append("read")
        runner.infer({"x": x})
        events.append("answered")

    jobs = [gevent.spawn(request, r) for r, _ in pipes]
    gevent.sleep(0.01)  # each waits for its bytes
    for _, w in pipes:
        os.write(w, b"x")
        if not together:
            gevent.sleep(0.01)  # one at a time: each alone in its turn of the loop
    gevent.joinall(jobs, raise_error=True)
    for r, w in pipes:
        os.close(r)
        os.close(w)
    if together:
        assert events == ["read"] * 3 + ["pass"] * 3 + ["answered"] * 3
    else:
        assert events == ["read", "pass", "answered"] * 3


def test_a_model_held_by_another_thread_is_waited_for_on_the_inference_thread_not_the_loop():
    model = ThreadModel()
    runner = Runner()
    runner.start(model, max_batch_size=0, inline_pass_s=0.5)
    x = np.zeros((2, 2), np.float32)
    runner.infer({"x": x})
    holding, release = threading.Event(), threading.Event()

    def session_step():  # a stream_fn session's step, on a thread of its own
        with runner.model_lock:
            holding.set()
            release.wait(5)

    other = threading.Thread(target=session_step)
    other.start()
    holding.wait(5)
    ticks = []
    ticker = gevent.spawn(lambda: [ticks.append(gevent.sleep(0.005)) for _ in range(10)])
    gevent.spawn_later(0.1, release.set)
    _fresh_loop_turn()
    out = runner.infer({"x": x})
    other.join()
    ticker.join()
    np.testing.assert_array_equal(out["y"], x + 1)
    assert model.threads[-1] != threading.get_ident()
    assert len(ticks) == 10  # the loop kept running while the pass waited for the model


def test_requests_that_each_fill_a_pass_get_their_own_answers():
    model = RecordingModel(delay=0.005)
    runner = Runner()
    runner.start(model, max_batch_size=8, inline_pass_s=0.5)
    requests = [np.full((8, 3), i, dtype=np.float32) for i in range(6)]
    jobs = run_concurrently(runner, requests)
    for request, job in zip(requests, jobs):
        np.testing.assert_array_equal(job.value["y"], request * 2)
    assert model.batches == [8] * 6


def test_a_pass_short_in_cpu_but_long_by_the_clock_is_kept_off_the_loop_after_a_few_tries():
    """A pass that waits (on threads it forked, on I/O) looks short in CPU time on the
    thread; once it has held the loop past the limit, its size stays on the thread."""
    threads = []

    def waits(inputs):
        threads.append(threading.get_ident())
        time.sleep(0.03)  # a wait, not CPU
        return {"y": inputs["x"]}

    from smserve.engine.runtime import main_lane as inline_module

    runner = Runner()
    runner.start(waits, max_batch_size=0, inline_pass_s=0.01)
    x = np.zeros((2, 2), np.float32)
    for _ in range(2 * inline_module.INLINE_STRIKES + 3):
        _fresh_loop_turn()
        runner.infer({"x": x})
    here = threading.get_ident()
    # Short in CPU on the thread, so tried inline; long there each time: after
    # INLINE_STRIKES of them in a row (one could be the host's preemption), kept off.
    assert threads.count(here) == inline_module.INLINE_STRIKES
    assert here not in threads[2 * inline_module.INLINE_STRIKES:]


def test_a_request_taken_by_the_batcher_is_not_overtaken_by_a_full_one_read_after_it():
    """While the batcher waits for a lone full pass to end, the request it has taken is
    in no queue: a full request read meanwhile must queue behind it, not take the model
    first because the queue looks empty."""
    order = []

    def model(inputs):
        order.append(int(inputs["x"][0, 0]))
        return {"y": inputs["x"]}

    runner = Runner()
    runner.start(model, max_batch_size=4)
    hold = runner.model_lock
    hold.acquire()  # the first full pass waits on the thread, holding the gate
    first = gevent.spawn(lambda: (runner.infer({"x": np.full((4, 1), 1, np.float32)}),
                                  runner.infer({"x": np.full((4, 1), 3, np.float32)})))
    gevent.sleep(0.01)
    small = gevent.spawn(runner.infer, {"x": np.full((1, 1), 2, np.float32)})
    gevent.sleep(0.01)  # the batcher has taken the small one and waits for the gate
    hold.release()
    gevent.joinall([first, small], raise_error=True)
    assert order == [1, 2, 3]


class StreamingModel:
    """A predict_fn that answers with an iterator of its rows; records each call's rows
    and which iterators were closed unread."""

    def __init__(self):
        self.calls = []
        self.closed = []

    def __call__(self, inputs, context=None):
        self.calls.append(len(inputs["x"]))
        return _Rows(inputs["x"].tolist(), lambda call=len(self.calls): self.closed.append(call))


class _Rows:
    def __init__(self, rows, on_close):
        self.rows, self.close = iter(rows), on_close

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.rows)


def test_a_request_bigger_than_the_max_batch_that_streams_is_one_call_on_all_its_records():
    """Each pass answered with an iterator: they are closed, and the request runs whole."""
    model = StreamingModel()
    runner = Runner()
    runner.start(model, max_batch_size=16)
    x = np.arange(50 * 2, dtype=np.float32).reshape(50, 2)
    out = runner.infer({"x": x})
    assert list(out) == x.tolist()
    assert model.calls == [16, 16, 16, 2, 50]
    assert sorted(model.closed) == [1, 2, 3, 4]  # the passes' iterators, unread


def test_pass_by_pass_a_request_that_streams_comes_as_its_one_iterator():
    model = StreamingModel()
    runner = Runner()
    runner.start(model, max_batch_size=16)
    x = np.arange(20 * 2, dtype=np.float32).reshape(20, 2)
    passes = list(runner.infer_by_pass({"x": x}))
    assert len(passes) == 1 and list(passes[0]) == x.tolist()
    assert model.calls == [16, 4, 20] and sorted(model.closed) == [1, 2]


def test_passes_of_different_requests_take_turns_a_small_request_waits_behind_a_pass_not_a_whole_request():
    """A request of many passes queues its next chunk only when the batcher takes the one
    before: a request that arrives meanwhile runs within two passes of its arrival, not
    after all of them, and the big request's passes still follow each other."""
    model = RecordingModel(delay=0.005)
    runner = Runner()
    runner.start(model, max_batch_size=4)
    big = gevent.spawn(runner.infer, {"x": np.zeros((80, 3), np.float32)})  # 20 passes of 4
    while not model.batches:  # its first pass has started
        gevent.sleep(0.001)
    arrived = []

    def small_request():
        arrived.append(len(model.batches))  # passes started when it reaches the runner
        return runner.infer({"x": np.ones((1, 3), np.float32)})

    small = gevent.spawn(small_request)
    gevent.joinall([big, small], raise_error=True)
    np.testing.assert_array_equal(small.value["y"], np.full((1, 3), 2, np.float32))
    np.testing.assert_array_equal(big.value["y"], np.zeros((80, 3), np.float32))
    assert arrived[0] < 15, (arrived, model.batches)  # it came while most of the big request was still to run
    assert model.batches.index(1) <= arrived[0] + 2, (arrived, model.batches)
    assert sorted(model.batches) == [1] + [4] * 20


class HeldModel:
    """Its first pass waits until the test lets it go (a real thread blocks on it)."""

    def __init__(self):
        self.batches = []
        self.release = threading.Event()

    def __call__(self, inputs):
        self.batches.append(len(inputs["x"]))
        if len(self.batches) == 1:
            self.release.wait(10)
        return {"y": inputs["x"] * 2}


@pytest.mark.parametrize("max_batch", [0, 1, 8])
def test_a_request_past_its_deadline_leaves_the_queue_and_lets_its_inputs_go_before_it_costs_a_pass(max_batch):
    """The answer's deadline interrupts a request still queued (for the batcher, or for the
    inference thread): no pass is run for it, and its inputs are freed while the pass it
    waited behind still runs."""
    model = HeldModel()
    runner = Runner()
    runner.start(model, max_batch_size=max_batch)
    first = gevent.spawn(runner.infer, {"x": np.zeros((1, 3), np.float32)})
    for _ in range(1000):
        if model.batches:
            break
        gevent.sleep(0.005)
    inputs = []

    def late(i):
        x = np.full((1, 3), i, np.float32)
        inputs.append(weakref.ref(x))
        try:
            with gevent.Timeout(0.01):
                runner.infer({"x": x})
        except gevent.Timeout:
            return "late"

    lates = [gevent.spawn(late, i) for i in range(6)]
    gevent.joinall(lates, raise_error=True)
    assert [job.value for job in lates] == ["late"] * 6
    gc.collect()
    assert [ref() for ref in inputs] == [None] * 6  # freed while the first pass still runs
    model.release.set()
    first.get(timeout=10)
    after = runner.infer({"x": np.ones((1, 3), np.float32)})
    np.testing.assert_array_equal(after["y"], np.full((1, 3), 2, np.float32))
    assert model.batches == [1, 1], model.batches  # the first request's pass and the one after: none for the late


def test_an_answered_batch_leaves_nothing_referenced_while_the_batcher_waits():
    """A request's outputs are its own once answered: the batcher, waiting for the next
    request, holds nothing of the last batch (a value mapped from shared memory, say,
    would keep its file until some later request came)."""
    outputs = []

    class Model:
        def __call__(self, inputs):
            y = inputs["x"] * 2
            outputs.append(weakref.ref(y))
            return {"y": y}

    runner = Runner()
    runner.start(Model(), max_batch_size=8)
    answers = [job.value for job in run_concurrently(runner, [np.ones((1, 3), np.float32)] * 3)]
    assert [a["y"].tolist() for a in answers] == [[[2.0] * 3]] * 3
    del answers
    gevent.sleep(0)  # the batcher is back in its wait
    gc.collect()
    assert outputs and [ref() for ref in outputs] == [None] * len(outputs)

"""The batching runner: requests that arrive together share one forward pass."""

import threading
import time

import gevent
import numpy as np
import pytest

from smserve.errors import BadRequest, ServerError
from smserve.engine.runner import Runner


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

    from smserve.engine import runner as runner_module

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
    expected = min(19, loop_nice + runner_module.INFERENCE_NICE)
    assert (own, started) == (expected, expected)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == loop_nice

"""The GPU input path on a CPU host: a batch is assembled in one staging buffer per
input (pinned on a GPU; ordinary memory here, the same logic), copied once, and split back."""

import threading

import gevent
import numpy as np
import pytest

from smserve.runner import Runner


class StagingRecorder:
    """A stage hook that concatenates, and says where and on what it ran."""

    def __init__(self):
        self.calls = []
        self.threads = set()

    def __call__(self, name, parts):
        self.threads.add(threading.get_ident())
        self.calls.append((name, [p.shape for p in parts]))
        return np.concatenate(parts)


def test_the_runner_assembles_a_batch_through_the_stage_hook_on_the_inference_thread():
    stage = StagingRecorder()
    seen = []

    def predict(inputs):
        seen.append({name: a.shape for name, a in inputs.items()})
        gevent.sleep(0)  # not a real yield (a real thread), but harmless
        return {"y": inputs["a"] + inputs["b"]}

    runner = Runner()
    runner.start(predict, max_batch_size=64, stage=stage)
    runner.pool.apply(lambda: gevent.sleep(0))  # the pool thread exists before the requests
    hold = runner.model_lock
    hold.acquire()  # the first request's pass waits, so the others queue and batch together
    try:
        jobs = [gevent.spawn(runner.infer, {"a": np.full((i + 1, 2), i, np.float32),
                                            "b": np.ones((i + 1, 2), np.float32)}) for i in range(4)]
        gevent.sleep(0.05)
    finally:
        hold.release()
    gevent.joinall(jobs)
    for i, job in enumerate(jobs):
        np.testing.assert_array_equal(job.value["y"], np.full((i + 1, 2), i + 1, np.float32))
    batched = [c for c in stage.calls if len(c[1]) > 1]
    assert batched, stage.calls
    assert {c[0] for c in batched} == {"a", "b"}
    assert threading.get_ident() not in stage.threads  # never on the event loop

"""What an input_fn returns goes through the batcher as decoded bodies do: cut into
passes of at most the max batch size, batched with other requests, its tensors moved to
the model's device; what cannot be batched runs alone. The worker's GPU is each thread's
current device. GPU-less: a `meta` device stands for the GPU, and torch.cuda.set_device
is recorded."""

from __future__ import annotations

import json
import logging
import threading

import gevent
import numpy as np
import pytest
import torch

from smserve.core.metadata import ModelMetadata, TensorSpec
from smserve.engine.batching import plan as batch_plan
from smserve.engine.batching import batchable
from smserve.engine.hooks.chain import HookChain
from smserve.engine.hooks.context import HookContexts
from smserve.engine.worker import loaded_model as model_module
from smserve.engine.hooks.script import Hooks
from smserve.engine.batching.runner import Runner
from smserve.engine.worker.served import ModelTraits
from smserve.protocols import TABLE
from smserve.protocols.message import Message
from smserve.settings import Settings


class Doubler(torch.nn.Module):
    def forward(self, x):
        return x * 2


def loaded(max_batch=8, device="cpu", **hooks) -> model_module.LoadedModel:
    metadata = ModelMetadata(max_batch_size=max_batch, inputs=(TensorSpec("x", "FP32", (3,)),),
                             outputs=(TensorSpec("y", "FP32", (3,)),))
    return model_module.LoadedModel(model=Doubler().eval(), metadata=metadata, hooks=Hooks(**hooks),
                                    device=torch.device(device))


def started(model, max_batch=8) -> Runner:
    runner = Runner()
    runner.start(model.predict, max_batch_size=max_batch, stage=model.stage)
    runner.call(lambda: None)  # the inference thread is up before any request
    return runner


def held_together(runner, requests):
    """Run each request's runner.infer while the model is held, so they queue up and batch."""
    runner.model_lock.acquire()
    try:
        jobs = [gevent.spawn(runner.infer, leaves, None, form) for form, leaves in requests]
        gevent.sleep(0.05)
    finally:
        runner.model_lock.release()
    gevent.joinall(jobs, raise_error=True)
    return [job.value for job in jobs]


def test_input_fn_tensors_of_several_requests_share_a_pass_and_each_gets_its_rows():
    passes = []

    def predict_fn(data, model):
        passes.append(tuple(data.shape))
        return model(data)

    model = loaded(predict_fn=predict_fn)
    runner = started(model)
    values = [torch.full((i + 1, 3), float(i)) for i in range(3)]
    answers = held_together(runner, [batchable.flatten(v, ("x",)) for v in values])
    for value, answer in zip(values, answers):
        np.testing.assert_array_equal(answer["y"], value.numpy() * 2)
    assert (6, 3) in passes, passes  # the three requests in one pass (after the first, alone)


def test_a_request_bigger_than_the_max_batch_runs_in_passes_of_at_most_it_and_is_joined_back():
    passes = []

    def predict_fn(data, model):
        passes.append(data.shape[0])
        return model(data), data.sum(dim=1)  # a tuple: each part joined on its own

    model = loaded(predict_fn=predict_fn, output_fn=lambda prediction, accept: b"")
    runner = started(model)
    value = torch.arange(60.0).view(20, 3)
    form, leaves = batchable.flatten(value, ("x",))
    doubled, sums = runner.infer(leaves, None, form)
    assert passes == [8, 8, 4]
    assert isinstance(doubled, torch.Tensor)  # output_fn reads the model's own value
    torch.testing.assert_close(doubled, value * 2)
    torch.testing.assert_close(sums, value.sum(dim=1))


def test_requests_whose_leaves_disagree_past_dimension_0_never_share_a_pass():
    shapes = []

    def predict_fn(data, model):
        shapes.append(tuple(data.shape))
        return data

    runner = started(loaded(predict_fn=predict_fn))
    requests = [batchable.flatten(torch.zeros(1, n), ("x",)) for n in (3, 4, 3, 4)]
    answers = held_together(runner, requests)
    assert [a["y"].shape for a in answers] == [(1, 3), (1, 4), (1, 3), (1, 4)]
    assert all(shape[1:] in ((3,), (4,)) for shape in shapes)


def test_a_prediction_with_no_batch_dimension_is_said_once_and_requests_then_run_alone(caplog):
    def predict_fn(data, model):
        return f"{data.shape[0]} rows"  # one answer for the whole pass: no rows to cut

    model = loaded(predict_fn=predict_fn, output_fn=lambda prediction, accept: b"")
    runner = started(model)
    requests = [batchable.flatten(torch.zeros(n, 3), ("x",)) for n in (1, 2, 3)]
    with caplog.at_level(logging.WARNING):
        answers = held_together(runner, requests)
        assert answers == ["1 rows", "2 rows", "3 rows"]
        assert runner.unsplittable
        later = held_together(runner, requests)
    assert later == ["1 rows", "2 rows", "3 rows"]
    warnings = [r for r in caplog.records if "cannot be cut back" in r.getMessage()]
    assert len(warnings) == 1


def test_a_cpu_tensor_from_input_fn_reaches_the_models_device():
    seen = []

    def predict_fn(data, model):
        seen.append((data["pixels"].device.type, type(data["mask"]).__name__))
        return torch.zeros(data["pixels"].shape[0], 2)

    model = loaded(device="meta", predict_fn=predict_fn)  # meta: a device that is not the CPU
    runner = started(model)
    value = {"pixels": torch.ones(2, 3), "mask": np.ones((2, 3), np.int64)}
    form, leaves = batchable.flatten(value)
    runner.infer(leaves, None, form)
    # The tensor moved; the numpy array predict_fn asked for stays what it was.
    assert seen == [("meta", "ndarray")]
    # A value that is no batch (runs alone) has its tensors moved too, inside containers.
    moved = model.on_device({"images": [torch.ones(3), torch.ones(4)], "note": "x"})
    assert [t.device.type for t in moved["images"]] == ["meta", "meta"] and moved["note"] == "x"


def on_a_thread(fn):
    """fn() on a thread of its own (as a codec thread runs hooks); what it returned."""
    out = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def test_the_workers_gpu_is_made_current_once_on_each_thread_that_runs_hooks(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append((threading.get_ident(), device)))
    model = loaded(device="cuda:1")

    def twice():
        model.bind_thread()
        model.bind_thread()
        return torch.get_num_threads()

    assert on_a_thread(twice) == 1  # hooks' own torch work: one intra-op thread a codec thread
    on_a_thread(twice)
    # Once per thread, though each asked twice.
    assert [device for _, device in calls] == [torch.device("cuda", 1)] * 2
    on_a_thread(loaded(device="cpu").bind_thread)  # no device to make current on the CPU
    assert len(calls) == 2


def test_the_inference_thread_takes_the_workers_gpu_before_the_model_loads(monkeypatch, example_model_dir):
    from smserve.engine.worker.server import ModelServer
    from smserve.settings import Settings

    order = []
    from smserve.engine.model import torch_model

    monkeypatch.setattr(torch_model, "choose_device", lambda preference, index: torch.device("cuda", index % 2))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: order.append(("set_device", device)))
    real_load = model_module.load_and_warm

    def load_on_cpu(model_dir, device, *args, **kwargs):
        order.append(("load", device))
        return real_load(model_dir, torch.device("cpu"), *args, **kwargs)

    monkeypatch.setattr(model_module, "load_and_warm", load_on_cpu)
    server = ModelServer(Settings(model_dir=str(example_model_dir)), worker_index=3, workers=4)
    server.load()
    assert server.status == "ready", server.error
    assert order == [("set_device", torch.device("cuda", 1)), ("load", torch.device("cuda", 1))]
    server.close()


@pytest.mark.parametrize("value", [[b"raw", b"bytes"], {"text": "hello"}, torch.tensor(1.0)])
def test_what_is_no_batch_runs_alone_whole(value):
    seen = []

    def predict_fn(data, model):
        seen.append(data)
        return torch.zeros(1, 3)

    model = loaded(predict_fn=predict_fn)
    runner = started(model)
    outputs = runner.call_pass(model.predict_value, value, None, records=lambda: 1)
    assert outputs["y"].shape == (1, 3)
    assert seen[0] is value or seen[0] == value or torch.equal(seen[0], value)


# ---------------------------------------------------------------- the answer's form, batched or not


class HookServer:
    """What the hooks protocol and the hook chain ask of a server, over a real
    model and runner, every hook run in the calling greenlet."""

    status = "ready"

    class pools:  # noqa: N801 - every step inline
        @staticmethod
        def offload(size, fn, *args):
            return fn(*args)

        @staticmethod
        def on_hooks(fn, *args):
            return fn(*args)

    def __init__(self, model, runner):
        self.model, self.runner, self.metadata = model, runner, model.metadata
        self.traits = ModelTraits(model.hooks, batched=runner.max_batch_size > 0)
        self.hook_contexts = HookContexts("/model", model.device)
        self.hook_chain = HookChain(model, runner, self.pools, self.hook_contexts)

    def check_ready(self):
        pass


FEATURES = b'{"features": [0.5, 1.5, -2.0]}'
# What a toolkit-style predict_fn returns for one request's 1-D features, no output_fn.
PREDICTIONS = {
    "number": lambda data, model: model(data.unsqueeze(0)).sum().item(),
    "numpy scalar": lambda data, model: model(data.unsqueeze(0)).sum().detach().numpy()[()],
    "0-d tensor": lambda data, model: model(data.unsqueeze(0)).sum(),
    "list": lambda data, model: model(data.unsqueeze(0))[0].tolist(),
    "dict": lambda data, model: {"y": model(data.unsqueeze(0))[0], "total": model(data.unsqueeze(0)).sum(dim=1)},
}


def json_features(body, content_type):
    return torch.tensor(json.loads(body)["features"], dtype=torch.float32)


def answers(predict_fn, max_batch: int, on_trial: bool, requests: int = 3) -> list:
    model = loaded(max_batch=0, input_fn=json_features, predict_fn=predict_fn)
    runner = Runner()
    runner.trial = batch_plan.Trial() if on_trial else None
    runner.start(model.predict, max_batch_size=max_batch, stage=model.stage)
    server = HookServer(model, runner)

    def ask():
        message = Message(body=FEATURES, content_type="application/json")
        return TABLE.answer(message, server, Settings()).body

    with runner._gate:  # held until every request but the one the batcher took waits: they share a pass
        jobs = [gevent.spawn(ask) for _ in range(requests)]
        for _ in range(10_000):
            if max_batch <= 0 or (runner._queue.qsize() == requests - 1 and runner._waiting is not None):
                break
            gevent.sleep(0)
    gevent.joinall(jobs, raise_error=True)
    # (After the trial: each request runs alone.)
    return [json.loads(job.value) for job in jobs] + [json.loads(ask())]


@pytest.mark.parametrize("kind", PREDICTIONS)
def test_an_input_fn_requests_answer_is_the_same_batched_on_trial_or_not_and_bare_as_the_toolkits(kind):
    predict_fn = PREDICTIONS[kind]
    unbatched = answers(predict_fn, 0, False)
    if kind == "dict":  # the built-in form of several outputs (docs/migrating.md), bare
        assert set(unbatched[0]) == {"y", "total"}
    else:
        prediction = predict_fn(json_features(FEATURES, "application/json"), loaded().model)
        # The toolkit's default output_fn: json.dumps of the value (a tensor's as a list), no {"predictions": ...}.
        assert unbatched[0] == pytest.approx(prediction.tolist() if hasattr(prediction, "tolist") else prediction)
    assert batch_plan.difference(answers(predict_fn, 8, True), unbatched) is None

"""Batching for a model without metadata.json (every script migrated from AWS's PyTorch
containers): SAGEMAKER_TS_BATCH_SIZE turns it on where the hooks allow, on trial; the
start log says why it is on or off; a trial pass whose answers differ from a request's
answer alone, or that fails where its requests alone do not, turns it off and every
request still gets its unbatched answer."""

from __future__ import annotations

import logging

import gevent
import numpy as np
import pytest
import torch

from smserve.core.metadata import ModelMetadata
from smserve.engine.batching import plan as batch_plan
from smserve.engine.batching import batchable
from smserve.engine.worker import loaded_model as model_module
from smserve.engine.hooks.script import Hooks
from smserve.engine.batching.runner import Runner
from smserve.settings import Settings

DLC = {"SAGEMAKER_TS_BATCH_SIZE": "8", "SAGEMAKER_TS_MAX_BATCH_DELAY": "100000"}


def plan(env=DLC, declared=False, metadata=ModelMetadata(platform="pytorch_custom"), **hooks):
    return batch_plan.plan(Settings.from_env(env), metadata, Hooks(**hooks), declared)


def test_the_containers_batch_size_turns_batching_on_for_a_script_without_metadata_json():
    on = plan(input_fn=lambda body, content_type: None)
    assert (on.max_batch, on.trial) == (8, True)
    assert on.note.startswith("on, on trial: up to 8 records a pass (SAGEMAKER_TS_BATCH_SIZE")
    assert "input_fn returns" in on.note and "the model's answer" in on.note


@pytest.mark.parametrize("env, hooks, why", [
    ({}, {}, "no metadata.json declares a batch dimension"),
    ({"SAGEMAKER_TS_BATCH_SIZE": "1"}, {}, "does not ask for more than one record"),
    (DLC, {"transform_fn": lambda model, body, content_type, accept: b""}, "transform_fn reads one body"),
    ({}, {"transform_fn": lambda model, body, content_type, accept: b""}, "transform_fn reads one body"),
    ({}, {"predict_fn": lambda data, model, context: data}, "predict_fn takes the request's context"),
    (DLC, {"predict_fn": lambda data, model, context: data}, "predict_fn takes the request's context"),
    (DLC, {"predict_fn": lambda data, model: (yield data)}, "predict_fn streams"),
])
def test_what_keeps_batching_off_is_said(env, hooks, why):
    off = plan(env, **hooks)
    assert (off.max_batch, off.trial) == (0, False)
    assert off.note.startswith("off: ") and why in off.note


def test_metadata_json_decides_where_there_is_one():
    declared_none = plan(declared=True)
    assert declared_none.max_batch == 0 and "metadata.json declares max_batch_size 0" in declared_none.note
    declared = plan(declared=True, metadata=ModelMetadata(max_batch_size=64))
    assert (declared.max_batch, declared.trial) == (8, False)  # the setting caps it; no trial


def test_an_exported_graph_with_a_fixed_dimension_0_is_not_batched():
    off = plan(metadata=ModelMetadata(platform="pytorch_torchexport"))
    assert off.max_batch == 0 and "model.pt2's graph fixes dimension 0" in off.note


@pytest.mark.parametrize("batched, alone, differs", [
    (torch.ones(2, 3), torch.ones(2, 3) + 1e-7, None),
    (np.arange(3.0), np.arange(3.0), None),
    ([[1.0, 2.0]], [[1.0, 2.0000001]], None),
    ({"a": torch.ones(1)}, {"a": torch.ones(1)}, None),
    (["cat"], ["cat"], None),
    (torch.ones(1, 3), torch.ones(1, 3) * 2, "the answer's values differ"),
    (torch.ones(1, 3), torch.ones(3), "the answer is of shape [1, 3] in the batch, of shape [3] alone"),
    ([0.5], [0.1, 0.2, 0.7], "the answer has 1 items in the batch, 3 alone"),
    ({"a": 1}, {"b": 1}, "the answer's keys differ"),
    ([["cat"]], [["dog"]], "the answer[0][0] differs"),
])
def test_difference_compares_a_requests_part_with_its_answer_alone(batched, alone, differs):
    assert batch_plan.difference(batched, alone) == differs


# ---------------------------------------------------------------- the trial, in the runner


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.layer(x)


def on_trial(**hooks) -> Runner:
    model = model_module.LoadedModel(model=Linear().eval(), metadata=ModelMetadata(platform="pytorch_custom"),
                                     hooks=Hooks(**hooks), device=torch.device("cpu"))
    runner = Runner()
    runner.trial = batch_plan.Trial()
    runner.start(model.predict, max_batch_size=8, stage=model.stage)
    runner.call(lambda: None)  # the inference thread is up before any request
    runner.model = model
    return runner


def together(runner, values):
    """Each value's runner.infer, all queued before the batcher may gather: the gate it
    holds for a pass is held here until every request but the one it took waits."""
    requests = [batchable.flatten(v, ("x",)) for v in values]
    with runner._gate:
        jobs = [gevent.spawn(runner.infer, leaves, None, form) for form, leaves in requests]
        for _ in range(10_000):
            if runner._queue.qsize() == len(values) - 1 and runner._waiting is not None:
                break
            gevent.sleep(0)
        assert runner._queue.qsize() == len(values) - 1
    gevent.joinall(jobs, raise_error=True)
    return [job.value for job in jobs]


def alone(runner, value):
    form, leaves = batchable.flatten(value, ("x",))
    return runner.model.predict(leaves, None, form)


VALUES = [torch.arange(3.0).view(1, 3) + i for i in range(4)]
THREE = VALUES[:3]


@pytest.mark.parametrize("predict_fn", [
    lambda data, model: model(data),  # a tensor, a row per record
    lambda data, model: model(data).tolist(),  # a list, an item per record
])
def test_a_predict_fn_that_answers_per_record_keeps_batching(predict_fn):
    runner = on_trial(predict_fn=predict_fn, output_fn=lambda prediction, accept: b"")
    expected = [alone(runner, v) for v in VALUES]
    for _ in range(2):
        answers = together(runner, VALUES)
        assert batch_plan.difference(answers, expected) is None
    assert not runner.unsplittable and runner.trial.tried
    assert runner.batched_passes == 2


@pytest.mark.parametrize("predict_fn, why", [
    # The request's data taken as one record's: a batch's first row answers for all.
    (lambda data, model: model(data)[0].tolist(), "is not its answer alone"),
    # Normalised across the pass, as if it were one request's records.
    (lambda data, model: torch.softmax(model(data), dim=0), "is not its answer alone: the answer's values differ"),
    # Only takes one record at a time.
    (lambda data, model: model(data.view(3)), "failed where each of them alone did not"),
])
def test_a_predict_fn_that_cannot_be_batched_turns_batching_off_and_answers_as_alone(predict_fn, why, caplog):
    # Three requests of a record each: a list of three items looks like a row per record.
    runner = on_trial(predict_fn=predict_fn, output_fn=lambda prediction, accept: b"")
    expected = [alone(runner, v) for v in THREE]
    with caplog.at_level(logging.WARNING):
        first = together(runner, THREE)
    assert batch_plan.difference(first, expected) is None
    assert runner.unsplittable
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("batching off:")]
    assert len(said) == 1 and why in said[0], said
    passes = runner.passes_run
    later = [runner.infer(leaves, None, form) for form, leaves in (batchable.flatten(v, ("x",)) for v in THREE)]
    assert batch_plan.difference(later, expected) is None
    assert runner.batched_passes == 1 and runner.passes_run == passes  # alone: outside the batcher


def test_decoded_requests_without_input_fn_are_checked_too(caplog):
    def predict_fn(data, model):
        return model(data) / model(data).abs().sum()  # normalised over the whole pass

    runner = on_trial(predict_fn=predict_fn)
    arrays = [{"x": v.numpy()} for v in VALUES]
    expected = [runner.model.predict(a) for a in arrays]
    with runner._gate:
        jobs = [gevent.spawn(runner.infer, a) for a in arrays]
        for _ in range(10_000):
            if runner._queue.qsize() == len(arrays) - 1 and runner._waiting is not None:
                break
            gevent.sleep(0)
    gevent.joinall(jobs, raise_error=True)
    assert batch_plan.difference([j.value for j in jobs], expected) is None
    assert runner.unsplittable and runner.passes(arrays[0]) == 1


@pytest.mark.parametrize("predict_fn", [
    lambda data, model: model(data).sum().item(),  # one number for the request
    lambda data, model: model(data).sum(),  # a 0-d tensor
    lambda data, model: model(data)[0],  # the first record's answer stands for the request's
])
def test_a_request_bigger_than_a_pass_runs_whole_until_the_trial_has_kept_batching(predict_fn):
    runner = on_trial(predict_fn=predict_fn)
    big = torch.arange(36.0).view(12, 3)  # 12 records: two passes of at most 8, were it cut
    form, leaves = batchable.flatten(big, ("x",))
    assert runner.passes(leaves) == 1
    assert batch_plan.difference(runner.infer(leaves, None, form), alone(runner, big)) is None
    assert not runner.unsplittable and not runner.trial.tried


@pytest.mark.parametrize("predict_fn", [
    lambda data, model: model(data).sum(),  # a 0-d tensor a pass
    lambda data, model: model(data).sum().detach().numpy(),  # a 0-d array a pass
])
def test_with_batching_declared_a_request_whose_passes_answer_one_value_each_runs_whole(predict_fn):
    runner = on_trial(predict_fn=predict_fn)
    runner.trial = None  # declared (metadata.json's max_batch_size): no trial
    big = torch.arange(36.0).view(12, 3)  # 12 records: passes of 8 and 4
    form, leaves = batchable.flatten(big, ("x",))
    assert runner.passes(leaves) == 2
    assert batch_plan.difference(runner.infer(leaves, None, form), alone(runner, big)) is None

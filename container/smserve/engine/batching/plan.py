"""Whether requests share forward passes, and why: decided once a model is loaded, and
said once in the start log (`batching: ...`).

metadata.json's `max_batch_size` declares that dimension 0 is the batch; the settings
(SMSERVE_MAX_BATCH_SIZE, or the PyTorch containers' SAGEMAKER_TS_BATCH_SIZE) only cap
it. A model folder without metadata.json (every script migrated from AWS's PyTorch
containers: they ship none) batches when those settings ask for more than one record a
pass, unless its hooks cannot be batched (transform_fn, a streaming predict_fn, a
predict_fn that reads each request's context). Such batching is on trial (Runner.trial):
the first pass of several requests runs its last request again alone and keeps the
pass's answers only when that request's part of them is the same; a pass whose
prediction cannot be cut back into its requests, or that fails while each of its
requests answers alone, also turns it off. Until a pass has kept it, a request bigger
than a pass runs whole (its passes' answers joined may not be its answer). Whatever
turns it off is said in the log, and from then on each request runs alone, as in the
containers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from smserve.core.metadata import METADATA_FILE
from smserve.engine.batching import batchable
from smserve.engine.runtime import main_lane
from smserve.errors import HTTPError

log = logging.getLogger(__name__)

# How far a request's part of a batched pass may stray from its answer alone: a batch's
# kernels sum in another order (and a GPU may pick another algorithm for another size).
RTOL, ATOL = 1e-3, 1e-5
SETTINGS = "SAGEMAKER_TS_BATCH_SIZE (or SMSERVE_MAX_BATCH_SIZE)"


@dataclass(frozen=True)
class Plan:
    max_batch: int  # most records in one pass; 0: each request is its own pass, whole
    trial: bool  # turned on by a setting, with no metadata.json to say dimension 0 is the batch
    note: str  # the start log's line: on or off, and why


def plan(settings, metadata, hooks, declared: bool) -> Plan:
    """declared: the model folder holds metadata.json (else metadata was derived from the
    model file, or is the default of a model_fn's model)."""
    if declared or metadata.max_batch_size > 0:
        max_batch = 0 if metadata.max_batch_size == 0 else settings.max_batch_size or metadata.max_batch_size
        return Plan(max_batch, False, _declared_note(hooks, max_batch, declared))
    if metadata.platform == "pytorch_torchexport":
        return _off("model.pt2's graph fixes dimension 0 (it was exported with a static batch): requests of "
                    "other sizes cannot share a pass")
    if hooks.transform_fn is not None:
        return _off(_TRANSFORM_FN)
    if hooks.streams:
        return _off(_STREAMS)
    if hooks.predict_context:
        return _off("predict_fn takes the request's context, and a pass of several requests is no one request's "
                    "(AWS's containers call it once per request); read the context in input_fn or output_fn to "
                    "batch this script")
    asked = settings.max_batch_size or 0
    if asked <= 1:
        return _off(f"no {METADATA_FILE} declares a batch dimension, and {SETTINGS} does not ask for more than one "
                    "record a pass; set it (8, say) to batch this model's requests, or write metadata.json")
    return Plan(asked, True, (
        f"on, on trial: up to {asked} records a pass ({SETTINGS}, with no {METADATA_FILE}): dimension 0 of what "
        f"{'input_fn returns' if hooks.input_fn is not None else 'each request decodes to'} is taken as the batch, "
        f"and {'predict_fn' if hooks.predict_fn is not None else 'the model'}'s answer is cut back into requests "
        "along it (one row, or one list item, per record); the first pass of several requests runs its last "
        "request again alone, and a different answer, an answer that cannot be cut, or a pass that fails where "
        "each request alone does not, turns batching off (said then)"))


def _off(why: str) -> Plan:
    return Plan(0, False, f"off: {why}; each request is one forward pass, whole")


_TRANSFORM_FN = ("transform_fn reads one body and answers it, so each request runs alone (input_fn, predict_fn "
                 "and output_fn instead batch the model's passes across requests)")
_STREAMS = ("predict_fn streams (a generator, or it returned an iterator), and an iterator cannot be split back "
            "into requests, so each request runs alone")


def _declared_note(hooks, max_batch: int, declared: bool) -> str:
    """What batches across requests and what does not, and which hook decides, for a
    model whose metadata says whether dimension 0 is the batch."""
    if hooks.transform_fn is not None:
        return "off: " + _TRANSFORM_FN
    if max_batch <= 0:
        source = f"{METADATA_FILE} declares max_batch_size 0" if declared else "none was derived"
        return (f"off: each request is one forward pass, whole (no batch dimension: {source}; set max_batch_size "
                "> 0 to batch along dimension 0)")
    if hooks.streams:
        return "off: " + _STREAMS
    notes = [f"requests share forward passes of up to {max_batch} records along dimension 0"]
    if hooks.input_fn is not None:
        notes.append("input_fn's tensors and arrays (or a tuple, list or dict of them) batch like decoded bodies "
                     "when they agree past dimension 0; any other value it returns runs alone (said once when seen)")
    if hooks.predict_context:
        notes.append("predict_fn takes the request's context, but a pass of several requests is no one request's: "
                     "there it gets context=None (read the context in input_fn or output_fn, which run per request, "
                     "or set max_batch_size 0)")
    return "; ".join(notes)


class Trial:
    """Batching turned on by a setting for a model without metadata.json, for one
    runner (engine/batching/runner.py): its first pass of several requests is checked (check);
    `end` turns batching off, and the runner's `unsplittable` then runs every request
    alone."""

    def __init__(self):
        self.tried = False

    def check(self, runner, batch: list, parts: list) -> bool:
        """The pass's last request runs again alone (the first pass of several only):
        the pass's answers stand when its part of them is the same answer. Else batching
        ends, the pass's other requests run again alone too, and False."""
        if self.tried:
            return True
        self.tried = True
        last = batch[-1]
        try:
            _, alone = runner._run_pass(last.rows, runner._predict, (last.inputs, None, last.form))
            differs = main_lane.call(difference, parts[-1], alone)
        except HTTPError as e:
            alone, differs = e, f"it failed alone ({e.message})"
        if differs is None:
            return True
        self.end(runner, f"a request's answer in a pass of {len(batch)} requests is not its answer alone: {differs}")
        for item in batch[:-1]:
            runner._answer_alone(item)
        if isinstance(alone, HTTPError):
            last.result.set_exception(alone)
        else:
            runner.stats.ran(last.rows)
            last.result.set(alone)
        return False

    @staticmethod
    def end(runner, why: str) -> None:
        log.warning("batching off: %s; this model's requests run alone from now on, one forward pass each (it was "
                    "on trial: %s with no %s)", why, SETTINGS, METADATA_FILE)
        runner.unsplittable = True


def difference(batched, alone, where: str = "the answer") -> str | None:
    """Where a request's part of a batched pass's prediction differs from its prediction
    alone (tensors, arrays, and lists, tuples and dicts of them, or plain values), or None."""
    if batchable.is_tensor(batched) or batchable.is_tensor(alone) or isinstance(batched, np.ndarray):
        a, b = _array(batched), _array(alone)
        if a is None or b is None or a.shape != b.shape:
            return f"{where} is {_shape(batched)} in the batch, {_shape(alone)} alone"
        same = (np.allclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True) if a.dtype.kind in "biufc"
                and b.dtype.kind in "biufc" else np.array_equal(a, b))
        return None if same else f"{where}'s values differ"
    if isinstance(batched, dict) and isinstance(alone, dict):
        if batched.keys() != alone.keys():
            return f"{where}'s keys differ"
        return next((d for k in batched if (d := difference(batched[k], alone[k], f"{where}[{k!r}]"))), None)
    if isinstance(batched, (list, tuple)) and isinstance(alone, (list, tuple)):
        if len(batched) != len(alone):
            return f"{where} has {len(batched)} items in the batch, {len(alone)} alone"
        return next((d for i, (x, y) in enumerate(zip(batched, alone))
                     if (d := difference(x, y, f"{where}[{i}]"))), None)
    if isinstance(batched, float) and isinstance(alone, float):
        return None if np.isclose(batched, alone, rtol=RTOL, atol=ATOL, equal_nan=True) else f"{where} differs"
    return None if type(batched) is type(alone) and batched == alone else f"{where} differs"


def _array(value):
    if batchable.is_tensor(value):
        value = value.detach().cpu()
        return (value.float() if not value.is_complex() and value.is_floating_point() else value).numpy()
    return value if isinstance(value, np.ndarray) else None


def _shape(value) -> str:
    shape = getattr(value, "shape", None)
    return f"of shape {list(shape)}" if shape is not None else f"a {type(value).__name__}"

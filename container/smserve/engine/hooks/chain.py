"""A request through the model's own hooks: input_fn, the batcher, output_fn.

`input_fn` and `output_fn` are the user's code, and their cost grows with the request
(decoding a JPEG, writing top-k labels): they run on the hook threads (as many as the
worker's share of the cores), never on the event loop, each request's on its own with
its own context, while the inference thread runs passes. What `input_fn` returns goes to the runner as a decoded body does: a batch
(a tensor, an array, or a tuple, list or dict of them; engine/batching/batchable.py) is cut into
passes of at most the max batch size and shares passes with other requests whose
leaves agree past dimension 0, its tensors reaching the model's device through the same
staging; anything else runs alone, and the log says why the first time. A streaming
`predict_fn` runs each request alone (an iterator cannot be split).
"""

from __future__ import annotations

import logging

from smserve.engine.batching import batchable
from smserve.engine.runtime import main_lane
from smserve import toolkit
from smserve.engine.hooks.script import hook_error
from smserve.engine.batching.passes import records_in

log = logging.getLogger(__name__)


class HookChain:
    """One model's chain: its loaded model, its runner, the worker's threads (pools), the
    maker of its hooks' contexts (engine/hooks/context.py) and its hook processes, if any."""

    def __init__(self, model, runner, pools, contexts, processes=None):
        self.model = model
        self.runner = runner
        self.pools = pools
        self.contexts = contexts
        self.processes = processes
        self._said: set[str] = set()  # why requests ran alone, said once each

    def input(self, message):
        """input_fn's value for the message (on a hook thread), or NotImplemented when
        it hands the body back to the built-in codecs."""
        context = self.contexts.of(message) if self.model.hooks.input_context else None
        return self.pools.on_hooks(_run_input_fn, self.model, message, context, self.processes)

    def answer(self, value, message, accept: str, encode, decoded: bool = False):
        """The answer to one request whose data is value: input_fn's, or the built-in
        codecs' named arrays (decoded). accept: the media type output_fn is asked for;
        encode: the built-in encoder of named arrays, for a model without output_fn or
        a prediction output_fn hands back (NotImplemented). Returns (body, media type),
        or the iterator a predict_fn returned (to stream)."""
        model = self.model
        hooks = model.hooks
        prediction = self._predict(value, message, decoded)
        if hooks.streamed(prediction):
            return prediction
        if hooks.output_fn is None:
            return self.pools.offload(sum(getattr(a, "nbytes", 0) for a in prediction.values()), encode, prediction)
        context = self.contexts.of(message) if hooks.output_context else None
        answer = self.pools.on_hooks(_run_output_fn, model, prediction, accept, context, self.processes)
        if answer is NotImplemented:
            return self.pools.on_hooks(lambda: encode(model.outputs_to_numpy(prediction)))
        return answer

    def _predict(self, value, message, decoded: bool):
        model, runner = self.model, self.runner
        hooks = model.hooks
        batched = runner.max_batch_size > 0 and not hooks.runs_alone
        if decoded:
            form, leaves = model.input_form(value)
            if batched:
                return runner.infer(leaves, None, form)
            context = self.contexts.of(message) if hooks.predict_context else None
            return runner.call_pass(model.predict, leaves, context, form, records=lambda: records_in(leaves))
        if batched:
            try:
                # What input_fn returned is looked at where torch may raise (main_lane.py).
                form, leaves = main_lane.call(self._batch, model, value)
            except batchable.NotBatchable as e:
                self._say_once(type(value).__name__, "input_fn returned a value the batcher cannot batch (%s): such "
                               "requests run alone, one forward pass each. To batch them with others, return a tensor "
                               "or array with the batch along dimension 0 (or a tuple, list or dict of them)", e)
            else:
                return runner.infer(leaves, None, form)
        context = self.contexts.of(message) if hooks.predict_context else None
        return runner.call_pass(model.predict_value, value, context,
                                records=lambda: main_lane.call(records_in, value))

    def _batch(self, model, value):
        """input_fn's value as the runner's named leaves, checked against what
        metadata.json declares past dimension 0 (where it declares a shape)."""
        names = tuple(spec.name for spec in model.metadata.inputs)
        form, leaves = batchable.flatten(value, names)
        for name, leaf in leaves.items():
            spec = model.metadata.input(name)
            if spec is None or spec.shape is None:
                continue
            shape = tuple(leaf.shape[1:])
            if len(shape) != len(spec.shape) or any(d not in (-1, s) for d, s in zip(spec.shape, shape)):
                raise batchable.NotBatchable(f"{name!r} is {list(leaf.shape)}: metadata.json declares "
                                             f"{list(spec.shape)} past the batch dimension")
        return form, leaves

    def _say_once(self, key: str, message: str, *args) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning(message, *args)


def _run_input_fn(model, message, context, processes=None):
    """On a hook thread: the user's input_fn, its failure named (context: None for an
    input_fn that takes none); in a hook process of the model's where it has them. The
    body is a str for the toolkit's UTF-8 types, as the toolkit hands it over."""
    model.bind_thread()
    hooks = model.hooks
    name = hooks.named("input_fn")
    try:
        if processes is not None:  # the process decodes the body, off this worker's GIL
            return processes.input_fn(message.body, message.content_type, context)
        body = toolkit.text_body(message.body, message.content_type, name)
        if context is not None:
            return hooks.input_fn(body, message.content_type, context)
        return hooks.input_fn(body, message.content_type)
    except Exception as e:  # noqa: BLE001 - every failure is answered, naming the hook
        raise hook_error(name, e, client_fault=True) from e


def _run_output_fn(model, prediction, accept: str, context, processes=None) -> tuple[bytes, str]:
    """On a hook thread: the user's output_fn -> (body, media type) (context: None for
    an output_fn that takes none); in a hook process of the model's where it has them."""
    model.bind_thread()
    hooks = model.hooks
    name = hooks.named("output_fn")
    try:
        if processes is not None:
            result = processes.output_fn(prediction, accept, context)
        elif context is not None:
            result = hooks.output_fn(prediction, accept, context)
        else:
            result = hooks.output_fn(prediction, accept)
        if result is NotImplemented:  # the built-in encoders answer this Accept
            return result
        return toolkit.written(result, accept)
    except Exception as e:  # noqa: BLE001
        raise hook_error(name, e, client_fault=False) from e

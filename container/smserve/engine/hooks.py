"""The SageMaker PyTorch inference hooks a model may bring in `code/inference.py`.

`model_fn(model_dir)`, `input_fn(body, content_type)`, `predict_fn(data, model)`,
`output_fn(prediction, accept)`: each one defined replaces that built-in step, as in
the SageMaker PyTorch serving toolkit users already know. Two more are this project's:
a predict_fn that returns an iterator (a generator function's, or any other) streams its
answer (protocols/streams.py), and `stream_fn(messages, model, context)` serves a
bidirectional WebSocket session with state kept for the life of the connection
(streaming/stream_fn.py).

`input_fn`, `predict_fn` and `output_fn` may declare a last parameter named `context`
(core/context.py: SageMaker's headers, and custom attributes to send back): seen in
their signatures once, here, so a request pays nothing to know it.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
import functools
import sys
from dataclasses import dataclass, field
from typing import Callable

HOOK_NAMES = ("model_fn", "input_fn", "predict_fn", "output_fn", "stream_fn")
# The hooks that may take the request's context as a last parameter of this name.
CONTEXT = "context"
CODE_DIR = "code"
SCRIPT = "inference.py"

log = logging.getLogger(__name__)


@dataclass
class Hooks:
    model_fn: Callable | None = None
    input_fn: Callable | None = None
    predict_fn: Callable | None = None
    output_fn: Callable | None = None
    stream_fn: Callable | None = None
    # Whether predict_fn answers with an iterator to stream. What it returns decides, not
    # how it is written (`return model.generate(data)` streams as `yield` does): known at
    # load for a generator function, else learnt from its first iterator.
    returned_iterator: bool = field(default=False, compare=False)
    # Whether each hook takes the request's context (its last parameter is `context`).
    input_context: bool = field(default=False, init=False, compare=False)
    predict_context: bool = field(default=False, init=False, compare=False)
    output_context: bool = field(default=False, init=False, compare=False)

    def __post_init__(self):
        if self.predict_fn is not None and inspect.isgeneratorfunction(self.predict_fn):
            self.returned_iterator = True
        for name in ("input_fn", "predict_fn", "output_fn"):
            fn = getattr(self, name)
            kind = _context_parameter(fn)
            if kind is None:
                continue
            if kind == inspect.Parameter.KEYWORD_ONLY:
                # Called like the others, context last and positional.
                setattr(self, name, _context_by_keyword(fn))
            setattr(self, name.replace("_fn", "_context"), True)

    @property
    def wants_context(self) -> bool:
        return self.input_context or self.predict_context or self.output_context

    def output_with(self, context_of):
        """output_fn as (prediction, accept) -> answer, given the request's context when
        it asks for one (context_of(): the context, made on the first call)."""
        output_fn = self.output_fn
        if output_fn is None or not self.output_context:
            return output_fn
        return lambda prediction, accept: output_fn(prediction, accept, context_of())

    @property
    def streams(self) -> bool:
        """predict_fn is known to answer with iterators: its answers go through the
        hooks' own path, one request at a time, never a batched pass."""
        return self.returned_iterator

    @property
    def may_stream(self) -> bool:
        """predict_fn may answer with an iterator: what it returns is only known then,
        so an Accept that only a stream can meet is not refused before it has run."""
        return self.predict_fn is not None

    def streamed(self, prediction) -> bool:
        """Whether predict_fn's result is an iterator to stream; once one is, every
        later request takes the hooks' path (a batched pass cannot split an iterator)."""
        if not is_stream(prediction):
            return False
        self.returned_iterator = True
        return True

    @property
    def handles_bytes(self) -> bool:
        """The user's code turns bodies into data or data into bodies itself (or
        streams, which the batcher cannot split back into requests)."""
        return self.input_fn is not None or self.output_fn is not None or self.streams


def is_stream(value) -> bool:
    """A hook's result that is an iterator of items to send one by one (a predict_fn's
    answer, a stream_fn's fragmented message), not one value: a generator, or anything
    with __next__ that is not an array or a container."""
    if isinstance(value, (str, bytes, bytearray, memoryview, dict, list, tuple)):
        return False
    return inspect.isgenerator(value) or (hasattr(value, "__next__") and not hasattr(value, "shape"))


def _context_parameter(fn) -> inspect._ParameterKind | None:
    """How fn takes a context: the kind of its last parameter when that one is named
    `context` (and is not *args or **kwargs); None when it takes none."""
    if fn is None:
        return None
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or an object without a signature
        return None
    if not parameters or parameters[-1].name != CONTEXT:
        return None
    kind = parameters[-1].kind
    if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
        return None
    return kind


def _context_by_keyword(fn):
    @functools.wraps(fn)
    def call(*args):
        *rest, context = args
        return fn(*rest, context=context)

    return call


def load_hooks(model_dir: str) -> Hooks:
    path = os.path.join(model_dir, CODE_DIR, SCRIPT)
    if not os.path.exists(path):
        return Hooks()
    code_dir = os.path.dirname(path)
    # The script may import helper modules that sit beside it, as in SageMaker.
    if code_dir not in sys.path:
        sys.path.insert(0, code_dir)
    spec = importlib.util.spec_from_file_location("inference", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["inference"] = module
    spec.loader.exec_module(module)
    found = {name: getattr(module, name) for name in HOOK_NAMES if callable(getattr(module, name, None))}
    # Which of the user's hooks replace a built-in step, said once at start: a typo'd
    # name (predict instead of predict_fn) shows here as a hook missing.
    hooks = Hooks(**found)
    with_context = [name for name in ("input_fn", "predict_fn", "output_fn")
                    if getattr(hooks, name.replace("_fn", "_context"))]
    log.info("hooks: %s from %s/%s%s", ", ".join(found) or f"none (it defines none of {', '.join(HOOK_NAMES)})",
             CODE_DIR, SCRIPT, f" ({', '.join(with_context)} with context)" if with_context else "")
    return hooks

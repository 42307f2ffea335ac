"""The SageMaker PyTorch inference hooks a model may bring in `code/inference.py` (or the
script `SAGEMAKER_PROGRAM` names: smserve/toolkit.py).

`model_fn(model_dir)`, `input_fn(body, content_type)`, `predict_fn(data, model)`,
`output_fn(prediction, accept)`: each one defined replaces that built-in step, as in
the SageMaker PyTorch serving toolkit users already know; so do its `transform_fn`,
`pre_model_fn` and `model_warmup_fn` (smserve/toolkit.py). Two more are this project's:
a predict_fn that returns an iterator (a generator function's, or any other) streams its
answer (protocols/streams.py), and `stream_fn(messages, model, context)` serves a
bidirectional WebSocket session with state kept for the life of the connection
(streaming/stream_fn.py).

`input_fn`, `predict_fn` and `output_fn` take the request's context (core/context.py:
SageMaker's headers, and custom attributes to send back) when they declare a last
parameter named `context`, or one parameter more than the call's, as the toolkit
decides: seen in their signatures once, here, so a request pays nothing to know it.

An `input_fn` that returns `NotImplemented` hands the body back to the built-in codecs
(as a Python operator hands an operand it does not take back to the other one). What a
hook raises becomes an answer that names the hook (`hook_error`), logged with the
user's frames first.
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

from smserve.core.reply import is_stream
from smserve import toolkit
from smserve.engine.model.artifacts import ModelLoadError
from smserve.errors import BadRequest, HTTPError, ServerError, user_frames_first

HOOK_NAMES = ("model_fn", "input_fn", "predict_fn", "output_fn", "transform_fn", "pre_model_fn", "model_warmup_fn",
              "stream_fn", "open_session", "close_session")
# The hooks that may take the request's context as a last parameter of this name.
CONTEXT = "context"
CODE_DIR = toolkit.CODE_DIR
SCRIPT = toolkit.DEFAULT_PROGRAM

log = logging.getLogger(__name__)

# What an input_fn raises is the body's fault (400: it is the hook that reads the
# client's bytes), except these: the hook's own code or its environment is broken.
SERVER_FAULTS = (ImportError, NameError, SyntaxError, MemoryError, SystemError, RecursionError,
                 NotImplementedError, FileNotFoundError, PermissionError)
# torch's device failures (RuntimeError subclasses), known by name: no torch import here.
SERVER_FAULT_NAMES = ("OutOfMemoryError", "AcceleratorError")
# Modules whose pip package has another name: what to write in code/requirements.txt.
PACKAGE_OF_MODULE = {"PIL": "pillow", "cv2": "opencv-python-headless", "sklearn": "scikit-learn",
                     "yaml": "pyyaml", "skimage": "scikit-image", "google.protobuf": "protobuf"}


@dataclass
class Hooks:
    model_fn: Callable | None = None
    input_fn: Callable | None = None
    predict_fn: Callable | None = None
    output_fn: Callable | None = None
    stream_fn: Callable | None = None
    # Stateful sessions (engine/sessions/store.py): open_session(context) -> the state;
    # close_session(state, context) lets it go.
    open_session: Callable | None = None
    close_session: Callable | None = None
    # The toolkit's (smserve/toolkit.py): transform_fn stands for input_fn, predict_fn and
    # output_fn together (made from it here); the other two run once, around model_fn.
    transform_fn: Callable | None = None
    pre_model_fn: Callable | None = None
    model_warmup_fn: Callable | None = None
    # The file the hooks came from (code/<SAGEMAKER_PROGRAM>), for messages.
    script: str = field(default=f"{CODE_DIR}/{SCRIPT}", compare=False)
    # The Accept transform_fn gets when a request names none (engine/toolkit.Script).
    default_accept: str = field(default="application/json", compare=False, repr=False)
    # Whether predict_fn answers with an iterator to stream. What it returns decides, not
    # how it is written (`return model.generate(data)` streams as `yield` does): known at
    # load for a generator function, else learnt from its first iterator.
    returned_iterator: bool = field(default=False, compare=False)
    # Whether each hook takes the request's context (its last parameter is `context`).
    input_context: bool = field(default=False, init=False, compare=False)
    predict_context: bool = field(default=False, init=False, compare=False)
    output_context: bool = field(default=False, init=False, compare=False)

    def __post_init__(self):
        if self.transform_fn is not None:
            given = [name for name in ("input_fn", "predict_fn", "output_fn") if getattr(self, name) is not None]
            if given:
                # As the toolkit refuses it: which of the two would answer is anyone's guess.
                raise ModelLoadError(f"{self.script} defines transform_fn and {', '.join(given)}: transform_fn does "
                                     "all three steps, so define either it or input_fn/predict_fn/output_fn")
            for name, fn in toolkit.from_transform_fn(self.transform_fn, self.default_accept).items():
                setattr(self, name, fn)
        if self.predict_fn is not None and inspect.isgeneratorfunction(self.predict_fn):
            self.returned_iterator = True
        for name in ("input_fn", "predict_fn", "output_fn"):
            fn = getattr(self, name)
            kind = _context_parameter(fn)
            if kind is None:
                if fn is None or not toolkit.takes_context(fn, name):
                    continue
                kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
            if kind == inspect.Parameter.KEYWORD_ONLY:
                # Called like the others, context last and positional.
                setattr(self, name, _context_by_keyword(fn))
            setattr(self, name.replace("_fn", "_context"), True)

    def named(self, step: str) -> str:
        """The hook a step's failure is named after: transform_fn where it does the step."""
        return "transform_fn" if self.transform_fn is not None else step

    @property
    def wants_context(self) -> bool:
        return self.input_context or self.predict_context or self.output_context

    @property
    def runs_alone(self) -> bool:
        """Each request is its own pass: a streaming predict_fn's iterator cannot be
        split, and transform_fn reads one body and answers it."""
        return self.streams or self.transform_fn is not None

    @property
    def keeps_sessions(self) -> bool:
        """The model opens stateful sessions (SageMaker's NEW_SESSION)."""
        return self.open_session is not None

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
    def plain(self) -> bool:
        """No hook stands between named arrays and the model's own forward: a pass is
        TorchModel.run."""
        return (self.input_fn is None and self.predict_fn is None and self.output_fn is None
                and self.transform_fn is None)

    @property
    def handles_bytes(self) -> bool:
        """The user's code turns bodies into data or data into bodies itself (or
        streams, which the batcher cannot split back into requests)."""
        return self.input_fn is not None or self.output_fn is not None or self.streams




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


def server_fault(error: BaseException) -> bool:
    """Whether a hook's exception is its own code's or environment's fault, not the request's."""
    return isinstance(error, SERVER_FAULTS) or type(error).__name__ in SERVER_FAULT_NAMES


def missing_package_hint(error: BaseException) -> str:
    """For a module the hooks import and the image lacks: what to add, and where."""
    if not isinstance(error, ModuleNotFoundError) or not error.name:
        return ""
    top = error.name.split(".")[0]
    package = PACKAGE_OF_MODULE.get(error.name) or PACKAGE_OF_MODULE.get(top) or top
    return (f" (add {package} to {CODE_DIR}/requirements.txt beside {SCRIPT}: serve installs it at start, "
            "docs/model.md#coderequirementstxt)")


def hook_error(hook: str, error: Exception, client_fault: bool) -> HTTPError:
    """The answer to an exception a hook raised, naming the hook; a server fault is logged
    here, once, with the user's frames first (the client's own faults are said by the
    route's one-line 4xx log). client_fault: whether the hook reads the client's bytes
    (input_fn), so that what it raises is the body's fault unless server_fault says
    otherwise."""
    if isinstance(error, HTTPError):
        return error
    answer = toolkit.error_status(error, hook)
    if answer is not None:  # the status the script chose, as the toolkit answers it
        answer.__cause__ = error
        return answer
    described = f"{type(error).__name__}: {error}{missing_package_hint(error)}"
    if client_fault and not server_fault(error):
        # The client's answer (and the route's 4xx line) says why; the traceback is for
        # the hook's author, at debug: one per bad body would flood the log.
        log.debug("%s raised %s", hook, type(error).__name__, exc_info=error)
        answer = BadRequest(f"{hook} rejected the body: {described}")
    else:
        log.error("%s failed: %s", hook, described, exc_info=user_frames_first(error))
        answer = ServerError(f"{hook} failed: {described}")
        answer.logged = True
    answer.__cause__ = error
    return answer




# The module names user scripts were registered under (a later model's script may take its place).
_SCRIPT_MODULES = {"inference"}
# The code/ folders load_hooks put on sys.path: each process that loads a script adds its own.
_CODE_DIRS: set[str] = set()


def import_path() -> str:
    """sys.path for a child's PYTHONPATH, less the scripts' code/ folders: there they would
    come before the standard library, and a code/json.py would replace json."""
    return os.pathsep.join(p for p in sys.path if p and p not in _CODE_DIRS)


def load_hooks(model_dir: str, script: toolkit.Script | None = None, single: bool = True) -> Hooks:
    """The hooks of the model in model_dir: script.program in its code/ folder (single:
    one model serves, so SAGEMAKER_SUBMIT_DIRECTORY may hold the script instead)."""
    script = script or toolkit.Script()
    path = script.path(model_dir, single)
    if path is None:
        missing = script.missing(model_dir, single)
        if missing and single:
            raise ModelLoadError(missing)
        if missing:  # one of many models: each brings its own code/, or none
            log.warning("%s: this model has no hooks", missing)
        return Hooks(default_accept=script.default_accept)
    code_dir = os.path.dirname(path)
    shown = os.path.relpath(path, model_dir) if path.startswith(os.path.join(model_dir, "")) else path
    # The script may import helper modules that sit beside it, as in SageMaker.
    if code_dir not in sys.path:
        sys.path.insert(0, code_dir)
        _CODE_DIRS.add(code_dir)
    spec = importlib.util.spec_from_file_location(script.module_name, path)
    module = importlib.util.module_from_spec(spec)
    # Under both names: ours of old, and the one the toolkit imports it by (mnist.py -> mnist),
    # unless that name is another module's (a script named json.py must not replace json).
    sys.modules["inference"] = module
    if sys.modules.get(script.module_name) is None or script.module_name in _SCRIPT_MODULES:
        sys.modules[script.module_name] = module
        _SCRIPT_MODULES.add(script.module_name)
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as e:
        hint = missing_package_hint(e)
        raise ModuleNotFoundError(f"{shown}: {e}{hint}", name=e.name) from e
    found = {name: getattr(module, name) for name in HOOK_NAMES if callable(getattr(module, name, None))}
    # Which of the user's hooks replace a built-in step, said once at start: a typo'd
    # name (predict instead of predict_fn) shows here as a hook missing.
    hooks = Hooks(**found, script=shown, default_accept=script.default_accept)
    if hooks.close_session is not None and hooks.open_session is None:
        log.warning("%s defines close_session but no open_session: the model keeps no sessions, and "
                    "close_session is never called", shown)
    with_context = [name for name in found if name in toolkit.ARITY and _gets_context(hooks, name, found[name])]
    log.info("hooks: %s from %s%s", ", ".join(found) or f"none (it defines none of {', '.join(HOOK_NAMES)})",
             shown, f" ({', '.join(with_context)} with context)" if with_context else "")
    return hooks


def _gets_context(hooks: Hooks, name: str, fn) -> bool:
    if name in ("input_fn", "predict_fn", "output_fn"):
        return getattr(hooks, name.replace("_fn", "_context"))
    return toolkit.takes_context(fn, name)


def load_context(model_dir: str, device):
    """The context model_fn, pre_model_fn and model_warmup_fn get: no request's, but the
    toolkit's system_properties."""
    from smserve.core.context import RequestContext

    context = RequestContext({})
    context.device = device
    context.system_properties = toolkit.system_properties(model_dir, device)
    return context


def run_load_hook(hooks: Hooks, name: str, model_dir: str, device, *args):
    """pre_model_fn, model_fn or model_warmup_fn(model_dir, *args[, context])."""
    return toolkit.call(getattr(hooks, name), name, (model_dir, *args), lambda: load_context(model_dir, device))

"""AWS's SageMaker PyTorch inference toolkit's contract, in one module: the parts that are
not ours by birth, so that a script written for AWS's PyTorch containers runs here
unchanged (engine/hooks/ calls the hooks by these rules; settings.py, serve and the
model's loading read the constants):

- which script: `SAGEMAKER_PROGRAM` (what the SDK's `entry_point` sets) names it, in the
  model's `code/` folder, else in `SAGEMAKER_SUBMIT_DIRECTORY` where that is a local folder;
- the context by arity: the toolkit hands a hook its context when the hook has one
  parameter more than the call's arguments (`model_fn(model_dir, context)`,
  `input_fn(body, content_type, context)`, ...), whatever that parameter is called;
- `transform_fn(model, body, content_type, accept[, context])`, which does all three
  steps, and so excludes input_fn, predict_fn and output_fn (the toolkit refuses the mix);
- `pre_model_fn(model_dir[, context])` before model_fn, `model_warmup_fn(model_dir,
  model[, context])` after it;
- the context's `system_properties` (`model_dir`, `gpu_id`), as the toolkit's model
  server fills them;
- the body input_fn and transform_fn get: a str for its UTF-8 types, else bytes;
- what output_fn and transform_fn may answer, written as TorchServe writes it: bytes as
  they are, a str as UTF-8, a tensor torch.save'd, anything else as JSON; or a
  (body, content type) tuple;
- what a hook raises as sagemaker_inference's own errors: the status they carry;
- with no model_fn and no model.pt, the folder's lone *.pt or *.pth file is the model;
- the SAGEMAKER_TS_* settings: which have a counterpart here, which none.

No torch, and nothing above core/: the gunicorn master and settings.py read it too.
"""

from __future__ import annotations

import inspect
import io
import json
import os
import sys
from dataclasses import dataclass

from smserve.core import media
from smserve.errors import BadRequest, HTTPError

DEFAULT_PROGRAM = "inference.py"
CODE_DIR = "code"
# The model file the toolkit loads when the script has no model_fn and there is no
# model.pt: the folder's only file with one of these endings.
LONE_SUFFIXES = (".pt", ".pth")
# The PyTorch containers' (TorchServe's) settings: SAGEMAKER_TS_*. settings.py reads the
# ones with a counterpart here (SAGEMAKER_TS_BATCH_SIZE, _MAX_BATCH_DELAY,
# _RESPONSE_TIMEOUT) and says at start what became of each one set.
TS_PREFIX = "SAGEMAKER_TS_"
# Those that have no counterpart here, and what does that work.
TS_UNUSED = {
    "SAGEMAKER_TS_MIN_WORKERS": "SAGEMAKER_MODEL_SERVER_WORKERS (a fixed worker count; default one per GPU)",
    "SAGEMAKER_TS_MAX_WORKERS": "SAGEMAKER_MODEL_SERVER_WORKERS (a fixed worker count; default one per GPU)",
    "SAGEMAKER_TS_DEFAULT_WORKERS_PER_MODEL": "SAGEMAKER_MODEL_SERVER_WORKERS",
    "SAGEMAKER_TS_MAX_REQUEST_SIZE": "SMSERVE_MAX_REQUEST_MB (SAGEMAKER_MAX_PAYLOAD_IN_MB in batch transform)",
    "SAGEMAKER_TS_MAX_RESPONSE_SIZE": "nothing: answers have no size limit",
    # sagemaker-inference's, for its Java model servers.
    "SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS": "SAGEMAKER_MODEL_SERVER_TIMEOUT (seconds an answer may take)",
    "SAGEMAKER_MODEL_SERVER_VMARGS": "nothing: this server runs no JVM",
}
# The Content-Types whose body the toolkit hands input_fn and transform_fn as a str
# (sagemaker_inference.content_types.UTF8_TYPES, compared whole, parameters and all).
UTF8_TYPES = (media.JSON, media.CSV)
# TorchServe's JSON for an answer that is neither bytes nor a str (otf_message_handler).
ANSWER_JSON_INDENT = 2
# The files of code/ a missing script's message names: enough to spot a misspelling.
SHOWN_FILES = 20
# Each hook's arguments before the optional context, as the toolkit calls it.
ARITY = {"model_fn": 1, "pre_model_fn": 1, "model_warmup_fn": 2, "input_fn": 2, "predict_fn": 2,
         "output_fn": 2, "transform_fn": 4}


@dataclass(frozen=True)
class Script:
    """Where a model's hooks are: `program` in the model's code/ folder, else (a single
    model only: each multi-model model brings its own code/) in submit_dir."""

    program: str = DEFAULT_PROGRAM
    submit_dir: str | None = None
    # The Accept a transform_fn is handed when the request names none (or */*), as the
    # toolkit does: SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT, else application/json.
    default_accept: str = "application/json"

    def path(self, model_dir: str, single: bool = True) -> str | None:
        """The script's file for the model in model_dir, or None when there is none."""
        candidates = [os.path.join(model_dir, CODE_DIR, self.program)]
        if single and self.submit_dir:
            candidates.append(os.path.join(self.submit_dir, self.program))
        return next((path for path in candidates if os.path.isfile(path)), None)

    def missing(self, model_dir: str, single: bool = True) -> str | None:
        """Why the model cannot serve: SAGEMAKER_PROGRAM names a script that is not there
        (served without the hooks it was written for, a model answers raw outputs).
        None when the script is there, or when no script was named (the default's
        absence means a model without hooks)."""
        if self.program == DEFAULT_PROGRAM or self.path(model_dir, single) is not None:
            return None
        code = os.path.join(model_dir, CODE_DIR)
        if os.path.isdir(code):
            held = sorted(os.listdir(code))
            shown = ", ".join(held[:SHOWN_FILES]) + (" ..." if len(held) > SHOWN_FILES else "")
            holds = f"{code} holds {shown}" if held else f"{code} is empty"
        else:
            holds = f"there is no {code} folder"
        where = f" nor {self.submit_dir}" if single and self.submit_dir else ""
        return (f"SAGEMAKER_PROGRAM={self.program} names a script that neither {code}{where} holds ({holds}): "
                "put it there, or set SAGEMAKER_PROGRAM to the script's file name")

    @property
    def module_name(self) -> str:
        """The module's name, as the toolkit imports it (mnist.py -> mnist)."""
        return self.program[:-3] if self.program.endswith(".py") else self.program


def script_of(settings) -> Script:
    """The Script the settings describe (settings.Settings, read once at start)."""
    submit = settings.submit_directory
    local = submit if submit and "://" not in submit and os.path.isdir(submit) else None
    return Script(settings.program, local, settings.default_accept or "application/json")


def takes_context(fn, name: str) -> bool:
    """Whether the toolkit would hand fn a context: it has exactly one positional
    parameter more than the call's arguments. (*args and **kwargs count as one each
    there, and fail at the call; here they take none, so such a hook gets the plain call.)"""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or an object without a signature
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return len(parameters) == ARITY[name] + 1 and parameters[-1].kind in positional


def call(fn, name: str, args: tuple, context_of):
    """fn(*args), with the context (context_of()) last when fn takes one by arity."""
    if takes_context(fn, name):
        return fn(*args, context_of())
    return fn(*args)


def system_properties(model_dir: str, device) -> dict:
    """The toolkit's context.system_properties: the model's folder, and the worker's GPU
    (None on the CPU, where the toolkit's model server has none either)."""
    gpu = device.index if device is not None and device.type == "cuda" else None
    return {"model_dir": model_dir, "gpu_id": gpu}


class TransformRequest:
    """A request for transform_fn: the body whole, as the model gets it. Not a tensor
    or array, so the batcher runs it alone (a transform_fn answers one body)."""

    __slots__ = ("body", "content_type", "accept")

    def __init__(self, body, content_type: str, accept: str):
        self.body, self.content_type, self.accept = body, content_type, accept


def from_transform_fn(transform_fn, default_accept: str) -> dict:
    """input_fn, predict_fn and output_fn that together are transform_fn: the first
    carries the body over (a str already, where the toolkit decodes it: text_body), the
    second runs transform_fn where the model runs (the inference thread, so a GPU model
    gets its device and stream), the third hands its answer back as the toolkit does (a
    (body, content type) tuple, or the body in the Accept's type)."""
    with_context = takes_context(transform_fn, "transform_fn")

    def input_fn(body, content_type, context):
        accept = context.headers.get("Accept")
        if not accept or accept.strip() == "*/*":
            accept = default_accept
        return TransformRequest(body, content_type, accept)

    def predict_fn(request, model, context):
        if not isinstance(request, TransformRequest):  # a KServe v2 request: decoded by the protocol, no body
            raise BadRequest("this model answers through its transform_fn, which reads the request's own body: "
                             "send it to /invocations in the script's format, not as KServe v2")
        args = (model, request.body, request.content_type, request.accept)
        answer = transform_fn(*args, context) if with_context else transform_fn(*args)
        return answer if isinstance(answer, tuple) else (answer, request.accept)

    def output_fn(answer, accept):
        return answer

    return {"input_fn": input_fn, "predict_fn": predict_fn, "output_fn": output_fn}


def text_body(body, content_type: str, hook: str):
    """The body as the toolkit hands input_fn and transform_fn it: decoded from UTF-8
    for its UTF-8 types, else as it came. A body that is not UTF-8 is a 400."""
    if content_type not in UTF8_TYPES:
        return body
    try:
        return str(body, "utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(f"the body is not UTF-8 (byte {e.start}), which a {content_type} body must be: {hook} "
                         "reads it as text") from None


def written(answer, accept: str) -> tuple[bytes, str]:
    """What output_fn or transform_fn returned, as (body, content type): a (body, content
    type) tuple as the toolkit's transformer reads one, its body as TorchServe writes it.
    An array, or any other buffer JSON cannot write, as its bytes. Else a ValueError
    that says what to return."""
    content_type = accept
    if isinstance(answer, tuple):
        if len(answer) < 2:
            raise ValueError(f"it returned a tuple of {len(answer)}: return (body, content type)")
        answer, content_type = answer[0], answer[1] or accept
        if not isinstance(content_type, str):
            raise ValueError(f"it returned a {type(content_type).__name__} as the content type: return (body, a str)")
    if isinstance(answer, (bytes, bytearray, memoryview)):
        return bytes(answer), content_type
    if isinstance(answer, str):
        return answer.encode("utf-8"), content_type
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(answer, torch.Tensor):
        out = io.BytesIO()
        torch.save(answer, out)
        return out.getvalue(), content_type
    try:
        return json.dumps(answer, indent=ANSWER_JSON_INDENT).encode("utf-8"), content_type
    except (TypeError, ValueError):
        pass
    try:
        # Through a buffer, never bytes(answer): bytes(n) of an int is n zero bytes.
        return memoryview(answer).tobytes(), content_type
    except (TypeError, ValueError, BufferError):
        raise ValueError(f"it returned a {type(answer).__name__}, which neither JSON nor a buffer can write: "
                         "return bytes, a str, or a value JSON can carry (or a (body, content type) tuple)") from None


def error_status(error: BaseException, hook: str) -> HTTPError | None:
    """sagemaker_inference's BaseInferenceToolkitError, raised by a hook, answers with the
    status it carries, as the toolkit's transformer answers it; None for any other error."""
    errors = sys.modules.get("sagemaker_inference.errors")
    if errors is None or not isinstance(error, errors.BaseInferenceToolkitError):
        return None
    status = error.status_code if isinstance(error.status_code, int) and 400 <= error.status_code < 600 else 500
    return HTTPError(f"{hook}: {error.message}", status)


def lone_model_files(model_dir: str) -> list[str]:
    """The folder's files the toolkit would take for the model when there is no model.pt,
    sorted: its *.pt and *.pth files (one is the model; more are an error to name)."""
    return sorted(name for name in os.listdir(model_dir)
                  if name.endswith(LONE_SUFFIXES) and os.path.isfile(os.path.join(model_dir, name)))

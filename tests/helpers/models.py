"""Model folders made of hooks alone (no weights), shared by the test folders: each
kind of stand-in model is written once here, not copied into every file that needs one."""

from __future__ import annotations

import re
from pathlib import Path

HOOKS = Path(__file__).parent / "hooks"

# The image example at 64 x 64 pixels in the tests (make model-image builds it at 224):
# the same ResNet-18 and hooks, a twelfth of the arithmetic, so the tests run it often.
IMAGE_TEST_SIZE = 64


def hook_script(name: str, **constants) -> str:
    """hooks/<name>.py's text (a model's code/inference.py), with each of its constants
    given (a top-level `NAME = value` line) set to the value asked for."""
    text = (HOOKS / f"{name}.py").read_text()
    for key, value in constants.items():
        text, found = re.subn(rf"^{key} = .*$", f"{key} = {value!r}", text, count=1, flags=re.M)
        assert found, f"hooks/{name}.py has no {key}"
    return text


def model_dir_with(parent: Path, hooks: str, name: str) -> Path:
    """parent/name holding only code/inference.py: the hooks are the whole model."""
    folder = Path(parent) / name
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "inference.py").write_text(hooks)
    return folder


def echo_hooks(times: float = 2, load_s: float = 0) -> str:
    """hooks/echo.py: {"x": [...], "sleep": s, "fail": bool} is answered x * times after
    sleeping s seconds in predict_fn, or raises "asked to fail". model_fn takes load_s
    (/ping answers 503 meanwhile)."""
    return hook_script("echo", TIMES=times, LOAD_S=load_s)


ECHO_HOOKS = echo_hooks()


def slow_predict(seconds: float) -> str:
    """hooks/slow_predict.py, for a copy of the example model: predict_fn sleeps, then runs
    the model, so requests stay in flight long enough to act in the middle of them."""
    return hook_script("slow_predict", SECONDS=seconds)


# hooks/streaming.py: {"n": k, "pause": s, "fail_at": i, "id": name} yields k records s
# seconds apart; with TEST_STREAM_MARKS set, it marks its generator's close in that folder.
STREAMING_HOOKS = hook_script("streaming")


# hooks/hook_values.py: every kind of value a model's hook may hand the server.
HOOK_VALUES = hook_script("hook_values")


# Added to HOOK_VALUES for the model whose predict_fn and output_fn return the kinds:
# predict_fn finds the kind by its index in kinds() in the first value input_fn made,
# output_fn when Accept asks for application/x-hook-value-<that index>
HOOK_VALUES_PREDICTED = '''

def predict_fn(data, model):
    return make(kinds()[int(data[0, 0])])


def output_fn(prediction, accept):
    if not accept.startswith("application/x-hook-value-"):
        return NotImplemented
    return make(kinds()[int(accept.rsplit("-", 1)[1])])
'''


def hook_values_model(parent: Path, name: str, predicted: bool = False) -> Path:
    """A model whose hooks return the value a request names: an identity TorchScript
    model, so whatever reaches it comes back."""
    import torch

    folder = model_dir_with(parent, HOOK_VALUES + (HOOK_VALUES_PREDICTED if predicted else ""), name)
    torch.jit.save(torch.jit.script(_identity_class()()), str(folder / "model.pt"))
    (folder / "metadata.json").write_text('{"max_batch_size": %d}' % (0 if predicted else 8))
    return folder


def hook_values_module():
    """HOOK_VALUES run here, in the test's process: its kinds and values."""
    import types

    module = types.ModuleType("hook_values")
    exec(compile(HOOK_VALUES, "hook_values", "exec"), module.__dict__)
    return module


def _identity_class():
    import torch

    class Identity(torch.nn.Module):
        def forward(self, x):
            return x

    return Identity

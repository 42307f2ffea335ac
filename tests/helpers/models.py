"""Model folders made of hooks alone (no weights), shared by the test folders: each
kind of stand-in model is written once here, not copied into every file that needs one."""

from __future__ import annotations

from pathlib import Path

# The image example at 64 x 64 pixels in the tests (make model-image builds it at 224):
# the same ResNet-18 and hooks, a twelfth of the arithmetic, so the tests run it often.
IMAGE_TEST_SIZE = 64


def model_dir_with(parent: Path, hooks: str, name: str) -> Path:
    """parent/name holding only code/inference.py: the hooks are the whole model."""
    folder = Path(parent) / name
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "inference.py").write_text(hooks)
    return folder


def echo_hooks(times: float = 2, load_s: float = 0) -> str:
    """A JSON model: {"x": [...], "sleep": s, "fail": bool} is answered x * times after
    sleeping s seconds in predict_fn, or raises "asked to fail". model_fn takes load_s
    (/ping answers 503 meanwhile)."""
    return f'''
import json
import time

import numpy as np


def model_fn(model_dir):
    time.sleep({load_s!r})
    return "echo"


def input_fn(body, content_type):
    return json.loads(body)


def predict_fn(data, model):
    time.sleep(float(data.get("sleep", 0)))
    if data.get("fail"):
        raise RuntimeError("asked to fail")
    return np.asarray(data["x"], dtype=np.float32) * {times!r}
'''


ECHO_HOOKS = echo_hooks()


def slow_predict(seconds: float) -> str:
    """For a copy of the example model: predict_fn sleeps, then runs the model, so
    requests stay in flight long enough to act in the middle of them."""
    return f'''
import time

import torch


def predict_fn(data, model):
    time.sleep({seconds!r})
    with torch.inference_mode():
        return model(data)
'''


# {"n": k, "pause": s, "fail_at": i, "id": name}: yields k records s seconds apart (a
# response stream). With STREAM_MARKS set, it writes STREAM_MARKS/closed-<id> when its
# generator is closed, finished or not, so a test sees what happened to it.
STREAMING_HOOKS = '''
import json
import os
import time

MARKS = os.environ.get("STREAM_MARKS")


def model_fn(model_dir):
    return "words"


def input_fn(body, content_type):
    return json.loads(body)


def predict_fn(data, model):
    try:
        for i in range(int(data["n"])):
            if i == data.get("fail_at"):
                raise RuntimeError("broke at %d" % i)
            yield {"token": i, "text": "w%d" % i}
            time.sleep(float(data.get("pause", 0)))
    finally:
        if MARKS:
            with open(os.path.join(MARKS, "closed-%s" % data.get("id", "x")), "w") as f:
                f.write("closed")
'''

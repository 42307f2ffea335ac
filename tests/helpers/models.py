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


# Every kind of value a model's hook may hand the server: every torch dtype, every
# layout, numpy's byte orders and odd arrays, 0-d values, and containers of them
# (tests/integration/test_hook_values.py). make(kind) builds one of `rows` records.
HOOK_VALUES = '''
import json

import numpy as np
import torch

ROWS = 2


class Tagged(torch.Tensor):
    """A Tensor subclass of the user's own."""


def _base(rows):
    return torch.arange(rows * 4, dtype=torch.float32).reshape(rows, 4)


def _dtype(name, rows):
    dtype = getattr(torch, name)
    base = _base(rows)
    if dtype.is_complex:
        return torch.complex(base, -base).to(dtype)
    if name.startswith("q"):
        return torch.quantize_per_tensor(base, 0.5, 0, dtype)
    return base.to(dtype)


LAYOUTS = {
    "sparse_coo": lambda r: _base(r).to_sparse(),
    "sparse_csr": lambda r: _base(r).to_sparse_csr(),
    "sparse_csc": lambda r: _base(r).to_sparse_csc(),
    "sparse_bsr": lambda r: _base(r).to_sparse_bsr((1, 2)),
    "sparse_bsc": lambda r: _base(r).to_sparse_bsc((1, 2)),
    "nested": lambda r: torch.nested.nested_tensor([torch.ones(i + 2) for i in range(r)]),
    "nested_jagged": lambda r: torch.nested.nested_tensor([torch.ones(i + 2, 3) for i in range(r)],
                                                          layout=torch.jagged),
    "meta": lambda r: torch.empty(r, 4, device="meta"),
    "strided_view": lambda r: torch.arange(r * 8, dtype=torch.float32).reshape(r, 8)[:, ::2],
    "transposed": lambda r: torch.arange(r * 4, dtype=torch.float32).reshape(4, r).t(),
    "expanded": lambda r: torch.arange(4, dtype=torch.float32).expand(r, 4),
    "flipped": lambda r: _base(r).flip(0),
    "conj": lambda r: torch.complex(_base(r), _base(r)).conj(),
    "neg_view": lambda r: torch.complex(_base(r), _base(r)).conj().imag,
    "requires_grad": lambda r: _base(r).requires_grad_(),
    "parameter": lambda r: torch.nn.Parameter(_base(r)),
    "subclass": lambda r: _base(r).as_subclass(Tagged),
    "channels_last": lambda r: torch.arange(r * 12, dtype=torch.float32).reshape(r, 3, 2, 2).to(
        memory_format=torch.channels_last),
    "zero_rows": lambda r: torch.zeros(0, 4),
    "zero_width": lambda r: torch.zeros(r, 0),
    "scalar": lambda r: torch.tensor(3.5),
    "np_big_endian_f4": lambda r: _base(r).numpy().astype(">f4"),
    "np_big_endian_i8": lambda r: _base(r).numpy().astype(">i8"),
    "np_fortran": lambda r: np.asfortranarray(_base(r).numpy()),
    "np_reversed": lambda r: _base(r).numpy()[::-1],
    "np_read_only": lambda r: _read_only(_base(r).numpy()),
    "np_float16": lambda r: _base(r).numpy().astype(np.float16),
    "np_complex": lambda r: _base(r).numpy().astype(np.complex64),
    "np_object": lambda r: np.array([[object()] * 4] * r, dtype=object),
    "np_structured": lambda r: np.zeros(r, dtype=[("a", "<f4"), ("b", ">i4")]),
    "np_record": lambda r: np.rec.fromarrays([np.arange(r, dtype=np.float32), np.arange(r)], names="a,b"),
    "np_datetime": lambda r: np.array(["2026-01-01"] * r, dtype="datetime64[D]"),
    "np_strings": lambda r: np.array(["text"] * r),
    "np_0d": lambda r: np.array(2.5),
    "np_scalar": lambda r: np.float32(2.5),
    "dict_mixed": lambda r: {"a": _base(r).to(torch.bfloat16), "b": _base(r).numpy().astype(">f4")},
    "tuple_mixed": lambda r: (_base(r).to_sparse(), _base(r)),
    "list_nested": lambda r: [_base(r), [_base(r)]],
    "dict_scalar": lambda r: {"x": torch.tensor(1.0)},
    "none": lambda r: None,
    "text": lambda r: "text",
    "huge_int": lambda r: 10 ** 30,
    "nan": lambda r: float("nan"),
    # Not a value: torch raising inside the hook itself (a C++ error, with its stack walk).
    "torch_error": lambda r: torch.ones(r, 3) @ torch.ones(r, 3),
}
DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16",
          "bfloat16", "float32", "float64", "complex32", "complex64", "complex128", "float8_e4m3fn",
          "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "qint8", "quint8", "qint32",
          "quint4x2", "quint2x4"]


def _read_only(array):
    array.flags.writeable = False
    return array


def kinds():
    """The kinds this torch and numpy can make (a dtype this torch lacks is left out)."""
    found = []
    for name in DTYPES:
        try:
            _dtype(name, ROWS)
        except Exception:
            continue
        found.append("dtype:" + name)
    return found + list(LAYOUTS)


def make(kind, rows=ROWS):
    if kind == "plain":
        return _base(rows)
    if kind.startswith("dtype:"):
        return _dtype(kind[len("dtype:"):], rows)
    return LAYOUTS[kind](rows)


def model_fn(model_dir):
    return torch.jit.load(model_dir + "/model.pt")


def input_fn(body, content_type, context):
    request = json.loads(body)
    if request.get("at", "input") != "input":
        return _base(ROWS) + request["code"]  # predict_fn reads which kind from the first value
    value = make(request["kind"], request.get("rows", ROWS))
    if context.session_id is not None:
        context.session = make(request["kind"])  # the session's state, counted after the request
    return value


def open_session(context):
    return {}


def close_session(state, context):
    pass
'''

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

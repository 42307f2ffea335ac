"""Every kind of value a model's hook may hand the server: every torch dtype, every layout,
numpy's byte orders and odd arrays, 0-d values, and containers of them
(tests/integration/test_hook_values.py). make(kind) builds one of `rows` records."""

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

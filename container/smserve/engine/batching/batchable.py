"""What the batcher makes of a model's own data: named leaves along dimension 0.

The built-in codecs hand the runner named numpy arrays. A model's `input_fn` returns what
its model takes: a tensor, a numpy array, or a tuple, list or dict of them. `flatten`
turns such a value into named leaves the runner can batch across requests (concatenate
along dimension 0, cut into passes of at most the max batch size) and a `Form` that
rebuilds the value from them; anything else (a PIL image, a list of strings, tensors that
disagree on dimension 0) is no batch, and the request runs alone. A CPU tensor's leaf is
a numpy view of it (no copy), so it takes the same path to the device as a decoded body:
the pinned staging buffers on a GPU, one copy per pass.

`split` and `join` do the same for a pass's prediction: a tensor, an array, a tuple,
list or dict of them, or a list of one item per record, cut back into each request's
part, and a request's parts from several passes joined again.

No torch import here: a torch.Tensor is known by duck typing (a `device` and `dtype`),
and torch itself is reached through the tensor's own module only when one is joined.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

ONE, TUPLE, LIST, DICT = "one", "tuple", "list", "dict"
_NUMPY_KINDS = "biuf"  # what crosses to numpy and back without a copy or a change


class NotBatchable(ValueError):
    """A hook's value the batcher cannot cut along dimension 0; the message says why."""


@dataclass(frozen=True)
class Form:
    """How a value is rebuilt from its leaves: its container, the leaves' names in its
    order, and which leaves were torch tensors (the others were numpy arrays)."""

    container: str
    names: tuple[str, ...]
    tensors: tuple[bool, ...]

    def rebuild(self, leaves: dict[str, Any]) -> Any:
        values = [leaves[name] for name in self.names]
        if self.container == ONE:
            return values[0]
        if self.container == DICT:
            return dict(zip(self.names, values))
        return tuple(values) if self.container == TUPLE else values

    def signature(self, leaves: dict[str, Any]) -> tuple:
        """Requests batch together only when their forms and everything but dimension 0
        of each leaf agree (its dtype, and for a tensor its device)."""
        return (self, *((name, str(leaf.dtype), tuple(leaf.shape[1:]), str(getattr(leaf, "device", "")))
                       for name, leaf in leaves.items()))


def is_tensor(value) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "device") and hasattr(value, "dtype")


def _is_leaf(value) -> bool:
    return isinstance(value, np.ndarray) or is_tensor(value)


def flatten(value, positional_names: Sequence[str] = ()) -> tuple[Form, dict[str, Any]]:
    """value -> (its form, {name: leaf}); NotBatchable when it is no batch. A tensor's
    leaf is a numpy view of it where that is free (on the CPU, a numeric dtype numpy has),
    else the tensor. positional_names name a lone value's or a tuple's leaves (the
    model's input names, when they are as many); input__i otherwise."""
    if _is_leaf(value):
        container, named = ONE, [(_name(positional_names, 0, 1), value)]
    elif isinstance(value, (tuple, list)) and value and all(_is_leaf(v) for v in value):
        container = TUPLE if isinstance(value, tuple) else LIST
        named = [(_name(positional_names, i, len(value)), v) for i, v in enumerate(value)]
    elif isinstance(value, dict) and value and all(isinstance(k, str) and _is_leaf(v) for k, v in value.items()):
        container, named = DICT, list(value.items())
    else:
        raise NotBatchable(f"it is {_described(value)}, not a tensor or array (or a tuple, list or dict of them)")
    rows = set()
    for name, leaf in named:
        if is_tensor(leaf):
            _check_tensor(name, leaf)
        elif leaf.dtype == object:
            raise NotBatchable(f"{name!r} holds Python objects")
        if leaf.ndim == 0:
            raise NotBatchable(f"{name!r} is a scalar: it has no dimension 0 to batch along")
        rows.add(int(leaf.shape[0]))
    if len(rows) > 1:
        raise NotBatchable(f"its leaves disagree on dimension 0 ({sorted(rows)})")
    form = Form(container, tuple(name for name, _ in named), tuple(is_tensor(leaf) for _, leaf in named))
    return form, {name: _as_numpy(leaf) for name, leaf in named}


def _check_tensor(name: str, leaf) -> None:
    """Only a dense tensor is cut and joined along dimension 0 by the batcher; any other
    runs alone, as the model's own value (a sparse tensor's rows are not a slice of
    memory, a nested tensor has no one shape, a quantized one has a scale of its own)."""
    if leaf.is_nested:
        raise NotBatchable(f"{name!r} is a nested tensor: its rows have no common shape")
    if str(leaf.layout) != "torch.strided":
        raise NotBatchable(f"{name!r} is a {str(leaf.layout).removeprefix('torch.')} tensor, not a dense one")
    if leaf.is_quantized:
        raise NotBatchable(f"{name!r} is a quantized tensor: its scale is its own, not a batch's")


def _name(names: Sequence[str], i: int, count: int) -> str:
    return names[i] if len(names) == count else f"input__{i}"


def _described(value) -> str:
    if isinstance(value, (tuple, list, dict)):
        return f"a {type(value).__name__} of {len(value)} item(s) that are not all tensors or arrays" if value \
            else f"an empty {type(value).__name__}"
    return f"a {type(value).__module__}.{type(value).__qualname__}" if type(value).__module__ != "builtins" \
        else f"a {type(value).__name__}"


def _as_numpy(leaf):
    """A CPU tensor of a numeric dtype as a numpy view of its memory (torch.from_numpy
    gives the same tensor back); an array in the machine's byte order (torch takes no
    other, and requests batch together only when their dtypes agree); any other leaf
    as it is: a tensor of a dtype numpy lacks (bfloat16, the float8 kinds) batches in
    torch."""
    if isinstance(leaf, np.ndarray):
        return leaf if leaf.dtype.isnative else leaf.astype(leaf.dtype.newbyteorder("="))
    if leaf.device.type != "cpu" or leaf.is_complex() or leaf.is_conj() or leaf.is_neg():
        return leaf
    try:
        array = leaf.detach().numpy()
    except (TypeError, RuntimeError):  # bfloat16 and the other dtypes numpy lacks
        return leaf
    return array if array.dtype.kind in _NUMPY_KINDS else leaf


# ---------------------------------------------------------------- predictions


class Unsplittable(ValueError):
    """A prediction that cannot be cut back into the requests of its pass."""


def split(prediction, rows: Sequence[int]):
    """A pass's prediction cut along dimension 0 into one part per request (rows: each
    request's records, in order)."""
    total = sum(rows)
    if len(rows) == 1:
        return [prediction]
    bounds = []
    start = 0
    for n in rows:
        bounds.append((start, start + n))
        start += n
    return [_cut(prediction, total, a, b) for a, b in bounds]


def _cut(value, total: int, start: int, stop: int):
    if _is_leaf(value):
        if value.ndim == 0 or value.shape[0] != total:
            raise Unsplittable(f"an output of shape {list(value.shape)} is not {total} records along dimension 0")
        return value[start:stop]
    if isinstance(value, dict):
        return {key: _cut(item, total, start, stop) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        if value and all(_records(item) == total for item in value):
            return type(value)(_cut(item, total, start, stop) for item in value)
        if len(value) == total:  # one item per record
            return value[start:stop]
    raise Unsplittable(f"{_described(value)} is not {total} records along dimension 0")


def _records(value) -> int | None:
    """How many records a value holds along dimension 0, when it is made of leaves."""
    if _is_leaf(value):
        return int(value.shape[0]) if value.ndim else None
    if isinstance(value, dict) and value:
        counts = {_records(item) for item in value.values()}
        return counts.pop() if len(counts) == 1 else None
    if isinstance(value, (tuple, list)) and value:
        counts = {_records(item) for item in value}
        return counts.pop() if len(counts) == 1 else None
    return None


def join(parts: list, rows: Sequence[int]):
    """One request's parts from its passes (rows: each part's records), joined along
    dimension 0 into what one pass over all of them would have answered."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if _is_leaf(first):
        if any(not _is_leaf(part) or part.ndim == 0 for part in parts):  # one value a pass: nothing to join
            raise Unsplittable(f"{_described(first)} has no dimension 0 to join along")
        if is_tensor(first):
            import torch  # the tensor's own library: present wherever a tensor is

            return torch.cat(list(parts))
        return np.concatenate(parts)
    if isinstance(first, dict):
        return {key: join([part[key] for part in parts], rows) for key in first}
    if isinstance(first, (tuple, list)):
        if all(_records(item) == n for part, n in zip(parts, rows) for item in part):
            return type(first)(join([part[i] for part in parts], rows) for i in range(len(first)))
        joined = [item for part in parts for item in part]
        return type(first)(joined)
    raise Unsplittable(f"{_described(first)} cannot be joined along dimension 0")

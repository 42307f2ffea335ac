"""Requests cut into forward passes and passes cut back into requests: the row
arithmetic of the batcher (engine/runner.py), on named arrays."""

from __future__ import annotations

import numpy as np

from smserve.errors import BadRequest

Arrays = dict[str, np.ndarray]


def records_in(data) -> int:
    """The records a model's input holds, for the metrics: dimension 0 of its (first)
    array or tensor, or its length; 1 for anything else."""
    if isinstance(data, dict) and data:
        data = next(iter(data.values()))
    shape = getattr(data, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else 1
    if isinstance(data, (list, tuple)):
        return len(data)
    return 1


def concatenate(name: str, parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts)


def pass_rows(rows: int, size: int) -> list[int]:
    """The records of each pass a request of `rows` records takes at `size` a pass (one
    pass of 0 for an empty request)."""
    return [min(size, rows - start) for start in range(0, max(rows, 1), size)]


def rows_of(inputs: Arrays) -> int:
    counts = {a.shape[0] if a.ndim else 1 for a in inputs.values()}
    if len(counts) != 1:
        raise BadRequest(f"inputs disagree on the batch dimension: {sorted(counts)}")
    return counts.pop()


def split_outputs(outputs: Arrays, rows: list[int]) -> list[Arrays]:
    total = sum(rows)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise ValueError(f"output {name!r} has shape {list(array.shape)}, not {total} rows")
    parts = []
    start = 0
    for n in rows:
        parts.append({name: array[start:start + n] for name, array in outputs.items()})
        start += n
    return parts

"""Records -> the model's inputs: named, shaped and typed by its metadata, batched
along dimension 0, every value checked to fit its input's type (simple.py's header has
the rules). Pure functions over arrays: no Flask, no torch.
"""

from __future__ import annotations

import math

import numpy as np

from smserve.codecs import records, slices
from smserve.codecs.limits import MAX_DIMS
from smserve.core.media import NPZ
from smserve.core.metadata import ModelMetadata, TensorSpec
from smserve.errors import BadRequest


def _as_array(values, what: str) -> np.ndarray:
    """Parsed JSON records -> float64, refusing non-numbers by position and converting
    a bounded number of records per numpy call."""
    if isinstance(values, np.ndarray):
        return values
    if type(values) is list and not set(map(type, values)) <= {int, float}:
        for index, record in enumerate(values, start=1):
            records.check_numbers(record, f"record {index}" if what == "records" else f"{what}, record {index}")
    else:
        records.check_numbers(values, what)
    try:
        if type(values) is not list or len(values) < 2:
            return np.array(values, dtype=np.float64)
        per_record = max(1, np.size(values[0]))
        step = max(1, slices.VALUES // per_record)
        parts = [np.array(values[i : i + step], dtype=np.float64) for i in range(0, len(values), step)]
        if any(p.shape[1:] != parts[0].shape[1:] for p in parts):
            raise ValueError("inhomogeneous")
        return slices.stack(parts)
    except ValueError as e:
        message = str(e)
        if records.too_deep(e):
            raise BadRequest(f"{what} nest deeper than the {MAX_DIMS} dimensions an array can have") from None
        if "inhomogeneous" in message or "sequence" in message:
            raise BadRequest(f"{what} are ragged: every record must have the same shape") from None
        raise BadRequest(f"{what} must be numbers: {message}") from None


def shape_inputs(records, metadata: ModelMetadata) -> dict[str, np.ndarray]:
    """Records -> the model's input(s): typed by the metadata, batched along dim 0."""
    inputs = metadata.inputs
    if len(inputs) > 1 or (inputs and _named(records)):
        return _named_inputs(records, metadata)
    spec = inputs[0] if inputs else TensorSpec("input__0", "FP32", None)
    array = records if isinstance(records, np.ndarray) else _as_array(records, "records")
    return {spec.name: _fit(array, spec, metadata)}


def _named(records) -> bool:
    """Whether records name their inputs: {name: array}, or a list of {name: value}."""
    return isinstance(records, dict) or (
        type(records) is list and bool(records) and all(isinstance(r, dict) for r in records))


def input_names(metadata: ModelMetadata) -> str:
    return ", ".join(spec.name for spec in metadata.inputs)


def _named_inputs(records, metadata: ModelMetadata) -> dict[str, np.ndarray]:
    """Inputs by name: {"inputs": {name: array}} or a list of {name: value} records."""
    if isinstance(records, dict):
        columns = records
    elif _named(records):
        columns = {spec.name: _column(records, spec.name) for spec in metadata.inputs}
    else:
        example = ", ".join(f'"{spec.name}": [...]' for spec in metadata.inputs)
        raise BadRequest(f"this model has several inputs ({input_names(metadata)}): send them by name, "
                         f'{{"inputs": {{{example}}}}} or {{"instances": [{{{example}}}, ...]}} '
                         f"(JSON), one such object a line (JSON Lines), or {NPZ}")
    out = {}
    for spec in metadata.inputs:
        if spec.name not in columns or columns[spec.name] is None:
            raise BadRequest(f"missing input '{spec.name}'")
        out[spec.name] = _fit(_as_array(columns[spec.name], f"input '{spec.name}'"), spec, metadata)
    unknown = sorted(set(columns) - {spec.name for spec in metadata.inputs})
    if unknown:
        raise BadRequest(f"unexpected input {unknown[0]!r}")
    return out


def csv_columns(metadata: ModelMetadata) -> int | None:
    """The most columns a CSV line can have for the model's one input, where its
    metadata says (the widths _fit takes: a flat record, or a row of a 2-D sample);
    None when any width may do, or the model has several inputs."""
    if len(metadata.inputs) != 1 or metadata.inputs[0].shape is None:
        return None
    sample = list(metadata.inputs[0].shape)
    if metadata.max_batch_size <= 0:
        return sample[1] if len(sample) == 2 and sample[1] >= 0 else None
    if not sample or any(d < 0 for d in sample):
        return None
    return max(math.prod(sample), sample[1] if len(sample) == 2 else 0)


def _column(records: list[dict], name: str) -> list:
    """Input `name`'s value in each of these records."""
    try:
        return [r[name] for r in records]
    except KeyError:
        index = next(i for i, r in enumerate(records, start=1) if name not in r)
        raise BadRequest(f"record {index}: missing input '{name}'") from None


def _fit(array: np.ndarray, spec: TensorSpec, metadata: ModelMetadata) -> np.ndarray:
    """Check the shape against the model's, add a missing batch dimension, cast."""
    batched = metadata.max_batch_size > 0
    sent = array  # as the body held it: errors name its records (a CSV body's lines)
    if spec.shape is None and batched and array.ndim == 0:  # the batcher splits along dimension 0
        raise BadRequest(f"input '{spec.name}': expected a batch dimension, got a single number")
    if spec.shape is not None:  # (None: not known; the model judges the shape)
        sample = list(spec.shape)
        known = sample and all(d >= 0 for d in sample)
        if batched and known:
            size = math.prod(sample)
            if list(array.shape) == sample:
                array = array.reshape([1] + sample)  # one record sent without its batch dimension
            elif array.ndim == 2 and array.shape[1] == size and len(sample) > 1:
                array = array.reshape([array.shape[0]] + sample)  # flat CSV rows of a shaped input
        expected = ([-1] if batched else []) + sample
        if expected and not _matches(array.shape, expected):
            raise BadRequest(
                f"input '{spec.name}': expected shape {expected}, got {list(array.shape)}"
            )
    dtype = spec.dtype.dtype if spec.datatype not in ("BYTES",) else np.float32
    dtype = np.dtype(dtype)
    if array.dtype == dtype and array.flags.c_contiguous:
        return array  # (an .npy or binary body of the model's own type: nothing to check or cast)
    # Checked a bounded piece at a time, like the cast itself; where one fails, the
    # first bad value is found in that piece alone.
    if dtype.kind in "iub":
        for offset, part in slices.pieces(array):
            unfit = _unfit(part, dtype)
            if unfit.any():
                _refuse_value(sent, offset, part, int(np.argmax(unfit)), spec, dtype)
    with np.errstate(over="ignore", invalid="ignore"):  # integers were range-checked above; floats below
        out = slices.cast(array, dtype)
    if dtype.kind == "f" and array.dtype.kind == "f" and dtype.itemsize < array.dtype.itemsize:
        flat = out.reshape(-1)  # (a view: the cast's result is C-contiguous)
        for offset, part in slices.pieces(array):
            narrowed = flat[offset : offset + len(part)]
            if not np.isfinite(narrowed).all():
                lost = np.isfinite(part) & ~np.isfinite(narrowed)
                if lost.any():
                    at = int(np.argmax(lost))
                    raise BadRequest(f"input '{spec.name}': a value is out of range for {spec.datatype}"
                                     + _which_record(sent, offset + at, part[at]))
    return out


def _unfit(part: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Which values of `part` the integer or BOOL `dtype` cannot hold, so that the cast
    would wrap or truncate them: fractional, not finite, or out of its range (300 is no
    UINT8, 2 no BOOL). numpy compares with Python ints exactly; as bounds for floats,
    float64 holds -2**k and 2**k exactly (not 2**63 - 1), hence the exclusive max + 1."""
    if part.dtype.kind == "b":
        return np.zeros(part.shape, dtype=bool)
    low, high = (0, 1) if dtype.kind == "b" else (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))
    if part.dtype.kind == "f":
        whole = np.isfinite(part) & (part == np.round(part))
        return ~whole | (part < float(low)) | (part >= float(high + 1))
    return (part < low) | (part > high)


def _refuse_value(array: np.ndarray, offset: int, part: np.ndarray, at: int, spec: TensorSpec, dtype: np.dtype):
    """Raise for value `at` of `part` (at flat `offset` in `array`, C order, the same in
    any reshape of it), the first one `_unfit` found."""
    value = part[at]
    where = _which_record(array, offset + at, value)
    if part.dtype.kind == "f" and not (np.isfinite(value) and value == np.round(value)):
        kind = "a fractional" if np.isfinite(value) else "a non-finite"
        raise BadRequest(f"input '{spec.name}' takes {spec.datatype} values; got {kind} number{where}")
    raise BadRequest(f"input '{spec.name}': a value is out of range for {spec.datatype}"
                     + (" (0 or 1)" if dtype.kind == "b" else "") + where)


def _which_record(array: np.ndarray, index: int, value) -> str:
    """' in record N: V': which record (1-based, along dimension 0, so a CSV or JSON
    Lines body's line number) holds the value at flat `index` of `array`, and what it is."""
    shown = value.item()
    if isinstance(shown, float) and shown.is_integer() and abs(shown) < 1e16:
        shown = int(shown)
    if array.ndim == 0:
        return f": {shown!r}"
    return f" in record {index // (array.size // len(array)) + 1}: {shown!r}"


def _matches(shape: tuple, expected: list[int]) -> bool:
    return len(shape) == len(expected) and all(e < 0 or e == s for s, e in zip(shape, expected))

"""The simple content types: JSON, CSV, JSON Lines and NumPy .npy.

These are what the SageMaker Python SDK's serializers send. CSV and JSON Lines carry one
record a line, and their responses carry exactly one line per record, in order, so
batch transform's `AssembleWith=Line` and `JoinSource=Input` work. Pure functions over
bytes and arrays: no Flask, no torch.

Numbers, as decided (one rule for JSON, JSON Lines and CSV):
- Request text carries finite numbers only. JSON is parsed strictly (RFC 8259, orjson):
  `NaN`/`Infinity` literals and numbers beyond float64 (`1e999`, an integer of 400+
  digits) are not JSON: 400. CSV cells are what numpy's reader takes (`1`, `-2.5e3`,
  `.5`, surrounding spaces); `nan`, `inf`, a cell that overflows float64 (`1e999`), and
  anything else (`1_0`, `0x10`, `1,5` in one cell) are a 400 naming line and column.
  JSON `null`, `true`/`false` and strings ("1") where numbers belong are a 400 naming
  the record or line and the position in it; they are never read as numbers.
- A finite value too big for the input's float type (1e39 for an FP32 input) is a 400,
  not a silent infinity. NaN and infinities travel only in .npy or v2 binary, as-is.
  So is a value an integer or BOOL input cannot hold (2.5, 300 for UINT8, 2 for BOOL).
  Either names the first record that holds one (1-based along dimension 0: a CSV or
  JSON Lines body's line number) and the value.
- Responses: JSON and JSON Lines write NaN and ±Infinity as `null` (strict parsers
  reject anything else); CSV writes `nan`, `inf`, `-inf`; .npy (and v2 binary) carry
  them as they are. Floats are written with their shortest round-trip digits for
  their own width (float32 0.1 is `0.1`); exponent notation is orjson's (`1e-8`).

Work whose cost grows with the body runs in slices of bounded size (slices.py), so a
codec thread never holds the GIL for long while the event loop answers /ping.
"""

from __future__ import annotations

import math
import re

import numpy as np

from smserve.codecs import npy, npz, records, slices, textout
from smserve.codecs.limits import MAX_DIMS
# The media types stay importable beside the codec that takes them (tests and benchmarks read them here).
from smserve.core.media import ALIASES, CSV, JSON, JSONLINES, MEDIA_TYPES, NPY, NPZ, REQUEST_TYPES, media_type  # noqa: F401
from smserve.errors import BadRequest, NotAcceptable
from smserve.core.metadata import ModelMetadata, TensorSpec
from smserve.settings import DEFAULT_MAX_REQUEST_MB, MB

# Keys of a JSON object that hold the records, as the SageMaker and TF Serving
# conventions name them.
RECORD_KEYS = records.RECORD_KEYS


# ---------------------------------------------------------------- decoding


def decode(body: bytes, content_type: str, metadata: ModelMetadata, max_bytes: int | None = None
           ) -> dict[str, np.ndarray]:
    """A request body -> named input arrays, shaped and typed for the model.

    max_bytes: the most a compressed .npz body's arrays may take (the payload limit;
    None: the server's default one)."""
    kind = media_type(content_type)
    if not body:
        raise BadRequest("request body is empty")
    if kind == JSON:
        return decode_json(parse_json(body), metadata)
    if kind == CSV:
        width = csv_columns(metadata)
        name = metadata.inputs[0].name if metadata.inputs else ""
        return shape_inputs(records.csv(body, max_columns=width, input_name=name), metadata)
    if kind == JSONLINES:
        if len(metadata.inputs) > 1:
            return shape_inputs(records.jsonlines_named(body, tuple(spec.name for spec in metadata.inputs)), metadata)
        name = metadata.inputs[0].name if metadata.inputs else None
        return shape_inputs(records.jsonlines(body, input_name=name), metadata)
    if kind == NPY:
        if len(metadata.inputs) > 1:
            raise BadRequest(f"this model has several inputs ({input_names(metadata)}): a .npy body holds one array; "
                             f"send them in one {NPZ} body (np.savez, one array per input name) or as JSON "
                             f'{{"inputs": {{"<name>": [...], ...}}}}')
        return shape_inputs(npy.read(body), metadata)
    if kind == NPZ:
        arrays = npz.read(body, max_bytes if max_bytes is not None else DEFAULT_MAX_REQUEST_MB * MB)
        if len(arrays) == 1 and len(metadata.inputs) <= 1:
            # One array is the one input, whatever np.savez named it (arr_0 when unnamed).
            return shape_inputs(next(iter(arrays.values())), metadata)
        return shape_inputs(arrays, metadata)
    raise ValueError(f"not a simple content type: {content_type}")


def decode_json(document, metadata: ModelMetadata) -> dict[str, np.ndarray]:
    """An already-parsed JSON body (from parse_json) -> named input arrays."""
    return shape_inputs(_records_from_json(document), metadata)


def parse_json(body: bytes, where: str = "request body", c_tried: bool = False):
    """The JSON document, parsed strictly. A non-empty list of records holding only
    numbers and lists (bare or under one of RECORD_KEYS) comes back as a float64
    ndarray in its place, which decode_json takes and v2.is_v2_document refuses: no
    type check per record, and a big one is parsed in bounded slices. Anything else
    comes back as parsed, and shape_inputs checks and converts it record by record."""
    return records.parse_document(body, where, c_tried=c_tried)


def _records_from_json(document):
    """A bare list, or an object holding one under instances/inputs/features/data."""
    if isinstance(document, dict):
        for key in RECORD_KEYS:
            if key in document:
                return document[key]
        raise BadRequest(
            "JSON object must hold the records under one of "
            + ", ".join(f"'{k}'" for k in RECORD_KEYS)
            + "; or send a bare list"
        )
    if isinstance(document, list | np.ndarray):
        return document
    raise BadRequest("JSON body must be a list of records or an object holding one")


# ---------------------------------------------------------------- encoding

_JSON_OBJECT = re.compile(rb"[ \t\r\n]*\{")


def wraps_records(body: bytes, content_type: str) -> bool:
    """Whether the request wrapped its records in a JSON object (`{"instances": ...}`):
    its JSON answer is wrapped the same way (`{"predictions": ...}`). Any other request
    (a bare JSON array, CSV, JSON Lines, .npy, .npz) gets the bare array, as AWS's
    PyTorch containers answer (json.dumps(prediction.tolist())): what clients written
    for them, the SDK's JSONDeserializer among them, read."""
    return media_type(content_type) == JSON and _JSON_OBJECT.match(body) is not None


def encode(outputs: dict[str, np.ndarray], accept: str, labels: dict[str, tuple[str, ...]] | None = None,
           wrapped: bool = True) -> tuple[bytes, str]:
    """Named output arrays -> (body, content type) in the negotiated media type.

    One form whatever the model's batching: a record is one row along dimension 0. One
    output answers its array (`{"predictions": [row, ...]}`); several answer one object
    per record (`{"predictions": [{"probs": row, "score": value}, ...]}`), and only
    outputs with no common dimension 0 (nothing to call a record) one object of whole
    arrays. labels: {output name: its class labels}, to add each record's predicted
    label (its highest value's class) beside the outputs. wrapped: False answers JSON
    without the `{"predictions": ...}` around it (wraps_records)."""
    if labels:
        if accept == NPY:
            raise NotAcceptable("labels=true: application/x-npy holds one array; ask for application/json, "
                                "application/jsonlines or text/csv")
        outputs = {**outputs, **_predicted_labels(outputs, labels)}
    single = next(iter(outputs.values())) if len(outputs) == 1 else None
    if accept == JSON:
        parts = textout.array_json_parts(single) if single is not None else textout.outputs_json_parts(outputs)
        if not wrapped:
            return b"".join(parts), JSON
        return b"".join([b'{"predictions":', *parts, b"}"]), JSON
    if accept == NPY:
        if single is None:
            raise NotAcceptable(
                f"application/x-npy holds one array and this model returns {len(outputs)}; "
                "ask for application/json"
            )
        try:
            return npy.write(np.asarray(single)), NPY
        except ValueError as e:
            raise NotAcceptable(f"{e}; ask for application/json") from None
    if accept == CSV:
        return textout.outputs_csv(outputs), CSV
    if accept == JSONLINES:
        if single is not None and single.ndim >= 1:
            return textout.json_lines(single), JSONLINES
        return b"".join(line + b"\n" for line in textout.json_records(outputs)), JSONLINES
    raise NotAcceptable(f"cannot produce {accept}; supported: {', '.join(MEDIA_TYPES)}")


def _predicted_labels(outputs: dict[str, np.ndarray], labels: dict[str, tuple[str, ...]]) -> dict[str, np.ndarray]:
    """Each record's label for each labelled output: `predicted_label`, or with several
    labelled outputs `<output>_predicted_label`. The label of the record's highest value
    (the class index where metadata.json lists fewer labels than values)."""
    named = [name for name in labels if name in outputs]
    columns = {}
    for name in named:
        array = np.asarray(outputs[name])
        if array.ndim == 0 or array.dtype.kind not in "biuf":
            raise NotAcceptable(f"labels=true: output '{name}' holds no row of scores per record to label")
        rows = array.reshape(array.shape[0], math.prod(array.shape[1:]))
        best = rows.argmax(axis=1).tolist() if rows.shape[1] else [0] * len(rows)
        names = labels[name]
        column = np.empty(len(best), dtype=object)
        column[:] = [names[i] if i < len(names) else str(i) for i in best]
        columns["predicted_label" if len(named) == 1 else f"{name}_predicted_label"] = column
    return columns


# ---- Records -> the model's inputs: named, shaped and typed by its metadata, batched
# along dimension 0, every value checked to fit its input's type (the header's rules).

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

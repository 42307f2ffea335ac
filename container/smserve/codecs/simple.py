"""The simple content types: JSON, CSV, JSON Lines and NumPy .npy (and .npz), read into
records and written from output arrays. protocols/simple.py fits the records to the
model's inputs (names, shapes, types).

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
- NaN and infinities travel only in .npy or v2 binary, as-is. A value the input's type
  cannot hold is refused as the records are fitted (protocols/simple.py).
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

from smserve.codecs import npy, npz, records, textout
# The media types stay importable beside the codec that takes them (tests and benchmarks read them here).
from smserve.core.media import ALIASES, CSV, JSON, JSONLINES, MEDIA_TYPES, NPY, NPZ, REQUEST_TYPES, media_type  # noqa: F401
from smserve.errors import BadRequest, NotAcceptable
from smserve.core.metadata import ModelMetadata
from smserve.settings import DEFAULT_MAX_REQUEST_MB, MB

# Keys of a JSON object that hold the records, as the SageMaker and TF Serving
# conventions name them.
RECORD_KEYS = records.RECORD_KEYS


# ---------------------------------------------------------------- decoding


def decode(body: bytes, content_type: str, metadata: ModelMetadata, max_bytes: int | None = None):
    """A request body -> its records, for protocols/simple.py to fit to the model's
    inputs: an array, parsed JSON records, or {input name: array or records}. metadata
    bounds a CSV line's width (csv_columns) and names the inputs in errors.

    max_bytes: the most a compressed .npz body's arrays may take (the payload limit;
    None: the server's default one)."""
    kind = media_type(content_type)
    if not body:
        raise BadRequest("request body is empty")
    if kind == JSON:
        return records_from_json(parse_json(body))
    if kind == CSV:
        width = csv_columns(metadata)
        name = metadata.inputs[0].name if metadata.inputs else ""
        return records.csv(body, max_columns=width, input_name=name)
    if kind == JSONLINES:
        if len(metadata.inputs) > 1:
            return records.jsonlines_named(body, tuple(spec.name for spec in metadata.inputs))
        name = metadata.inputs[0].name if metadata.inputs else None
        return records.jsonlines(body, input_name=name)
    if kind == NPY:
        if len(metadata.inputs) > 1:
            raise BadRequest(f"this model has several inputs ({input_names(metadata)}): a .npy body holds one array; "
                             f"send them in one {NPZ} body (np.savez, one array per input name) or as JSON "
                             f'{{"inputs": {{"<name>": [...], ...}}}}')
        return npy.read(body)
    if kind == NPZ:
        arrays = npz.read(body, max_bytes if max_bytes is not None else DEFAULT_MAX_REQUEST_MB * MB)
        if len(arrays) == 1 and len(metadata.inputs) <= 1:
            # One array is the one input, whatever np.savez named it (arr_0 when unnamed).
            return next(iter(arrays.values()))
        return arrays
    raise ValueError(f"not a simple content type: {content_type}")


def parse_json(body: bytes, where: str = "request body", c_tried: bool = False):
    """The JSON document, parsed strictly. A non-empty list of records holding only
    numbers and lists (bare or under one of RECORD_KEYS) comes back as a float64
    ndarray in its place, which records_from_json takes and v2.is_v2_document refuses:
    no type check per record, and a big one is parsed in bounded slices. Anything else
    comes back as parsed, and protocols/simple.py checks and converts it record by record."""
    return records.parse_document(body, where, c_tried=c_tried)


def records_from_json(document):
    """A parsed JSON body's records: a bare list, or an object holding one under
    instances/inputs/features/data."""
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


def input_names(metadata: ModelMetadata) -> str:
    return ", ".join(spec.name for spec in metadata.inputs)


def csv_columns(metadata: ModelMetadata) -> int | None:
    """The most columns a CSV line can have for the model's one input, where its
    metadata says (the widths protocols/simple.py fits: a flat record, or a row of a
    2-D sample); None when any width may do, or the model has several inputs."""
    if len(metadata.inputs) != 1 or metadata.inputs[0].shape is None:
        return None
    sample = list(metadata.inputs[0].shape)
    if metadata.max_batch_size <= 0:
        return sample[1] if len(sample) == 2 and sample[1] >= 0 else None
    if not sample or any(d < 0 for d in sample):
        return None
    return max(math.prod(sample), sample[1] if len(sample) == 2 else 0)


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

"""The simple content types: JSON, CSV, JSON Lines and NumPy .npy.

These are what the SageMaker Python SDK's serializers send. CSV and JSON Lines carry one
record a line, and their responses carry exactly one line per record, in order, so
batch transform's `AssembleWith=Line` and `JoinSource=Input` work. Pure functions over
bytes and arrays: no Flask, no torch.
"""

from __future__ import annotations

import io
import json

import numpy as np

from .errors import BadRequest, NotAcceptable
from .metadata import ModelMetadata, TensorSpec

JSON = "application/json"
CSV = "text/csv"
JSONLINES = "application/jsonlines"
NPY = "application/x-npy"
MEDIA_TYPES = (JSON, CSV, JSONLINES, NPY)
# Other spellings clients use for the same formats.
ALIASES = {
    "application/x-jsonlines": JSONLINES,
    "application/jsonl": JSONLINES,
    "application/json-lines": JSONLINES,
    "application/npy": NPY,
    "text/plain+csv": CSV,
}
# Keys of a JSON object that hold the records, as the SageMaker and TF Serving
# conventions name them.
RECORD_KEYS = ("instances", "inputs", "features", "data")
MAX_JSON_DEPTH = 100


def media_type(content_type: str | None) -> str:
    """'text/csv; charset=utf-8' -> 'text/csv', with aliases resolved."""
    value = (content_type or "").split(";")[0].strip().lower()
    return ALIASES.get(value, value)


# ---------------------------------------------------------------- decoding


def decode(body: bytes, content_type: str, metadata: ModelMetadata) -> dict[str, np.ndarray]:
    """A request body -> named input arrays, shaped and typed for the model."""
    kind = media_type(content_type)
    if not body:
        raise BadRequest("request body is empty")
    if kind == JSON:
        return decode_json(parse_json(body), metadata)
    if kind == CSV:
        return shape_inputs(_records_from_csv(body), metadata)
    if kind == JSONLINES:
        return shape_inputs(_records_from_jsonlines(body), metadata)
    if kind == NPY:
        return shape_inputs(_array_from_npy(body), metadata)
    raise ValueError(f"not a simple content type: {content_type}")


def decode_json(document, metadata: ModelMetadata) -> dict[str, np.ndarray]:
    """An already-parsed JSON body -> named input arrays."""
    return shape_inputs(_records_from_json(document), metadata)


def parse_json(body: bytes, where: str = "request body"):
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        raise BadRequest(f"{where} is not UTF-8 text") from None
    except RecursionError:
        raise BadRequest(f"{where}: JSON nesting is too deep") from None
    except json.JSONDecodeError as e:
        raise BadRequest(f"{where} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None


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
    if isinstance(document, list):
        return document
    raise BadRequest("JSON body must be a list of records or an object holding one")


def _lines(body: bytes) -> list[str]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(f"body is not UTF-8 text (byte {e.start})") from None
    lines = text.split("\n")
    # One newline ends the last record; blank lines after it are not records.
    while lines and not lines[-1].strip():
        lines.pop()
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise BadRequest(f"line {number} is empty: each line must be one record")
    if not lines:
        raise BadRequest("request body holds no records")
    return lines


def _records_from_csv(body: bytes) -> np.ndarray:
    lines = _lines(body)
    columns = lines[0].count(",") + 1
    for number, line in enumerate(lines, start=1):
        if line.count(",") + 1 != columns:
            raise BadRequest(
                f"CSV line {number} has {line.count(',') + 1} columns, line 1 has {columns}: "
                "every record needs the same number of columns"
            )
    try:
        # numpy's C parser: no Python string per value (a 100 MB body stays ~100 MB);
        # only on failure do we look for the culprit line.
        values = np.loadtxt(io.StringIO("\n".join(lines)), delimiter=",", dtype=np.float64, ndmin=2,
                            comments=None, quotechar=None)
    except ValueError:
        for number, line in enumerate(lines, start=1):
            for column, cell in enumerate(line.split(","), start=1):
                try:
                    float(cell)
                except ValueError:
                    raise BadRequest(
                        f"CSV line {number}, column {column}: {cell.strip()[:40]!r} is not a number"
                    ) from None
        raise BadRequest("CSV body does not parse as numbers") from None
    return values.reshape(len(lines), columns)


def _records_from_jsonlines(body: bytes) -> list:
    records = []
    for number, line in enumerate(_lines(body), start=1):
        record = parse_json(line.encode("utf-8"), where=f"JSON Lines line {number}")
        if isinstance(record, dict):
            key = next((k for k in RECORD_KEYS if k in record), None)
            if key is None:
                raise BadRequest(
                    f"JSON Lines line {number}: an object record must hold its values under "
                    + " or ".join(f"'{k}'" for k in RECORD_KEYS)
                )
            record = record[key]
        records.append(record)
    try:
        return _as_array(records, "JSON Lines records")
    except BadRequest:
        # Name the first record whose shape differs from the first one's.
        first = np.shape(records[0]) if _rectangular(records[0]) else None
        for number, record in enumerate(records, start=1):
            if not _rectangular(record) or np.shape(record) != first:
                raise BadRequest(f"JSON Lines line {number}: record shape differs from line 1's") from None
        raise


def _rectangular(value) -> bool:
    try:
        np.array(value, dtype=np.float64)
        return True
    except (ValueError, TypeError, OverflowError):
        return False


def _array_from_npy(body: bytes) -> np.ndarray:
    """A view on the body. The header's shape is checked against the bytes that follow
    it first: np.load would allocate whatever shape a 100-byte body claims."""
    stream = io.BytesIO(body)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
        else:
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
    except Exception as e:  # numpy parses the header dict with Python's tokenizer: any error
        raise BadRequest(f"body is not a valid .npy array: {type(e).__name__}: {e}") from None
    if not all(isinstance(d, int) and d >= 0 for d in shape) or len(shape) > 32:
        raise BadRequest(f"the .npy header declares an invalid shape {shape!r}")
    if dtype.hasobject:
        raise BadRequest("the .npy body holds Python objects, which are never unpickled; send a numeric array")
    if dtype.kind not in "biuf":
        raise BadRequest(f"the .npy array has dtype {dtype}; send a numeric array")
    count = 1
    for dim in shape:
        count *= dim
    data = len(body) - stream.tell()
    if count * dtype.itemsize != data:
        raise BadRequest(
            f"the .npy header declares shape {list(shape)} of {dtype} ({count * dtype.itemsize} bytes) "
            f"but {data} bytes follow it"
        )
    try:
        array = np.frombuffer(body, dtype=dtype, count=count, offset=stream.tell())
        return array.reshape(shape, order="F" if fortran_order else "C")
    except (ValueError, OverflowError) as e:  # e.g. a zero-size array with absurd dimensions
        raise BadRequest(f"the .npy header declares an unusable shape {list(shape)}: {e}") from None


def _as_array(records, what: str) -> np.ndarray:
    try:
        array = np.array(records, dtype=np.float64)
    except ValueError as e:
        message = str(e)
        if "inhomogeneous" in message or "sequence" in message:
            raise BadRequest(f"{what} are ragged: every record must have the same shape") from None
        raise BadRequest(f"{what} must be numbers: {message}") from None
    except (TypeError, OverflowError) as e:
        raise BadRequest(f"{what} must be numbers: {e}") from None
    return array


def shape_inputs(records, metadata: ModelMetadata) -> dict[str, np.ndarray]:
    """Records -> the model's input(s): typed by the metadata, batched along dim 0."""
    inputs = metadata.inputs
    if len(inputs) > 1:
        return _named_inputs(records, metadata)
    spec = inputs[0] if inputs else TensorSpec("input__0", "FP32", (-1,))
    array = records if isinstance(records, np.ndarray) else _as_array(records, "records")
    return {spec.name: _fit(array, spec, metadata)}


def _named_inputs(records, metadata: ModelMetadata) -> dict[str, np.ndarray]:
    """Several inputs: {"inputs": {name: array}} or a list of {name: value} records."""
    if isinstance(records, dict):
        columns = records
    elif isinstance(records, list) and records and all(isinstance(r, dict) for r in records):
        columns = {spec.name: [r.get(spec.name) for r in records] for spec in metadata.inputs}
    else:
        names = ", ".join(spec.name for spec in metadata.inputs)
        raise BadRequest(f"this model has several inputs ({names}): send an object of named arrays")
    out = {}
    for spec in metadata.inputs:
        if spec.name not in columns or columns[spec.name] is None:
            raise BadRequest(f"missing input '{spec.name}'")
        out[spec.name] = _fit(_as_array(columns[spec.name], f"input '{spec.name}'"), spec, metadata)
    unknown = sorted(set(columns) - {spec.name for spec in metadata.inputs})
    if unknown:
        raise BadRequest(f"unexpected input {unknown[0]!r}")
    return out


def _fit(array: np.ndarray, spec: TensorSpec, metadata: ModelMetadata) -> np.ndarray:
    """Check the shape against the model's, add a missing batch dimension, cast."""
    sample = list(spec.shape)
    batched = metadata.max_batch_size > 0
    known = sample and all(d >= 0 for d in sample)
    if batched and known:
        size = int(np.prod(sample))
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
    if spec.dtype.dtype.kind in "iub" and array.dtype.kind == "f" and not np.all(np.isfinite(array) & (array == np.round(array))):
        raise BadRequest(f"input '{spec.name}' takes {spec.datatype} values; got fractional numbers")
    return np.ascontiguousarray(array, dtype=dtype)


def _matches(shape: tuple, expected: list[int]) -> bool:
    return len(shape) == len(expected) and all(e < 0 or e == s for s, e in zip(shape, expected))


# ---------------------------------------------------------------- encoding


def encode(outputs: dict[str, np.ndarray], accept: str, batched: bool = True) -> tuple[bytes, str]:
    """Named output arrays -> (body, content type) in the negotiated media type."""
    single = next(iter(outputs.values())) if len(outputs) == 1 else None
    if accept == JSON:
        if single is not None:
            return b'{"predictions":' + _json_text(single).encode() + b"}", JSON
        return _json_bytes({"predictions": _json_value(outputs, batched)}), JSON
    if accept == NPY:
        if single is None:
            raise NotAcceptable(
                f"application/x-npy holds one array and this model returns {len(outputs)}; "
                "ask for application/json"
            )
        buffer = io.BytesIO()
        np.save(buffer, single, allow_pickle=False)
        return buffer.getvalue(), NPY
    if accept in (CSV, JSONLINES):
        if single is not None and single.ndim >= 1 and _has_short_text(single):
            # One record a row: the common case, formatted without a Python float per value.
            tokens = single.reshape(len(single), -1).astype(str) if accept == CSV else single
            if accept == CSV:
                return "".join(",".join(row) + "\n" for row in tokens.tolist()).encode(), CSV
            return "".join(_json_text(record) + "\n" for record in tokens).encode(), JSONLINES
        if accept == CSV:
            return "".join(",".join(map(_csv_cell, row)) + "\n" for row in _records(outputs)).encode(), CSV
        return b"".join(_json_bytes(row) + b"\n" for row in _jsonlines_records(outputs)), JSONLINES
    raise NotAcceptable(f"cannot produce {accept}; supported: {', '.join(MEDIA_TYPES)}")


def _has_short_text(array: np.ndarray) -> bool:
    """numpy writes these dtypes as valid JSON/CSV numbers, float32 with its shortest
    round-trip digits (0.1, not 0.10000000149011612)."""
    if array.dtype.kind in "iu":
        return True
    return array.dtype.kind == "f" and bool(np.isfinite(array).all())


def _json_text(array: np.ndarray) -> str:
    if not _has_short_text(array):
        return json.dumps(_tolist(array), separators=(",", ":"), allow_nan=True)
    return _nested(array.astype(str))


def _nested(tokens: np.ndarray) -> str:
    if tokens.ndim == 0:
        return str(tokens)
    if tokens.ndim == 1:
        return "[" + ",".join(tokens.tolist()) + "]"
    return "[" + ",".join(_nested(t) for t in tokens) + "]"


def _json_bytes(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=True).encode()


def _json_value(outputs: dict[str, np.ndarray], batched: bool):
    lists = {name: _tolist(array) for name, array in outputs.items()}
    if len(lists) == 1:
        return next(iter(lists.values()))
    if batched and _same_rows(outputs):
        names = list(lists)
        return [dict(zip(names, values)) for values in zip(*lists.values())]
    return lists


def _tolist(array: np.ndarray):
    if array.dtype == object or array.dtype.kind in "SU":
        return np.vectorize(_text, otypes=[object])(array).tolist() if array.size else array.tolist()
    return array.tolist()


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _same_rows(outputs: dict[str, np.ndarray]) -> bool:
    rows = {a.shape[0] if a.ndim else None for a in outputs.values()}
    return len(rows) == 1 and None not in rows


def _records(outputs: dict[str, np.ndarray]) -> list[list]:
    """One flat row per record: each output's values for that record, side by side."""
    if not _same_rows(outputs):
        raise NotAcceptable("the model's outputs do not share a batch dimension; ask for application/json")
    flat = [array.reshape(array.shape[0], -1) for array in outputs.values()]
    joined = flat[0] if len(flat) == 1 else np.concatenate([f.astype(object) for f in flat], axis=1)
    return _tolist(joined)


def _jsonlines_records(outputs: dict[str, np.ndarray]) -> list:
    if not _same_rows(outputs):
        raise NotAcceptable("the model's outputs do not share a batch dimension; ask for application/json")
    if len(outputs) == 1:
        return _tolist(next(iter(outputs.values())))
    names = list(outputs)
    return [dict(zip(names, values)) for values in zip(*(_tolist(a) for a in outputs.values()))]


def _csv_cell(value) -> str:
    if isinstance(value, str):
        return '"' + value.replace('"', '""') + '"' if any(c in value for c in ',"\n') else value
    if isinstance(value, list):
        return _csv_cell(json.dumps(value))
    return repr(value) if isinstance(value, float) else str(value)

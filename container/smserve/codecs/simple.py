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

.npy is read as a view on the body (no copy) and written as header + buffer. numpy's own
reader parses the header dict with `ast.literal_eval` (safe, but a cost every small
request pays) and np.load would allocate whatever shape a tiny body claims. Here the
header numpy writes, `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }`, is
matched by a strict pattern: a plain dtype string, a bool, a tuple of integers, and
nothing else. Anything else (another writer's spelling) goes to numpy's reader, which
evaluates literals only; object and structured dtypes are refused either way, so nothing
from a request is ever unpickled. An .npz body's members (npz.py) are read the same way.
"""

from __future__ import annotations

import io
import math
import re
import struct

import numpy as np

from smserve import memo
from smserve.codecs import npz, records, textout
from smserve.codecs.limits import MAX_DIMS
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
        return read_npy(body)
    if kind == NPZ:
        arrays = read_npz(body, max_bytes if max_bytes is not None else DEFAULT_MAX_REQUEST_MB * MB)
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
            return write_npy(np.asarray(single)), NPY
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


# ---------------------------------------------------------------- .npy and .npz


def read_npz(body: bytes, max_bytes: int) -> dict[str, np.ndarray]:
    """An .npz body -> {name: array}, in the archive's order: each member read as a .npy
    body is (read_npy), the archive's arrays inflated into at most max_bytes."""
    arrays: dict[str, np.ndarray] = {}
    for name, data in npz.members(body, max_bytes):
        try:
            arrays[name] = read_npy(data)
        except BadRequest as e:
            raise BadRequest(f"the .npz member {(name + '.npy')[:80]!r}: {e.message}") from None
    return arrays


NPY_MAGIC = b"\x93NUMPY"
# numpy >= 1.14 pads the header so the data starts on a 64-byte boundary.
_NPY_ALIGN = 64
# No real dimension has more digits than this (2**64 has 20).
_MAX_DIM_DIGITS = 20
_NPY_DESCR = r"""(?P<q>['"])(?P<descr>[<>|=]?[biuf][1-8])(?P=q)"""
_NPY_ORDER = r"(?P<order>True|False)"
_NPY_SHAPE = r"\((?P<shape>\s*(?:\d+\s*,\s*)*(?:\d+\s*)?)\)"
_NPY_ENTRIES = {
    "descr": _NPY_DESCR,
    "fortran_order": _NPY_ORDER,
    "shape": _NPY_SHAPE,
}
# numpy's order (keys sorted); other orders go to numpy's reader. No two quantifiers
# here may take the same byte (as `\s*,?\s*` would): the match stays linear in the
# header's length, whatever a client pads it with.
_NPY_HEADER = re.compile(
    r"\{\s*"
    + r"\s*,\s*".join(rf"""['"]{key}['"]\s*:\s*{value}""" for key, value in _NPY_ENTRIES.items())
    + r"\s*(?:,\s*)?\}\s*"
)


# A client sends one shape and dtype again and again, so each header's parse (and each
# answer's header) is kept: a look-up instead of parsing and formatting each time.
# Cleared when full, so a client varying its shapes costs memory for this many.
NPY_HEADERS_KEPT = 256
_npy_parsed: dict[bytes, tuple] = {}
_npy_written: dict[tuple, bytes] = {}


def read_npy(body: bytes) -> np.ndarray:
    """A .npy body -> an array viewing the body's bytes (numeric dtypes only)."""
    key = _npy_header_bytes(body)
    known = _npy_parsed.get(key) if key is not None else None
    if known is None:
        known = _checked_npy_header(body)
        if key is not None:
            memo.keep(_npy_parsed, key, known, NPY_HEADERS_KEPT)
    shape, fortran_order, dtype, offset, count = known
    data = len(body) - offset
    if count * dtype.itemsize != data:
        raise BadRequest(
            f"the .npy header declares shape {list(shape)} of {dtype} ({count * dtype.itemsize} bytes) "
            f"but {data} bytes follow it"
        )
    try:
        array = np.frombuffer(body, dtype=dtype, count=count, offset=offset)
        return array.reshape(shape, order="F" if fortran_order else "C")
    except (ValueError, OverflowError) as e:  # e.g. a zero-size array with absurd dimensions
        raise BadRequest(f"the .npy header declares an unusable shape {list(shape)}: {e}") from None


def _npy_header_bytes(body: bytes) -> bytes | None:
    """The magic, version 1.0 and header of a body as bytes (what the parse is kept
    under), or None for any other version or a body too short to hold them."""
    if len(body) < 10 or body[6:8] != b"\x01\x00":
        return None
    end = 10 + (body[8] | body[9] << 8)
    return bytes(body[:end]) if end <= len(body) else None


def _checked_npy_header(body: bytes) -> tuple[tuple, bool, np.dtype, int, int]:
    """The header parsed and checked: shape, Fortran order, dtype, data offset, count."""
    shape, fortran_order, dtype, offset = _parse_npy_header(body)
    # type(), not isinstance: True and False are ints to isinstance, and no dimension.
    if not all(type(d) is int and d >= 0 for d in shape) or len(shape) > MAX_DIMS:
        raise BadRequest(f"the .npy header declares an invalid shape {shape!r}")
    if dtype.hasobject:
        raise BadRequest("the .npy body holds Python objects, which are never unpickled; send a numeric array")
    if dtype.kind not in "biuf":
        raise BadRequest(f"the .npy array has dtype {dtype}; send a numeric array")
    count = 1
    for dim in shape:
        count *= dim
    return shape, fortran_order, dtype, offset, count


def _parse_npy_header(body: bytes) -> tuple[tuple, bool, np.dtype, int]:
    if body[:6] != NPY_MAGIC or len(body) < 10:
        raise BadRequest("body is not a valid .npy array: it does not start with the .npy magic string")
    major = body[6]
    if major == 1:
        (length,), start = struct.unpack_from("<H", body, 8), 10
    elif major in (2, 3):
        if len(body) < 12:
            raise BadRequest("body is not a valid .npy array: the header is cut short")
        (length,), start = struct.unpack_from("<I", body, 8), 12
    else:
        raise BadRequest(f"body is not a valid .npy array: unknown format version {major}.{body[7]}")
    end = start + length
    if end > len(body):
        raise BadRequest("body is not a valid .npy array: the header is cut short")
    try:
        text = body[start:end].decode("utf-8" if major == 3 else "latin1")
    except UnicodeDecodeError:
        raise BadRequest("body is not a valid .npy array: the header is not UTF-8") from None
    match = _NPY_HEADER.fullmatch(text)
    if match is None:
        return (*_numpy_header(body), end)
    dims = match["shape"].replace(",", " ").split()
    if any(len(d) > _MAX_DIM_DIGITS for d in dims):  # (int() refuses 4,300+ digits: ValueError)
        raise BadRequest(f"the .npy header declares an invalid shape ({match['shape'][:40]}...)")
    shape = tuple(int(d) for d in dims)
    try:
        dtype = np.dtype(match["descr"])
    except TypeError:  # a size numpy lacks: '<f5', '<i3'
        raise BadRequest(f"the .npy header declares a dtype numpy does not have: {match['descr']!r}") from None
    return shape, match["order"] == "True", dtype, end


def _numpy_header(body: bytes) -> tuple[tuple, bool, np.dtype]:
    """numpy's reader (literal evaluation only) for headers spelt another way."""
    stream = io.BytesIO(body)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(stream)
        return np.lib.format.read_array_header_2_0(stream)
    except Exception as e:  # any malformed header: numpy raises many kinds
        raise BadRequest(f"body is not a valid .npy array: {type(e).__name__}: {e}") from None


def npy_header(array: np.ndarray) -> bytes:
    """The .npy header np.save writes for a C-ordered array of this dtype and shape."""
    key = (array.dtype, array.shape)
    made = _npy_written.get(key)
    if made is None:
        made = memo.keep(_npy_written, key, _make_npy_header(array), NPY_HEADERS_KEPT)
    return made


def _make_npy_header(array: np.ndarray) -> bytes:
    descr = np.lib.format.dtype_to_descr(array.dtype)
    shape = "(" + "".join(f"{d}, " for d in array.shape)[:-2] + ("," if array.ndim == 1 else "") + ")"
    text = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {shape}, }}"
    # magic(6) + version(2) + length(2) + text + padding + "\n", a multiple of _NPY_ALIGN.
    size = len(text) + 1
    pad = -(10 + size) % _NPY_ALIGN
    if size + pad > 0xFFFF:  # only arrays of many dimensions need format 2.0
        pad = -(12 + size) % _NPY_ALIGN
        return NPY_MAGIC + b"\x02\x00" + struct.pack("<I", size + pad) + (text + " " * pad + "\n").encode("latin1")
    return NPY_MAGIC + b"\x01\x00" + struct.pack("<H", size + pad) + (text + " " * pad + "\n").encode("latin1")


def write_npy(array: np.ndarray) -> bytes:
    """One .npy body: header + the array's memory, in one join (one copy of the data)."""
    if array.dtype.hasobject or array.dtype.kind not in "biufc":
        raise ValueError(f"an array of dtype {array.dtype} has no .npy form without pickling")
    if not array.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
        array = array.copy(order="C")
    return b"".join((npy_header(array), array.reshape(-1).view(np.uint8).data))

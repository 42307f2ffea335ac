"""The simple types on /invocations: JSON tensors as the SageMaker SDK sends them (or a
whole KServe v2 JSON request, recognised by its `inputs` list), CSV, JSON Lines, .npy and
.npz. The body is decoded (codecs/simple.py), its records fitted to the model's inputs
(named, shaped and typed by its metadata), the model run, and the outputs answered in
the type the Accept chooses, line formats pass by pass.

A finite value too big for the input's float type (1e39 for an FP32 input) is a 400, not
a silent infinity; so is a value an integer or BOOL input cannot hold (2.5, 300 for
UINT8, 2 for BOOL). Either names the first record that holds one (1-based along
dimension 0: a CSV or JSON Lines body's line number) and the value."""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from smserve.codecs import records, simple, slices, v2
from smserve.codecs.limits import MAX_DIMS
from smserve.core import media
from smserve.core.inference import InferenceRequest
from smserve.core.metadata import ModelMetadata, TensorSpec
from smserve.core.reply import Reply, is_stream
from smserve.engine.worker.served import ServedModel
from smserve.errors import BadRequest, NotAcceptable, ServerError
from smserve.protocols.kserve_v2 import v2_reply
from smserve.protocols.message import Message, Protocol, default_accept, nbytes, negotiate, predict_context, writing
from smserve.protocols.streams import streamed_reply
from smserve.settings import Settings

# Answers of one line per record, which can leave pass by pass.
LINE_TYPES = (media.CSV, media.JSONLINES)


class Json(Protocol):
    """`application/json`: simple tensors as the SageMaker SDK sends them, or a whole
    KServe v2 JSON request (recognised by its `inputs` list of named tensors)."""

    name = "json"
    kinds = (media.JSON,)

    def answer(self, message, server, settings):
        body = message.body
        if not body:
            raise BadRequest("request body is empty")
        # Flat numeric records, the usual body, are read on the loop whatever their size
        # (up to the sliced reader's 1 MB): simdjson's C reader holds the GIL, so a codec
        # thread would not free the loop meanwhile, and the hop to it would cost more
        # than shaping the array. Any other body goes to a codec thread when it is big.
        found = records.c_records(body)
        if found is not None:
            return simple_reply(server, settings, message, json_inputs(found, server.metadata))
        decoded = server.pools.offload(len(body), _decode_json, body, server.metadata, True)
        if isinstance(decoded, InferenceRequest):
            return v2_reply(server, decoded, sagemaker=True, message=message)
        return simple_reply(server, settings, message, decoded)


class Simple(Protocol):
    """CSV, JSON Lines, .npy and .npz: one record a line (or arrays), answered by Accept."""

    name = "simple"
    kinds = (media.CSV, media.JSONLINES, media.NPY, media.NPZ)

    def answer(self, message, server, settings):
        inputs = server.pools.offload(len(message.body), decode_inputs, message.body, message.content_type,
                                      server.metadata, settings.max_body_bytes)
        return simple_reply(server, settings, message, inputs)


def decode_builtin(body: bytes, content_type: str, metadata, max_bytes: int):
    """A simple type's body as named arrays for the model's hooks; a KServe v2 JSON
    document as its InferenceRequest (answered as v2)."""
    if media.media_type(content_type) == media.JSON:
        return _decode_json(body, metadata)
    return decode_inputs(body, content_type, metadata, max_bytes)


def decode_inputs(body: bytes, content_type: str, metadata: ModelMetadata, max_bytes: int | None = None
                  ) -> dict[str, np.ndarray]:
    """A simple type's body -> the model's inputs: decoded, then fitted (shape_inputs).
    max_bytes: as codecs.simple.decode takes it."""
    return shape_inputs(simple.decode(body, content_type, metadata, max_bytes), metadata)


def json_inputs(document, metadata: ModelMetadata) -> dict[str, np.ndarray]:
    """An already-parsed JSON body (codecs.simple.parse_json) -> the model's inputs."""
    return shape_inputs(simple.records_from_json(document), metadata)


def _decode_json(body: bytes, metadata, c_tried: bool = False):
    try:
        document = simple.parse_json(body, c_tried=c_tried)
    except BadRequest as e:
        raise BadRequest(
            f"{e.message} (if binary tensors follow a JSON header, give the header's length in "
            f"'{v2.SAGEMAKER_BINARY_CONTENT_TYPE}N' or the {v2.HEADER_LENGTH_HEADER} header)"
        ) from None
    if v2.is_v2_document(document):
        return v2.decode_json_request(document, metadata)
    return json_inputs(document, metadata)


def encode_simple(outputs, accept: str, labels=None, wrapped: bool = True):
    """simple.encode, its failures on a model's outputs answered as such."""
    with writing(accept):
        return simple.encode(outputs, accept, labels, wrapped)


def simple_reply(server: ServedModel, settings: Settings, message: Message, inputs) -> Reply:
    try:
        accept, refusal = negotiate(message.accept, default_accept(settings, message.kind)), None
    except NotAcceptable as e:
        if not server.traits.may_stream:
            raise
        # Only what predict_fn returns tells whether a stream type would do.
        accept, refusal = None, e
    labels = answer_labels(message.accept, accept, server.metadata) if refusal is None else None
    wrapped = message.kind == media.JSON and simple.wraps_records(message.body, message.content_type)
    offload = server.pools.offload
    if accept in LINE_TYPES and server.passes(inputs) > 1:
        # Many records in a line format: each pass's lines leave as the pass ends, so
        # the first lines go out before the last pass runs. The first pass runs before
        # the status line is sent: a model that fails on it gets its 500 (the worker
        # sends nothing until the body's first bytes exist, and then it is too late).
        by_pass = server.infer_by_pass(inputs)
        first = next(by_pass)
        if is_stream(first):  # (a predict_fn that streams: the whole request's one iterator)
            return streamed_reply(server, message, first)
        payload, _ = offload(nbytes(first), encode_simple, first, accept, labels)
        return Reply(_resumed(payload, _lines_by_pass(server, by_pass, accept, labels)), {"Content-Type": accept})
    outputs = server.infer(inputs, predict_context(server, message))
    if is_stream(outputs):
        return streamed_reply(server, message, outputs)
    if refusal is not None:
        raise refusal
    payload, media_type = offload(nbytes(outputs), encode_simple, outputs, accept, labels, wrapped)
    return Reply(payload, {"Content-Type": media_type})


def _lines_by_pass(server: ServedModel, by_pass, accept: str, labels) -> Iterator[bytes]:
    """The lines of the passes after the first. (Closed before it starts, by_pass is
    closed as it is let go of.)"""
    try:
        for outputs in by_pass:
            if is_stream(outputs):
                server.close_stream(outputs)
                raise ServerError("predict_fn returned an iterator for a pass of a request whose first pass it "
                                  "answered with arrays: a streamed answer must come from one call")
            payload, _ = server.pools.offload(nbytes(outputs), encode_simple, outputs, accept, labels)
            yield payload
    finally:
        by_pass.close()


def _resumed(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    """first, then the rest; closing it closes the rest (a client that left stops the passes)."""
    try:
        yield first
        yield from rest
    finally:
        rest.close()


def answer_labels(header: str | None, chosen: str, metadata) -> dict[str, tuple[str, ...]] | None:
    """The outputs' class labels when the Accept entry that chose `chosen` asks for
    them (`application/json; labels=true`); None when it does not. Asked of a model
    whose metadata.json gives no labels: 406, so the client learns why none came."""
    if not header or "labels" not in header.lower():
        return None
    family = chosen.split("/")[0] + "/*"
    for entry in header.split(","):
        kind, _, parameters = entry.partition(";")
        if media.media_type(kind) not in (chosen, family, "*/*"):
            continue
        if any(p.strip().lower().replace(" ", "") == "labels=true" for p in parameters.split(";")):
            labels = {spec.name: spec.labels for spec in metadata.outputs if spec.labels}
            if not labels:
                raise NotAcceptable("labels=true: this model's metadata.json gives no output labels")
            return labels
    return None


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


def _named_inputs(records, metadata: ModelMetadata) -> dict[str, np.ndarray]:
    """Inputs by name: {"inputs": {name: array}} or a list of {name: value} records."""
    if isinstance(records, dict):
        columns = records
    elif _named(records):
        columns = {spec.name: _column(records, spec.name) for spec in metadata.inputs}
    else:
        example = ", ".join(f'"{spec.name}": [...]' for spec in metadata.inputs)
        raise BadRequest(f"this model has several inputs ({simple.input_names(metadata)}): send them by name, "
                         f'{{"inputs": {{{example}}}}} or {{"instances": [{{{example}}}, ...]}} '
                         f"(JSON), one such object a line (JSON Lines), or {media.NPZ}")
    out = {}
    for spec in metadata.inputs:
        if spec.name not in columns or columns[spec.name] is None:
            raise BadRequest(f"missing input '{spec.name}'")
        out[spec.name] = _fit(_as_array(columns[spec.name], f"input '{spec.name}'"), spec, metadata)
    unknown = sorted(set(columns) - {spec.name for spec in metadata.inputs})
    if unknown:
        raise BadRequest(f"unexpected input {unknown[0]!r}")
    return out


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

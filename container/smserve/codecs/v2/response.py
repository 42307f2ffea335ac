"""KServe v2 responses: the model's results -> InferenceResponse -> bytes.

build_response selects, orders and classifies outputs as the request asked (Triton's
rules: PROTOCOL.md 2.7-2.8); encode_response writes compact JSON, then each binary
output's bytes in output order.
"""

from __future__ import annotations

import math

import numpy as np

from smserve.codecs import textout
from smserve.codecs.v2.tensors import json_data, to_binary
from smserve.core import datatypes
from smserve.core.inference import InferenceRequest, InferenceResponse, OutputTensor
from smserve.core.metadata import ModelMetadata
from smserve.errors import BadRequest, ServerError

# A top-k over more values than this is refused rather than sorted (Triton's limit).
_MAX_CLASSIFICATION_ELEMENTS = 1_000_000
_UNSUPPORTED_CLASSIFICATION = ("BOOL", "FP16", "BF16", "BYTES")


def build_response(
    request: InferenceRequest, results: dict[str, np.ndarray], metadata: ModelMetadata
) -> InferenceResponse:
    """Select, order, encode-kind and classify the model's results as the request asked."""
    if request.outputs is None:
        # The declared outputs in their order, then any other the model returned (a
        # TorchScript model's derived metadata knows only output__0 of its tuple): the
        # simple protocols answer every output, and so does this.
        declared = [t.name for t in metadata.outputs]
        names = declared + [name for name in results if name not in declared]
        # Unlisted outputs follow `binary_data_output`; a raw request gets only binary.
        wanted = [(name, request.raw or request.binary_output, 0) for name in names]
    else:
        # A listed output is JSON unless it asks for binary, whatever `binary_data_output` says.
        wanted = [(o.name, request.raw or bool(o.binary), o.classification) for o in request.outputs]
    outputs = []
    for name, binary, classes in wanted:
        if name not in results:
            raise ServerError(f"model '{metadata.name}' did not produce output '{name}'")
        spec = metadata.output(name)
        datatype = spec.datatype if spec is not None else _datatype_of(results[name], name)
        array = _output_array(results[name], datatype, name)
        if classes > 0:
            labels = spec.labels if spec is not None else None
            array = _classify(array, datatype, classes, labels, metadata.max_batch_size > 0, name)
            datatype = "BYTES"
        if not binary:
            array = _json_ready(array, datatype, name)
        outputs.append(OutputTensor(name=name, datatype=datatype, data=array, binary=binary))
    return InferenceResponse(
        model_name=metadata.name,
        model_version=metadata.version,
        outputs=outputs,
        id=request.id,
    )


def _datatype_of(value: object, name: str) -> str:
    try:
        return datatypes.from_numpy(np.asarray(value).dtype).name
    except TypeError as e:
        raise ServerError(f"output '{name}': {e}") from None


def _output_array(value: object, datatype: str, name: str) -> np.ndarray:
    """The model's result as the array its declared datatype travels as."""
    dt = datatypes.BY_NAME[datatype]
    array = np.asarray(value)
    if dt.is_bytes:
        if array.dtype.kind not in "OSU":
            raise ServerError(f"output '{name}' is declared BYTES but the model returned {array.dtype}")
        return array
    if array.dtype == dt.dtype:
        return array
    # Widening or narrowing within a kind is fine (float64 -> FP32); float -> int is not.
    if not np.can_cast(array.dtype, dt.dtype, casting="same_kind"):
        raise ServerError(f"output '{name}' is declared {datatype} but the model returned {array.dtype}")
    return array.astype(dt.dtype)


def _classify(
    array: np.ndarray, datatype: str, k: int, labels: tuple[str, ...] | None, batching: bool, name: str
) -> np.ndarray:
    """Top-k "<value>:<index>[:<label>]" strings per sample, highest value first."""
    if datatype in _UNSUPPORTED_CLASSIFICATION:
        raise BadRequest(f"class result not available for output '{name}' due to unsupported type '{datatype}'")
    if array.size > _MAX_CLASSIFICATION_ELEMENTS:
        raise BadRequest(f"classification output tensor too large for output '{name}'")
    if batching:
        if array.ndim == 0:
            raise ServerError(f"output '{name}' of a batching model has no batch dimension")
        rows = array.reshape(array.shape[0], math.prod(array.shape[1:]))
    else:
        rows = array.reshape(1, array.size)
    n = rows.shape[1]
    k = min(k, n)
    # Stable sort of the reversed rows, then reversed back: descending values with ties
    # in ascending index order, so equal scores list the lower class first.
    ascending = np.argsort(rows[:, ::-1], axis=1, kind="stable")
    top = (n - 1) - ascending[:, ::-1][:, :k]
    values = np.take_along_axis(rows, top, axis=1)
    # std::to_string: "%f" for floating point, plain digits for integers.
    fmt = "%f".__mod__ if rows.dtype.kind == "f" else str
    out = np.empty(top.shape, dtype=object)
    for r, (row_values, row_top) in enumerate(zip(values.tolist(), top.tolist())):
        for c, (value, index) in enumerate(zip(row_values, row_top)):
            text = f"{fmt(value)}:{index}"
            if labels is not None and index < len(labels):
                text += f":{labels[index]}"
            out[r, c] = text.encode("utf-8")
    return out if batching else out.reshape(k)


def _json_ready(array: np.ndarray, datatype: str, name: str) -> np.ndarray:
    """Refuse what JSON cannot carry; BYTES become str so encoding cannot fail later."""
    if not datatypes.BY_NAME[datatype].json_ok:
        raise BadRequest(
            f"sending {datatype} data via JSON is not supported. Please use the binary data format for output '{name}'"
        )
    if datatype != "BYTES":
        return array
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    try:
        for i, value in enumerate(array.reshape(-1).tolist()):
            flat[i] = value.decode("utf-8") if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError:
        raise BadRequest(
            f"output '{name}' holds bytes that are not UTF-8, which JSON cannot carry; "
            "request it with 'binary_data': true"
        ) from None
    return out


def encode_response(response: InferenceResponse) -> tuple[bytes, int | None]:
    """The response body and its JSON header's length; None when the body is only JSON.

    Compact JSON, then each binary output's bytes in output order. Zero-size binary
    outputs declare binary_data_size 0 and add no bytes; with no bytes at all the
    response is plain JSON, as Triton sends it.
    """
    head: dict = {}
    if response.id:
        head["id"] = response.id
    head["model_name"] = response.model_name
    head["model_version"] = response.model_version
    if response.parameters:
        head["parameters"] = response.parameters
    # The header as pieces joined once: each whole-body copy of a big JSON answer
    # holds the GIL while /ping waits.
    header = [textout.dumps(head)[:-1], b',"outputs":[']
    blobs = []
    for tensor in response.outputs:
        entry = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.data.shape)}
        if tensor.binary:
            blob = to_binary(tensor.data, tensor.datatype)
            entry["parameters"] = {"binary_data_size": blob.nbytes}
            if blob.nbytes:
                blobs.append(blob)
            header.append(textout.dumps(entry))
        else:
            # The data, often most of the body, is written a bounded slice at a time.
            header += [textout.dumps(entry)[:-1], b',"data":', *json_data(tensor.data, tensor.datatype), b"}"]
        header.append(b",")
    if response.outputs:
        header.pop()
    header.append(b"]}")
    # Non-ASCII names and ids go out as UTF-8; ones with lone surrogates (which UTF-8
    # cannot carry) are escaped by textout.dumps' fallback, so encoding never fails.
    if not blobs:
        return b"".join(header), None
    # One copy of each tensor: straight from its memory into the body.
    # (The header's pieces are bytes and byte memoryviews: len is their size.)
    return b"".join([*header, *blobs]), sum(map(len, header))



def encode_error(message: str) -> bytes:
    """The `{"error":"..."}` body every v2 error carries (compact, as Triton's clients grep it)."""
    return textout.dumps({"error": message})


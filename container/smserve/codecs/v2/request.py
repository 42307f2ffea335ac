"""KServe v2 requests: a JSON document (and the binary tensors after it) -> InferenceRequest.

The rules, limits and error wording follow Triton (PROTOCOL.md), with one deliberate
difference: every malformed request is a BadRequest (400), where Triton answers JSON
type errors with 500. Messages Triton words without naming the tensor get
" for input '<name>'" appended, so the client learns which tensor broke the rule.
"""

from __future__ import annotations

import numpy as np
import orjson

from smserve.codecs.limits import MAX_DIMS, MAX_JSON_DEPTH
from smserve.codecs.v2 import plans
from smserve.codecs.v2.header import HEADER_LENGTH_HEADER, SAGEMAKER_BINARY_CONTENT_TYPE
from smserve.codecs.v2.raw import decode_raw
from smserve.codecs.v2.tensors import dims_text, element_count, from_binary, json_input
from smserve.core import datatypes
from smserve.core.inference import InferenceRequest, RequestedOutput
from smserve.core.metadata import ModelMetadata, TensorSpec
from smserve.errors import BadRequest

# Parameter keys Triton keeps for itself; request parameters must not use the prefix.
_RESERVED_PREFIX = "triton_"


def decode_request(
    body: bytes | bytearray | memoryview, header_length: int | None, metadata: ModelMetadata
) -> InferenceRequest:
    """Decode a v2 request.

    header_length None: the whole body is the JSON document. 0: a raw binary request,
    the whole body is the model's one input. N: a JSON header of N bytes, then the
    binary inputs' bytes in the order the inputs are listed. An empty body is raw, as
    in Triton (its header length defaults to the body's length, 0).
    """
    view = memoryview(body)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    if header_length == 0 or (header_length is None and len(view) == 0):
        return decode_raw(view, metadata)
    length = len(view) if header_length is None else header_length
    if length < 0:
        raise BadRequest(f"inference header size should be in range (0, {len(view)}), got: {length}")
    if length > len(view):
        raise BadRequest(f"unexpected size for request JSON, expecting {length - len(view)} more bytes")
    key = plans.key_of(view, length, header_length)
    if key is not None:
        request = plans.planned(key, metadata, view, length)
        if request is not None:
            return request
    decoder = _Decoder(_parse_json(view[:length], header_length is None), view, length, header_length is not None,
                       metadata)
    request = decoder.request()
    if key is not None and decoder.binary is not None:
        plans.keep(key, metadata, decoder.binary, length, request)
    return request


def is_v2_document(doc: object) -> bool:
    """A JSON body whose `inputs` lists tensor objects is KServe v2, not simple JSON."""
    inputs = doc.get("inputs") if isinstance(doc, dict) else None
    return isinstance(inputs, list) and (not inputs or all(isinstance(i, dict) for i in inputs))


def decode_json_request(doc: dict, metadata: ModelMetadata) -> InferenceRequest:
    """A v2 request whose whole body is JSON, already parsed (by a caller that had to
    look inside to tell v2 from simple JSON)."""
    return _Decoder(doc, memoryview(b""), 0, False, metadata).request()


def _parse_json(raw: memoryview, whole_body: bool) -> dict:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        if e.msg.startswith("str is not valid UTF-8"):
            try:
                str(raw, "utf-8")
            except UnicodeDecodeError as bad:
                raise BadRequest(f"failed to parse the request JSON buffer: invalid UTF-8 at {bad.start}") from None
        if "depth" in e.msg or "recursion" in e.msg:
            raise BadRequest(f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH})") from None
        message = f"failed to parse the request JSON buffer: {e.msg} at {e.pos}"
        if e.msg == "unexpected content after document" and whole_body:
            # The usual cause (Triton issues #1822, #4244): binary tensors appended
            # without telling the server where the JSON ends.
            message += (
                f" (Extra data); binary data after the JSON needs the JSON's length in '{HEADER_LENGTH_HEADER}'"
                f" or in the Content-Type '{SAGEMAKER_BINARY_CONTENT_TYPE}<N>'"
            )
        raise BadRequest(message) from None
    if not isinstance(doc, dict):
        raise BadRequest("failed to parse the request JSON buffer: the request must be a JSON object")
    return doc


class _Decoder:
    """One JSON request's walk; holds the cursor into the binary part of the body."""

    def __init__(self, doc: dict, view: memoryview, offset: int, has_header_length: bool, metadata: ModelMetadata):
        self.doc = doc
        self.view = view
        self.offset = offset
        self.has_header_length = has_header_length
        self.metadata = metadata
        self.model = metadata.name
        # Metadata without inputs (or outputs) knows nothing to check names against.
        self.check_inputs = bool(metadata.inputs)
        self.check_outputs = bool(metadata.outputs)
        # The binary inputs as read (name, datatype, shape, count, size); None once an
        # input's data is in the JSON.
        self.binary: list[tuple] | None = []

    def request(self) -> InferenceRequest:
        doc = self.doc
        request_id = doc.get("id")
        if "id" in doc and not isinstance(request_id, str):
            raise BadRequest("Unable to parse 'id': attempt to access JSON non-string as string")
        binary_output, parameters = _request_parameters(doc)
        inputs, dtypes = self._inputs()
        outputs = self._outputs()
        return InferenceRequest(
            inputs=inputs,
            datatypes=dtypes,
            outputs=outputs,
            binary_output=binary_output,
            raw=False,
            id=request_id,
            parameters=parameters,
        )

    # -- inputs --------------------------------------------------------------------

    def _inputs(self) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        if "inputs" not in self.doc:
            raise BadRequest("Unable to parse 'inputs': attempt to access non-existing object member 'inputs'")
        items = self.doc["inputs"]
        if not isinstance(items, list):
            raise BadRequest("Unable to parse 'inputs': attempt to access JSON non-array as array")
        arrays: dict[str, np.ndarray] = {}
        dtypes: dict[str, str] = {}
        batch: tuple[str, int] | None = None
        for item in items:
            name, array, datatype = self._input(item, arrays)
            arrays[name] = array
            dtypes[name] = datatype
            # The batcher concatenates along dimension 0, so all inputs must agree on it.
            if self.metadata.max_batch_size > 0 and array.ndim > 0:
                if batch is None:
                    batch = (name, array.shape[0])
                elif array.shape[0] != batch[1]:
                    raise BadRequest(
                        f"input '{name}' batch size does not match other inputs for '{self.model}': "
                        f"{array.shape[0]} but input '{batch[0]}' has {batch[1]}"
                    )
        if self.offset != len(self.view):
            raise BadRequest(f"unexpected additional input data for model '{self.model}'")
        if self.check_inputs:
            missing = [t.name for t in self.metadata.inputs if t.name not in arrays]
            if missing:
                raise BadRequest(
                    f"expected {len(self.metadata.inputs)} inputs but got {len(arrays)} inputs for model "
                    f"'{self.model}'. Got input(s) {_quoted(arrays)}, but missing required input(s) "
                    f"{_quoted(missing)}. Please provide all required input(s)."
                )
        return arrays, dtypes

    def _input(self, item: object, seen: dict) -> tuple[str, np.ndarray, str]:
        if not isinstance(item, dict):
            raise BadRequest("Unable to parse 'inputs': each input must be a JSON object")
        name = item.get("name")
        if not isinstance(name, str):
            raise BadRequest("Unable to parse 'name': attempt to access JSON non-string as string")
        parameters = item.get("parameters", {})
        if not isinstance(parameters, dict):
            raise BadRequest(f"Unable to parse 'parameters': attempt to access JSON non-object as object for input '{name}'")
        _check_content_fields(item, parameters, name)
        if "shared_memory_region" in parameters:
            raise BadRequest(f"input '{name}': shared memory is not supported; send the tensor as 'data' or as binary")
        if name in seen:
            raise BadRequest(f"input '{name}' already exists in request")

        spec = self.metadata.input(name)
        if spec is None and self.check_inputs:
            raise BadRequest(f"unexpected inference input '{name}' for model '{self.model}'")
        datatype = item.get("datatype")
        if not isinstance(datatype, str):
            raise BadRequest(f"Unable to parse 'datatype': attempt to access JSON non-string as string for input '{name}'")
        if spec is not None and datatype != spec.datatype:
            raise BadRequest(
                f"inference input '{name}' data-type is '{datatype}', but model '{self.model}' expects '{spec.datatype}'"
            )
        dt = datatypes.by_name(datatype)
        if dt is None:
            raise BadRequest(f"invalid datatype for input {name}")
        shape = _shape_field(item, name)
        if spec is not None:
            self._check_shape(shape, spec, name)
        count = element_count(shape, dt, name)

        if "binary_data_size" in parameters:
            array = self._binary_input(parameters["binary_data_size"], dt, shape, count, name)
        else:
            array = json_input(item["data"], dt, shape, count, name)
            self.binary = None
        return name, array, datatype

    def _check_shape(self, shape: list[int], spec: TensorSpec, name: str) -> None:
        expected = self.metadata.full_shape(spec)
        if expected is None:  # not known: any shape, with the batch dimension of a batching model
            expected = [-1] if self.metadata.max_batch_size > 0 and not shape else shape
        if len(shape) != len(expected) or any(e >= 0 and e != s for e, s in zip(expected, shape)):
            raise BadRequest(
                f"unexpected shape for input '{name}' for model '{self.model}'. "
                f"Expected {dims_text(expected)}, got {dims_text(shape)}"
            )

    def _binary_input(self, size: object, dt: datatypes.DataType, shape: list[int], count: int, name: str) -> np.ndarray:
        if type(size) is not int or size < 0:
            raise BadRequest(f"Unable to parse 'binary_data_size' for input '{name}'")
        available = len(self.view) - self.offset
        if size > available:
            if not self.has_header_length:
                raise BadRequest(
                    f"input '{name}' is sent as binary data, so the request must give the JSON's length in "
                    f"'{HEADER_LENGTH_HEADER}' or in the Content-Type '{SAGEMAKER_BINARY_CONTENT_TYPE}<N>'"
                )
            raise BadRequest(
                f"unexpected size for input '{name}', expecting {size - available} additional bytes "
                f"for model '{self.model}'"
            )
        blob = self.view[self.offset : self.offset + size]
        self.offset += size
        if self.binary is not None:
            self.binary.append((name, dt, shape, count, size))
        return from_binary(blob, dt, shape, count, name, self.model)

    # -- outputs -------------------------------------------------------------------

    def _outputs(self) -> list[RequestedOutput] | None:
        if "outputs" not in self.doc:
            return None
        items = self.doc["outputs"]
        if not isinstance(items, list):
            raise BadRequest("Unable to parse 'outputs': attempt to access JSON non-array as array")
        requested: dict[str, RequestedOutput] = {}
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise BadRequest("Unable to parse 'outputs': each output must be an object with a string 'name'")
            name = item["name"]
            parameters = item.get("parameters", {})
            if not isinstance(parameters, dict):
                raise BadRequest(
                    f"Unable to parse 'parameters': attempt to access JSON non-object as object for output '{name}'"
                )
            if "shared_memory_region" in parameters:
                raise BadRequest(f"output '{name}': shared memory is not supported")
            if name in requested:
                raise BadRequest(f"output '{name}' already exists in request")
            if self.check_outputs and self.metadata.output(name) is None:
                raise BadRequest(f"unexpected inference output '{name}' for model '{self.model}'")
            binary = parameters.get("binary_data")
            if binary is not None and not isinstance(binary, bool):
                raise BadRequest(f"Unable to parse 'binary_data' for output '{name}'")
            classes = parameters.get("classification", 0)
            if type(classes) is not int or classes < 0:
                raise BadRequest(f"Unable to set 'classification' for output '{name}'")
            requested[name] = RequestedOutput(name=name, binary=binary, classification=classes)
        # No listed output means every output (Triton's Normalize).
        return list(requested.values()) or None


def _check_content_fields(item: dict, parameters: dict, name: str) -> None:
    present = [
        field
        for field, there in (
            ("'data'", "data" in item),
            ("'binary_data_size'", "binary_data_size" in parameters),
            ("'shared_memory_region'", "shared_memory_region" in parameters),
        )
        if there
    ]
    if len(present) != 1:
        found = " no field is set" if not present else " set " + " ".join(present)
        raise BadRequest(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
            f"'shared_memory_region' in 'parameters'. But{found} for input '{name}'"
        )


def _request_parameters(doc: dict) -> tuple[bool, dict]:
    if "parameters" not in doc:
        return False, {}
    parameters = doc["parameters"]
    if not isinstance(parameters, dict):
        raise BadRequest("Unable to parse 'parameters': attempt to access JSON non-object as object")
    binary_output = False
    forwarded = {}
    for key, value in parameters.items():
        if key.startswith(_RESERVED_PREFIX):
            raise BadRequest(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
            )
        if key == "binary_data_output":
            if not isinstance(value, bool):
                raise BadRequest("Unable to parse 'binary_data_output'")
            binary_output = value
            continue
        if key in ("sequence_start", "sequence_end"):
            ok = isinstance(value, bool)
        elif key in ("priority", "timeout"):
            ok = type(value) is int and value >= 0
        elif key == "sequence_id":
            ok = isinstance(value, str) or (type(value) is int and value >= 0)
        else:
            ok = isinstance(value, (str, int, float))  # bool is an int
        if not ok:
            raise BadRequest(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")
        forwarded[key] = value
    return binary_output, forwarded


def _shape_field(item: dict, name: str) -> list[int]:
    if "shape" not in item:
        raise BadRequest(f"Unable to parse 'shape': attempt to access non-existing object member 'shape' for input '{name}'")
    shape = item["shape"]
    if not isinstance(shape, list):
        raise BadRequest(f"Unable to parse 'shape': attempt to access JSON non-array as array for input '{name}'")
    if not all(type(d) is int and d >= 0 for d in shape):
        raise BadRequest(
            "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer "
            f"for input '{name}'"
        )
    if len(shape) > MAX_DIMS:
        raise BadRequest(f"invalid shape for input '{name}': {len(shape)} dimensions, at most {MAX_DIMS} are supported")
    return shape



def _quoted(names) -> str:
    return "[" + ", ".join(f"'{n}'" for n in names) + "]"

"""invoke: one request to a live endpoint through sagemaker-runtime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from deploy import codec
from deploy.aws import Aws, DeployError

_BY_SUFFIX = {".json": codec.JSON, ".csv": codec.CSV, ".jsonl": codec.JSONLINES, ".npy": codec.NPY}


def load_array(source: str, dtype: str) -> np.ndarray:
    """An array from a .npy/.json/.csv file, or from a JSON literal such as '[[0, 1.5]]'."""
    path = Path(source)
    try:
        if path.suffix == ".npy" and path.is_file():
            array = np.load(path, allow_pickle=False)
        elif path.suffix == ".csv" and path.is_file():
            array = np.loadtxt(path, delimiter=",", ndmin=2)
        elif path.is_file():
            array = np.asarray(json.loads(path.read_text()))
        else:
            array = np.asarray(json.loads(source))
        return array.astype(dtype, copy=False) if dtype else array
    except (ValueError, TypeError, OSError) as error:
        raise DeployError(f"--array {source[:60]!r}: not a .npy/.json/.csv file or a JSON array ({codec._one_line(error)})") from None


def request_body(args_input: str | None, args_array: str | None, content_type: str | None, input_name: str | None, dtype: str) -> tuple[bytes, str]:
    """The body and Content-Type: a file sent as it is, or an array encoded as asked."""
    if args_input:
        path = Path(args_input)
        if not path.is_file():
            raise DeployError(f"--input {path} is not a file")
        content_type = content_type or _BY_SUFFIX.get(path.suffix)
        if not content_type:
            raise DeployError(f"cannot tell the content type of {path.name}; pass --content-type")
        return path.read_bytes(), content_type
    array = load_array(args_array, dtype)
    try:
        return codec.encode(array, content_type or codec.JSON, input_name)
    except codec.CodecError as error:
        raise DeployError(str(error)) from None


def invoke(aws: Aws, endpoint_name: str, body: bytes, content_type: str, accept: str | None) -> tuple[bytes, str]:
    params = {"EndpointName": endpoint_name, "Body": body, "ContentType": content_type}
    if accept:
        params["Accept"] = accept
    response = aws.client("sagemaker-runtime").invoke_endpoint(**params)
    return response["Body"].read(), response.get("ContentType", "application/octet-stream")


def render(body: bytes, content_type: str) -> str:
    """What invoke prints: text bodies as they came, arrays and v2 outputs as JSON."""
    kind = codec.media_type(content_type)
    if kind in (codec.CSV, codec.JSONLINES):
        return body.decode(errors="replace").rstrip("\n")
    try:
        decoded = codec.decode(body, content_type)
    except codec.CodecError as error:
        raise DeployError(str(error)) from None
    return json.dumps(codec.to_printable(decoded))

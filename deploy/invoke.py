"""invoke and invoke-async: requests to a live endpoint through sagemaker-runtime."""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from deploy import codec
from deploy.aws import Aws, DeployError, say
from deploy.package import default_bucket, ensure_bucket, head, upload_with_progress

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


_SESSION_ID = re.compile(r"^(NEW_SESSION|[a-zA-Z0-9](-*[a-zA-Z0-9])*)$")


@dataclass(frozen=True)
class Routing:
    """Where in the endpoint a request goes, and what travels with it to the container.

    custom_attributes reaches the container as X-Amzn-SageMaker-Custom-Attributes (the
    hooks' context); target_model picks a model of a multi-model endpoint;
    inference_component a component of an endpoint that hosts them; session_id opens
    (NEW_SESSION) or continues a stateful session.
    """

    custom_attributes: str | None = None
    inference_id: str | None = None
    target_model: str | None = None
    inference_component: str | None = None
    session_id: str | None = None

    def params(self, streaming: bool = False) -> dict:
        if self.target_model is not None and self.inference_component is not None:
            raise DeployError("--target-model picks a model of a multi-model endpoint and --inference-component a component; an endpoint has one or the other")
        if streaming and self.target_model is not None:
            raise DeployError("InvokeEndpointWithResponseStream takes no --target-model (multi-model endpoints do not stream): drop --stream or --target-model")
        if self.custom_attributes is not None and (len(self.custom_attributes) > 1024 or not self.custom_attributes.isascii()):
            raise DeployError("--custom-attributes takes at most 1024 ASCII characters")
        if self.target_model is not None and not 1 <= len(self.target_model) <= 1024:
            raise DeployError("--target-model takes 1..1024 characters (the archive's key under the model's prefix, e.g. digits.tar.gz)")
        if self.session_id is not None and (len(self.session_id) > 256 or not _SESSION_ID.match(self.session_id)):
            raise DeployError(f"--session-id takes NEW_SESSION or a session ID the endpoint gave (letters, digits, hyphens), got {self.session_id!r}")
        pairs = (("CustomAttributes", self.custom_attributes), ("InferenceId", self.inference_id), ("TargetModel", self.target_model),
                 ("InferenceComponentName", self.inference_component), ("SessionId", self.session_id))
        return {key: value for key, value in pairs if value is not None}


def _request(endpoint_name: str, body: bytes, content_type: str, accept: str | None, routing: Routing, streaming: bool) -> dict:
    params = {"EndpointName": endpoint_name, "Body": body, "ContentType": content_type, **routing.params(streaming)}
    if accept:
        params["Accept"] = accept
    return params


def _say_response_headers(response: dict) -> None:
    """What the container or SageMaker said beside the body: on stderr, so stdout stays the body."""
    for key in ("CustomAttributes", "NewSessionId", "ClosedSessionId"):
        if response.get(key):
            say(f"{key}: {response[key]}")


def invoke(aws: Aws, endpoint_name: str, body: bytes, content_type: str, accept: str | None, routing: Routing = Routing()) -> tuple[bytes, str]:
    response = invoke_response(aws, endpoint_name, body, content_type, accept, routing)
    return response["Body"].read(), response.get("ContentType", "application/octet-stream")


def invoke_response(aws: Aws, endpoint_name: str, body: bytes, content_type: str, accept: str | None, routing: Routing = Routing()) -> dict:
    """InvokeEndpoint's whole response (its NewSessionId, say), what came beside the body said on stderr."""
    params = _request(endpoint_name, body, content_type, accept, routing, streaming=False)
    response = aws.client("sagemaker-runtime").invoke_endpoint(**params)
    _say_response_headers(response)
    return response


def invoke_stream(aws: Aws, endpoint_name: str, body: bytes, content_type: str, accept: str | None, routing: Routing = Routing()):
    """InvokeEndpointWithResponseStream: (the event stream, the response's Content-Type)."""
    params = _request(endpoint_name, body, content_type, accept, routing, streaming=True)
    response = aws.client("sagemaker-runtime").invoke_endpoint_with_response_stream(**params)
    _say_response_headers(response)
    return response["Body"], response.get("ContentType", "application/octet-stream")


# ---------------------------------------------------------------- asynchronous


@dataclass(frozen=True)
class AsyncRequest:
    endpoint_name: str
    input: str  # a local file or s3://bucket/key
    content_type: str | None = None
    accept: str | None = None
    bucket: str | None = None
    prefix: str = "async-inputs"
    create_bucket: bool = False
    invocation_timeout: int | None = None  # InvocationTimeoutSeconds, 1..3600
    request_ttl: int | None = None  # RequestTTLSeconds, 60..21600
    inference_id: str | None = None

    def check(self) -> None:
        if self.invocation_timeout is not None and not 1 <= self.invocation_timeout <= 3600:
            raise DeployError(f"--invocation-timeout must be 1..3600 seconds, got {self.invocation_timeout}")
        if self.request_ttl is not None and not 60 <= self.request_ttl <= 21600:
            raise DeployError(f"--request-ttl must be 60..21600 seconds, got {self.request_ttl}")


_S3_URI = re.compile(r"^s3://([^/]+)/(.+)$")
# What S3 calls an object stored without a type: no help in reading it.
_UNTYPED = ("binary/octet-stream", "application/octet-stream", "")


def invoke_async(aws: Aws, request: AsyncRequest, wait: bool, poll_seconds: float, max_wait_seconds: float) -> str:
    """Queue one request; returns the output's s3:// URI, or with `wait` the decoded result."""
    request.check()
    input_location, content_type = _input_location(aws, request)
    params = {"EndpointName": request.endpoint_name, "InputLocation": input_location, "ContentType": content_type}
    for key, value in (("Accept", request.accept), ("InferenceId", request.inference_id),
                       ("InvocationTimeoutSeconds", request.invocation_timeout), ("RequestTTLSeconds", request.request_ttl)):
        if value is not None:
            params[key] = value
    response = aws.client("sagemaker-runtime").invoke_endpoint_async(**params)
    output, failure = response["OutputLocation"], response.get("FailureLocation")
    say(f"inference {response.get('InferenceId', '?')} queued; its result will be {output}" + (f" (or its failure {failure})" if failure else ""))
    if not wait:
        return output
    return _wait_for_result(aws, output, failure, request.accept, poll_seconds, max_wait_seconds)


def _input_location(aws: Aws, request: AsyncRequest) -> tuple[str, str]:
    """The request body's s3:// URI (a local file is uploaded first) and its content type."""
    s3 = aws.client("s3")
    found = _S3_URI.match(request.input)
    if found:
        content_type = request.content_type or _BY_SUFFIX.get(Path(found[2]).suffix)
        if not content_type:
            raise DeployError(f"cannot tell the content type of {request.input}; pass --content-type")
        if head(s3, found[1], found[2]) is None:
            raise DeployError(f"--input {request.input} does not exist")
        return request.input, content_type
    if request.input.startswith("s3://"):
        raise DeployError(f"--input must be a file or s3://bucket/key, got {request.input!r}")
    path = Path(request.input)
    if not path.is_file():
        raise DeployError(f"--input {path} is not a file")
    content_type = request.content_type or _BY_SUFFIX.get(path.suffix)
    if not content_type:
        raise DeployError(f"cannot tell the content type of {path.name}; pass --content-type")
    bucket = request.bucket or default_bucket(aws)
    ensure_bucket(aws, bucket, request.create_bucket)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    # Named by content: sending the same file twice uploads it once.
    key = "/".join(part for part in (request.prefix.strip("/"), digest[:16], path.name) if part)
    if head(s3, bucket, key) is None:
        upload_with_progress(s3, path, bucket, key, {"ContentType": content_type})
    return f"s3://{bucket}/{key}", content_type


def _wait_for_result(aws: Aws, output: str, failure: str | None, accept: str | None, poll_seconds: float, max_wait_seconds: float) -> str:
    s3 = aws.client("s3")
    started = time.monotonic()
    said = -30.0
    while True:
        for location, failed in ((output, False), (failure, True)):
            found = _S3_URI.match(location or "")
            if not found:
                continue
            stored = head(s3, found[1], found[2])
            if stored is None:
                continue
            body = s3.get_object(Bucket=found[1], Key=found[2])["Body"].read()
            if failed:
                text = " ".join(body.decode("utf-8", "replace").split())
                raise DeployError(f"the asynchronous inference failed: {text[:500] or 'empty failure object'} ({location})")
            stored_type = stored.get("ContentType") or ""
            return render(body, stored_type if stored_type not in _UNTYPED else (accept or stored_type or "application/octet-stream"))
        elapsed = time.monotonic() - started
        if elapsed + poll_seconds > max_wait_seconds:
            raise DeployError(f"no result at {output} after {elapsed:.0f}s; look later, or raise --max-wait")
        if elapsed - said >= 30:  # a line every half minute, however often it looks
            say(f"waiting for {output} ({elapsed:.0f}s)")
            said = elapsed
        time.sleep(poll_seconds)


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

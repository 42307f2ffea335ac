"""The Flask application: thin routes over ModelServer and the codecs.

gunicorn calls `create_app()` in each worker after fork; nothing happens at import.
"""

from __future__ import annotations

import json
import logging

from flask import Flask, Response, request
from werkzeug.datastructures import MIMEAccept
from werkzeug.exceptions import HTTPException

from . import __version__, simple, v2
from .errors import BadRequest, HTTPError, NotAcceptable, NotFound, PayloadTooLarge, UnsupportedMediaType
from .inference import InferenceRequest
from .metadata import ModelMetadata
from .server import READY, ModelServer, worker_slot_from_env
from .settings import Settings

log = logging.getLogger(__name__)

OCTET_STREAM = "application/octet-stream"
SUPPORTED_REQUEST_TYPES = (
    "application/json (simple or KServe v2)",
    "text/csv",
    "application/jsonlines",
    "application/x-npy",
    "application/octet-stream (KServe v2 binary)",
    "application/vnd.sagemaker-triton.binary+json;json-header-size=N",
)


def create_app(settings: Settings | None = None, server: ModelServer | None = None) -> Flask:
    settings = settings or Settings.from_env()
    if server is None:
        server = ModelServer(settings, **worker_slot_from_env())
        server.start()
    app = Flask("smserve")
    # Werkzeug refuses a larger body with 413 from Content-Length, before reading it.
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.extensions["smserve"] = server

    @app.get("/ping")
    def ping():
        server.check_all_ready()
        return Response(status=200, content_type="text/plain")

    @app.get("/execution-parameters")
    def execution_parameters():
        return _json(server.execution_parameters())

    @app.post("/invocations")
    def invocations():
        return _invocations(server, settings)

    _v2_routes(app, server)
    _register_errors(app)
    return app


def _invocations(server: ModelServer, settings: Settings) -> Response:
    """The protocol is chosen by Content-Type: SageMaker's binary v2 form, v2 JSON or
    binary, or one of the simple types."""
    content_type = request.headers.get("Content-Type", "")
    kind = simple.media_type(content_type)
    # A user's input_fn decodes whatever it likes (images, text, …): only v2 bodies and
    # the built-in types bypass it.
    takes_any = server.has_input_fn
    if (not takes_any and kind not in simple.MEDIA_TYPES + (OCTET_STREAM,)
            and v2.SAGEMAKER_BINARY_CONTENT_TYPE not in content_type):
        raise UnsupportedMediaType(
            f"unsupported Content-Type {content_type!r}; send one of: " + ", ".join(SUPPORTED_REQUEST_TYPES)
        )
    body = _read_body(settings)
    server.check_ready()
    header_length = _v2_header_length(content_type, kind, len(body), raw_octet_stream=not takes_any)
    if header_length is not None:
        return _v2_infer(server, v2.decode_request(body, header_length, server.metadata), sagemaker=True)
    if server.uses_byte_hooks:
        return _infer_with_hooks(server, settings, body, content_type, kind)
    if kind == simple.JSON:
        if not body:
            raise BadRequest("request body is empty")
        try:
            document = simple.parse_json(body)
        except BadRequest as e:
            raise BadRequest(
                f"{e.message} (if binary tensors follow a JSON header, give the header's length in "
                f"'{v2.SAGEMAKER_BINARY_CONTENT_TYPE}N' or the {v2.HEADER_LENGTH_HEADER} header)"
            ) from None
        if v2.is_v2_document(document):
            return _v2_infer(server, v2.decode_json_request(document, server.metadata), sagemaker=True)
        inputs = simple.decode_json(document, server.metadata)
    else:
        inputs = simple.decode(body, content_type, server.metadata)
    accept = _negotiate(_default_accept(settings, kind))
    payload, media = simple.encode(server.infer(inputs), accept, _batched(server))
    return Response(payload, content_type=media)


def _read_body(settings: Settings) -> bytes:
    """The whole body. Werkzeug refuses an oversized Content-Length with 413 before
    reading; a chunked body it silently cuts at the limit, so look for one byte more."""
    body = request.get_data(cache=False)
    if request.content_length is None and len(body) >= settings.max_body_bytes:
        if request.environ["wsgi.input"].read(1):
            raise PayloadTooLarge(f"request body exceeds the payload limit of {settings.max_body_bytes} bytes")
    return body


def _v2_header_length(content_type: str, kind: str, size: int, raw_octet_stream: bool = True) -> int | None:
    """Where a v2 request's JSON header ends (0: raw binary), or None when the body is
    whole JSON or a simple type. Measured against the body read, since a chunked
    request has no Content-Length."""
    found = v2.sagemaker_header_length(content_type, size)
    if found is not None:
        return found
    header = request.headers.get(v2.HEADER_LENGTH_HEADER)
    if kind == OCTET_STREAM and (header is not None or raw_octet_stream):
        # Without the header, octet-stream is the one input's raw bytes (unless the
        # model's input_fn takes it).
        return v2.header_length_from_header(header, size) or 0
    if kind == simple.JSON and header is not None:
        return v2.header_length_from_header(header, size)
    return None


def _infer_with_hooks(server: ModelServer, settings: Settings, body: bytes, content_type: str, kind: str) -> Response:
    default = _default_accept(settings, kind)
    if server.model.hooks.output_fn is not None:
        # The user's output_fn may speak types we do not: it gets the client's first choice.
        accept, encode = _preferred(default), None
    else:
        accept = _negotiate(default)
        batched = _batched(server)

        def encode(outputs):
            return simple.encode(outputs, accept, batched)

    payload, media = server.infer_with_hooks(
        body, content_type, accept,
        decode=lambda: simple.decode(body, content_type, server.metadata),
        encode=encode,
    )
    return Response(payload, content_type=media)


def _v2_infer(server: ModelServer, inference: InferenceRequest, sagemaker: bool) -> Response:
    results = server.infer(inference.inputs)
    payload, header_length = v2.encode_response(v2.build_response(inference, results, server.metadata))
    return Response(payload, headers=v2.response_headers(header_length, sagemaker))


def _v2_routes(app: Flask, server: ModelServer) -> None:
    """KServe v2 REST, so tritonclient.http.InferenceServerClient works unmodified."""

    def model_metadata(model: str, version: str | None) -> ModelMetadata:
        metadata = server.metadata
        if model != metadata.name:
            raise NotFound(f"Request for unknown model: '{model}' is not found")
        if version not in (None, "", metadata.version):
            raise NotFound(f"Request for unknown model: '{model}' version {version} is not found")
        return metadata

    @app.get("/v2")
    def server_metadata():
        return _json({"name": "smserve", "version": __version__, "extensions": ["binary_tensor_data", "classification"]})

    @app.get("/v2/health/live")
    def live():
        return Response(status=200)

    @app.get("/v2/health/ready")
    def ready():
        try:
            server.check_all_ready()
        except HTTPError:
            return Response(status=400)
        return Response(status=200)

    @app.get("/v2/models/<model>")
    @app.get("/v2/models/<model>/versions/<version>")
    def metadata(model: str, version: str | None = None):
        return _json(model_metadata(model, version).to_v2())

    @app.get("/v2/models/<model>/ready")
    @app.get("/v2/models/<model>/versions/<version>/ready")
    def model_ready(model: str, version: str | None = None):
        if server.status != READY:
            raise BadRequest("Model version not ready")
        model_metadata(model, version)
        return Response(status=200)

    @app.post("/v2/models/<model>/infer")
    @app.post("/v2/models/<model>/versions/<version>/infer")
    def infer(model: str, version: str | None = None):
        metadata = model_metadata(model, version)
        body = request.get_data(cache=False)
        header_length = v2.header_length_from_header(request.headers.get(v2.HEADER_LENGTH_HEADER), len(body))
        return _v2_infer(server, v2.decode_request(body, header_length, metadata), sagemaker=False)


def _batched(server: ModelServer) -> bool:
    return server.metadata.max_batch_size > 0


def _default_accept(settings: Settings, request_kind: str) -> str:
    """SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT if set; in batch mode a CSV or JSON Lines
    request's own type, so AssembleWith=Line gets one line per record; else JSON."""
    if settings.default_accept:
        return settings.default_accept
    if settings.batch and request_kind in (simple.CSV, simple.JSONLINES):
        return request_kind
    return simple.JSON


def _accept() -> MIMEAccept:
    # Media-type parameters (charset=utf-8, header=present) are not ours to match on.
    return MIMEAccept([(value.split(";")[0].strip(), q) for value, q in request.accept_mimetypes])


def _preferred(default: str) -> str:
    """The client's most wanted concrete media type, for a user's output_fn."""
    for value, q in sorted(_accept(), key=lambda item: -item[1]):
        if q > 0 and "*" not in value:
            return value
    return default


def _negotiate(default: str) -> str:
    """The best media type the Accept header allows (q-values honoured); 406 if none."""
    if not request.headers.get("Accept"):
        return default
    # On a tie (e.g. */*) werkzeug prefers the earlier offer: the default comes first.
    offers = [default] + [m for m in simple.MEDIA_TYPES if m != default] + list(simple.ALIASES)
    best = _accept().best_match(offers)
    if best is None:
        raise NotAcceptable(
            f"cannot produce any of Accept: {request.headers['Accept']}; supported: {', '.join(simple.MEDIA_TYPES)}"
        )
    return simple.ALIASES.get(best, best)


def _json(value, status: int = 200, headers: dict | None = None) -> Response:
    return Response(json.dumps(value, separators=(",", ":")), status=status,
                    content_type="application/json", headers=headers)


def error_response(message: str, status: int) -> Response:
    return _json({"error": message}, status)


def _register_errors(app: Flask) -> None:
    @app.errorhandler(HTTPError)
    def http_error(e: HTTPError):
        if e.status >= 500:
            log.error("%s %s -> %d: %s", request.method, request.path, e.status, e.message)
        return error_response(e.message, e.status)

    @app.errorhandler(HTTPException)
    def werkzeug_error(e: HTTPException):
        if e.code == 413:
            limit = app.config["MAX_CONTENT_LENGTH"]
            size = f"request body of {request.content_length} bytes" if request.content_length is not None else "request body"
            return error_response(f"{size} exceeds the payload limit of {limit} bytes", PayloadTooLarge.status)
        return error_response(e.description or e.name, e.code or 500)

    @app.errorhandler(Exception)
    def unexpected(e: Exception):
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(f"internal error: {type(e).__name__}: {e}", 500)

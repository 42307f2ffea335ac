"""The Flask application: thin routes over ModelServer and the codecs.

gunicorn calls `create_app()` in each worker after fork; nothing happens at import.
"""

from __future__ import annotations

import json
import logging

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from . import simple
from .errors import HTTPError, NotAcceptable, PayloadTooLarge, UnsupportedMediaType
from .server import ModelServer, worker_slot_from_env
from .settings import Settings

log = logging.getLogger(__name__)

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
        index, workers = worker_slot_from_env()
        server = ModelServer(settings, worker_index=index, workers=workers)
        server.start()
    app = Flask("smserve")
    # Werkzeug refuses a larger body with 413 from Content-Length, before reading it.
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.extensions["smserve"] = server

    @app.get("/ping")
    def ping():
        server.check_ready()
        return Response(status=200)

    @app.get("/execution-parameters")
    def execution_parameters():
        return _json(server.execution_parameters())

    @app.post("/invocations")
    def invocations():
        return _invocations(server, settings)

    _register_errors(app)
    return app


def _invocations(server: ModelServer, settings: Settings) -> Response:
    content_type = request.headers.get("Content-Type", "")
    kind = simple.media_type(content_type)
    body = request.get_data(cache=False)
    if kind not in simple.MEDIA_TYPES:
        raise UnsupportedMediaType(
            f"unsupported Content-Type {content_type!r}; send one of: " + ", ".join(SUPPORTED_REQUEST_TYPES)
        )
    server.check_ready()
    if server.uses_byte_hooks:
        accept = request.headers.get("Accept") or settings.default_accept
        if accept.strip() == "*/*":
            accept = settings.default_accept
        payload, media = server.infer_with_hooks(
            body, content_type, accept,
            decode=lambda: simple.decode(body, content_type, server.metadata),
            encode=lambda outputs: simple.encode(outputs, _negotiate(settings.default_accept), _batched(server)),
        )
        return Response(payload, content_type=media)
    accept = _negotiate(settings.default_accept)
    inputs = simple.decode(body, content_type, server.metadata)
    outputs = server.infer(inputs)
    payload, media = simple.encode(outputs, accept, _batched(server))
    return Response(payload, content_type=media)


def _batched(server: ModelServer) -> bool:
    return server.metadata.max_batch_size > 0


def _negotiate(default: str) -> str:
    """The best media type the Accept header allows (q-values honoured); 406 if none."""
    if not request.headers.get("Accept"):
        return default
    # On a tie (e.g. */*) werkzeug prefers the earlier offer: the default comes first.
    offers = [default] + [m for m in simple.MEDIA_TYPES if m != default] + list(simple.ALIASES)
    best = request.accept_mimetypes.best_match(offers)
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

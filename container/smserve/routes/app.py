"""The Flask application: thin routes over ModelServer and the codecs.

gunicorn calls `create_app()` in each worker after fork; nothing happens at import.
"""

from __future__ import annotations

import json
import logging

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from smserve import __version__
from smserve.codecs import contentcoding, v2
from smserve.protocols import dispatch as protocols
from smserve.errors import BadRequest, HTTPError, NotFound, PayloadTooLarge, Unavailable, json_error_body
from smserve.core.metadata import ModelMetadata
from smserve.engine.server import READY, ModelServer, worker_slot_from_env
from smserve.settings import Settings

log = logging.getLogger(__name__)

def create_app(settings: Settings | None = None, server: ModelServer | None = None) -> Flask:
    settings = settings or Settings.from_env()
    if server is None:
        server = ModelServer(settings, **worker_slot_from_env())
        server.start()
    app = Flask("smserve")
    # Werkzeug refuses a larger body with 413 from Content-Length, before reading it.
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.extensions["smserve"] = server

    # SageMaker pings with GET; a container that takes bidirectional streams must
    # answer POST too.
    @app.route("/ping", methods=["GET", "POST"])
    def ping():
        server.check_all_ready()
        return Response(status=200, content_type="text/plain")

    @app.get("/execution-parameters")
    def execution_parameters():
        return _json(server.execution_parameters())

    @app.post("/invocations")
    def invocations():
        return _invocations(server, settings)

    _v2_routes(app, server, settings)
    _register_errors(app)
    app.extensions["smserve.direct"] = direct_routes(server, settings)
    return app


# ---------------------------------------------------------------- the hot path

DirectAnswer = tuple[int, list[tuple[str, str]], object]


def direct_routes(server: ModelServer, settings: Settings) -> dict:
    """/ping and /invocations as our gunicorn worker calls them, without werkzeug's
    request and response objects (they cost more than a small inference): the same
    answers as the Flask routes above, which still serve everything else and any
    other WSGI server. Each takes the request's headers (upper-case names, repeated
    fields joined with a comma as WSGI joins them) and its whole body."""

    def ping(headers: dict[str, str], body: bytes) -> DirectAnswer:
        server.check_all_ready()
        return 200, [("Content-Type", "text/plain"), ("Content-Length", "0")], b""

    def invocations(headers: dict[str, str], body: bytes) -> DirectAnswer:
        body = _inflated(server, settings, body, headers.get("CONTENT-ENCODING"))
        message = protocols.Message.from_http(body, lambda name: headers.get(name.upper()))
        reply = protocols.answer(message, server, settings)
        out = list(reply.headers.items())
        if not reply.streamed:
            out.append(("Content-Length", str(len(reply.body))))
        return 200, out, reply.body

    def v2_infer(headers: dict[str, str], body: bytes, model: str, version: str | None) -> DirectAnswer:
        metadata = _model_metadata(server, model, version)
        body = _inflated(server, settings, body, headers.get("CONTENT-ENCODING"))
        header_length = v2.header_length_from_header(headers.get(v2.HEADER_LENGTH_HEADER.upper()), len(body))
        inference = server.codec(len(body), v2.decode_request, body, header_length, metadata)
        reply = protocols.v2_reply(server, inference, sagemaker=False)
        return 200, [*reply.headers.items(), ("Content-Length", str(len(reply.body)))], reply.body

    def guarded(route):
        def answer(method: str, path: str, headers: dict[str, str], body: bytes, *where) -> DirectAnswer:
            try:
                return route(headers, body, *where)
            except HTTPError as e:
                _log_error(method, path, e)
                return _direct_error(e.message, e.status)
            except Exception as e:  # noqa: BLE001 - as the Flask app's unexpected-error handler
                log.exception("unhandled error on %s %s", method, path)
                return _direct_error(f"internal error: {type(e).__name__}: {e}", 500)

        return answer

    return DirectRoutes({
        ("GET", "/ping"): guarded(ping),
        ("POST", "/ping"): guarded(ping),
        ("POST", "/invocations"): guarded(invocations),
    }, v2_infer=guarded(v2_infer))


class DirectRoutes(dict):
    """(method, path) -> the direct answer; KServe v2 inference too, whose path holds
    the model's name (and version): `/v2/models/<model>[/versions/<version>]/infer`.
    Any other path (a percent-encoded name included) is left to Flask's router."""

    def __init__(self, routes: dict, v2_infer):
        super().__init__(routes)
        self.v2_infer = v2_infer

    def get(self, key, default=None):
        found = dict.get(self, key)
        if found is not None:
            return found
        method, path = key
        if method != "POST" or not path.startswith("/v2/models/") or not path.endswith("/infer") or "%" in path:
            return default
        parts = path.split("/")  # "", "v2", "models", model, ["versions", version,] "infer"
        if len(parts) == 5 and parts[3]:
            where = (parts[3], None)
        elif len(parts) == 7 and parts[3] and parts[4] == "versions" and parts[5]:
            where = (parts[3], parts[5])
        else:
            return default
        v2_infer = self.v2_infer
        return lambda method, path, headers, body: v2_infer(method, path, headers, body, *where)


def _direct_error(message: str, status: int) -> DirectAnswer:
    body = json_error_body(message)
    return status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))], body


def _log_error(method: str, path: str, e: HTTPError) -> None:
    if e.status == Unavailable.status:
        # A model still loading is the normal state of a start, not an error: an
        # ERROR line here would trip alarms on every deploy.
        log.debug("%s %s -> %d: %s", method, path, e.status, e.message)
    elif e.status >= 500:
        log.error("%s %s -> %d: %s", method, path, e.status, e.message)


def _invocations(server: ModelServer, settings: Settings) -> Response:
    """The protocol is chosen by the protocol table (protocols.py); this route only
    moves the request in and the reply out."""
    body = _inflated(server, settings, _read_body(settings), request.headers.get("Content-Encoding"))
    message = protocols.Message.from_http(body, request.headers.get)
    return _response(protocols.answer(message, server, settings))


def _response(reply: protocols.Reply) -> Response:
    return Response(reply.body, headers=reply.headers)


def _inflated(server: ModelServer, settings: Settings, body: bytes, content_encoding: str | None) -> bytes:
    """The body as the protocols read it: a gzip or deflate body inflated (within the
    payload limit), any other body as it came."""
    if not content_encoding:
        return body
    return contentcoding.decode(body, content_encoding, settings.max_body_bytes, settings.body_limit_setting, server)


def _read_body(settings: Settings) -> bytes:
    """The whole body. Under our gunicorn worker it was read (within its deadline and
    the payload limit) before the app ran; elsewhere (Flask's test client) Werkzeug
    refuses an oversized Content-Length with 413 and silently cuts a chunked body at
    the limit, so look for one byte more."""
    body = request.environ.get("smserve.body")
    if body is not None:
        return body
    body = request.get_data(cache=False)
    if request.content_length is None and len(body) >= settings.max_body_bytes:
        if request.environ["wsgi.input"].read(1):
            raise PayloadTooLarge(f"request body exceeds the payload limit of {settings.max_body_bytes} bytes")
    return body


def _v2_routes(app: Flask, server: ModelServer, settings: Settings) -> None:
    """KServe v2 REST, so tritonclient.http.InferenceServerClient works unmodified."""

    def model_metadata(model: str, version: str | None) -> ModelMetadata:
        return _model_metadata(server, model, version)

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
        body = _inflated(server, settings, _read_body(settings), request.headers.get("Content-Encoding"))
        header_length = v2.header_length_from_header(request.headers.get(v2.HEADER_LENGTH_HEADER), len(body))
        inference = server.codec(len(body), v2.decode_request, body, header_length, metadata)
        return _response(protocols.v2_reply(server, inference, sagemaker=False))


def _model_metadata(server: ModelServer, model: str, version: str | None) -> ModelMetadata:
    metadata = server.metadata
    if model != metadata.name:
        raise NotFound(f"Request for unknown model: '{model}' is not found")
    if version not in (None, "", metadata.version):
        raise NotFound(f"Request for unknown model: '{model}' version {version} is not found")
    return metadata


def _json(value, status: int = 200, headers: dict | None = None) -> Response:
    return Response(json.dumps(value, separators=(",", ":")), status=status,
                    content_type="application/json", headers=headers)


def error_response(message: str, status: int) -> Response:
    return _json({"error": message}, status)


def _register_errors(app: Flask) -> None:
    @app.errorhandler(HTTPError)
    def http_error(e: HTTPError):
        _log_error(request.method, request.path, e)
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

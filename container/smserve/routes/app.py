"""The Flask application: the route table's handlers as Flask views.

After fork, our gunicorn worker (http/worker.py) starts the model server
(`start_server`) and loads gunicorn's wsgi_app, `create_app()`, within `serving`, so
that the app wraps that server; any other WSGI server, or Flask's test client, calls
`create_app()`, which then reads the settings itself. Nothing happens at import. Our
gunicorn worker answers the table's routes itself (without werkzeug's request and
response objects, which cost more than a small inference) and hands everything else to
this app: so a route a user adds here with `@app.route` (docs/architecture.md) is
served by any WSGI server, and Flask's test client sees every route.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

import flask
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from smserve import metrics
from smserve.engine.multimodel.server import MultiModelServer
from smserve.engine.worker.served import Serving
from smserve.engine.worker.server import ModelServer
from smserve.errors import HTTPError, PayloadTooLarge
from smserve.routes import endpoints
from smserve.routes.table import Request, Route, RouteTable, error_response, log_error, reason
from smserve.settings import Settings

log = logging.getLogger(__name__)


def start_server(settings: Settings, worker_index: int = 0, workers: int | None = None) -> Serving:
    """This worker's model server, loading: worker_index and workers from gunicorn's
    worker (None workers: as the settings or the host decide)."""
    if settings.metrics:
        metrics.enable(settings.metrics_dir)  # before the model loads: its runner reports through them
    kind = MultiModelServer if settings.multi_model else ModelServer
    server = kind(settings, worker_index=worker_index, workers=workers, state_dir=settings.state_dir)
    server.start()
    return server


# The gunicorn worker's settings, model server and route table while gunicorn loads its
# wsgi_app (`serving`): create_app() there serves them, whether gunicorn or a user's
# factory calls it.
_worker: tuple[Settings, Serving, RouteTable] | None = None


@contextmanager
def serving(settings: Settings, server: Serving, table: RouteTable) -> Iterator[None]:
    global _worker
    _worker = (settings, server, table)
    try:
        yield
    finally:
        _worker = None


def create_app(settings: Settings | None = None, server: Serving | None = None, *,
               worker_index: int = 0, workers: int | None = None) -> flask.Flask:
    """The Flask app over a model server: the one given, the gunicorn worker's (`serving`),
    or one started here (worker_index, workers: which worker of how many this is)."""
    table = None
    if settings is None and server is None and _worker is not None:
        settings, server, table = _worker
    settings = settings or Settings.from_env()
    if server is None:
        server = start_server(settings, worker_index, workers)
    elif settings.metrics:
        metrics.enable(settings.metrics_dir)
    app = flask.Flask("smserve")
    # Werkzeug refuses a larger body with 413 from Content-Length, before reading it.
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    table = table or endpoints.build(server, settings)
    app.extensions["smserve"] = server
    app.extensions["smserve.routes"] = table
    for route in table.routes:
        app.add_url_rule(route.flask_rule, endpoint=f"{'|'.join(route.methods)} {route.pattern}",
                         view_func=_view(table, route, settings), methods=list(route.methods),
                         provide_automatic_options=False)  # the table says what each route takes
    _register_errors(app)
    app.wsgi_app = _reasons_as_everywhere(app.wsgi_app)
    return app


def _reasons_as_everywhere(wsgi_app):
    """werkzeug writes a status's reason phrase in capitals (`404 NOT FOUND`); every other
    answer of this server has http.HTTPStatus's (`404 Not Found`), and so do the app's.
    A phrase of the app's own (a user's route) is left as it is."""

    def app(environ, start_response):
        def start(status: str, headers, exc_info=None):
            code, _, phrase = status.partition(" ")
            if len(code) == 3 and code.isascii() and code.isdigit() and phrase == reason(int(code)).upper():
                status = f"{code} {reason(int(code))}"
            return start_response(status, headers, exc_info)

        return wsgi_app(environ, start)

    return app


def _view(table: RouteTable, route: Route, settings: Settings):
    def view(**params):
        req = flask.request
        headers = {name.upper(): value for name, value in req.headers.items()}
        request = Request(req.method, req.path, headers, _read_body(settings), params,
                          req.query_string.decode("latin-1"))
        return to_flask(table.dispatch(route, request))

    return view


def to_flask(answer) -> flask.Response:
    return flask.Response(answer.body, status=answer.status, headers=answer.headers)


def _read_body(settings: Settings) -> bytes:
    """The whole body. Under our gunicorn worker it was read (within its deadline and
    the payload limit) before the app ran; elsewhere (Flask's test client) Werkzeug
    refuses an oversized Content-Length with 413 and silently cuts a chunked body at
    the limit, so look for one byte more."""
    req = flask.request
    body = req.environ.get("smserve.body")
    if body is not None:
        return body
    body = req.get_data(cache=False)
    if req.content_length is None and len(body) >= settings.max_body_bytes:
        if req.environ["wsgi.input"].read(1):
            raise PayloadTooLarge(f"request body exceeds the payload limit of {settings.max_body_bytes} bytes")
    return body


def _register_errors(app: flask.Flask) -> None:
    """Errors outside the table's handlers (Flask's routing, the body's limit, a user's
    own route) get the same JSON answers as the table's."""

    def answer(e: HTTPError):
        return to_flask(error_response(e))

    @app.errorhandler(HTTPError)
    def http_error(e: HTTPError):
        log_error(flask.request.method, flask.request.path, e)
        return answer(e)

    @app.errorhandler(HTTPException)
    def werkzeug_error(e: HTTPException):
        req = flask.request
        if e.code == 413:
            limit = app.config["MAX_CONTENT_LENGTH"]
            size = f"request body of {req.content_length} bytes" if req.content_length is not None else "request body"
            return answer(PayloadTooLarge(f"{size} exceeds the payload limit of {limit} bytes"))
        if e.code == 404:
            return answer(HTTPError(f"no route answers {req.method} {req.path} (GET / lists the routes)", 404))
        if isinstance(e, MethodNotAllowed):
            allowed = ", ".join(sorted(e.valid_methods or ()))
            return answer(HTTPError(f"{req.method} is not allowed on {req.path}; allowed: {allowed}", 405,
                                    {"Allow": allowed}))
        return answer(HTTPError(e.description or e.name, e.code or 500))

    @app.errorhandler(Exception)
    def unexpected(e: Exception):
        log.exception("unhandled error on %s %s", flask.request.method, flask.request.path)
        return answer(HTTPError(f"internal error: {type(e).__name__}: {e}", 500))

"""The one route table: every route (methods + path pattern -> handler) is declared once.

A handler is transport-neutral: it takes a `Request` (method, path, headers, body, the
pattern's parameters) and returns a `Response` (status, headers, and a body or an
iterator of chunks to stream). Our gunicorn worker dispatches through the table
without building a WSGI environ; the Flask app (routes/app.py) registers the same
handlers as its views, for any other WSGI server, Flask's test client, and the routes a
user adds. Errors become responses here, in one place, for both.
"""

from __future__ import annotations

import logging
import re
from http import HTTPStatus
from typing import Callable, Iterable, Mapping
from urllib.parse import unquote

from smserve.errors import HTTPError, Unavailable, json_error_body

log = logging.getLogger(__name__)

JSON = "application/json"
_PARAM = re.compile(r"\{(\w+)\}")


class Request:
    """One HTTP request as a handler sees it. `headers`: upper-case names, a repeated
    field joined with commas (as WSGI joins them, so an ambiguous repeat stays visible)."""

    __slots__ = ("method", "path", "headers", "body", "params", "query")

    def __init__(self, method: str, path: str, headers: Mapping[str, str], body: bytes = b"",
                 params: dict[str, str] | None = None, query: str = ""):
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
        self.params = params or {}
        self.query = query

    def header(self, name: str) -> str | None:
        return self.headers.get(name.upper())


class Response:
    """A handler's answer: `body` bytes, or an iterator of chunks sent as they come."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int = 200, headers: list[tuple[str, str]] | None = None,
                 body: bytes | Iterable[bytes] = b""):
        self.status = status
        self.headers = headers if headers is not None else []
        self.body = body

    @property
    def streamed(self) -> bool:
        return not isinstance(self.body, (bytes, bytearray, memoryview))


def json_response(body: bytes, status: int = 200, headers: list[tuple[str, str]] | None = None) -> Response:
    return Response(status, [("Content-Type", JSON), *(headers or ())], body)


def when_answered(answer: Response, done: Callable[[], None]) -> Response:
    """The answer, with done() called once it is made: at once for a body in hand; for
    a streamed one once its chunks end, fail, or are closed unread (a client gone before
    the first one). What a request holds until then, a stream's generator may use."""
    if not answer.streamed:
        done()
        return answer
    answer.body = _ThenDone(answer.body, done)
    return answer


class _ThenDone:
    """Chunks that call done() once, at their end. A generator's own `finally` would run
    only if it had started: a stream closed before its first chunk would never call it."""

    __slots__ = ("_chunks", "_done")

    def __init__(self, chunks: Iterable[bytes], done: Callable[[], None]):
        self._chunks = iter(chunks)
        self._done = done

    def __iter__(self) -> "_ThenDone":
        return self

    def __next__(self) -> bytes:
        try:
            return next(self._chunks)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        done, self._done = self._done, None
        if done is None:
            return
        try:
            close = getattr(self._chunks, "close", None)
            if close is not None:
                close()
        finally:
            done()


def error_response(e: HTTPError) -> Response:
    return json_response(json_error_body(e.message), e.status, list(e.headers.items()))


Handler = Callable[[Request], Response]


class Route:
    __slots__ = ("methods", "pattern", "handler", "regex", "params", "quiet")

    def __init__(self, methods: tuple[str, ...], pattern: str, handler: Handler, quiet: bool = False):
        self.methods = methods
        self.pattern = pattern  # also the route's name in logs and metrics
        self.handler = handler
        # Health checks SageMaker sends every few seconds: a success is logged at DEBUG.
        self.quiet = quiet
        self.params = tuple(_PARAM.findall(pattern))
        # "/v2/models/{model}/infer" -> ^/v2/models/(?P<model>[^/]+)/infer$ (split keeps the names at odd places)
        parts = _PARAM.split(pattern)
        self.regex = re.compile("^" + "".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)"
                                              for i, part in enumerate(parts)) + "$") if self.params else None

    @property
    def flask_rule(self) -> str:
        return _PARAM.sub(r"<\1>", self.pattern)


class RouteTable:
    def __init__(self) -> None:
        self.routes: list[Route] = []
        self._static: dict[str, dict[str, Route]] = {}  # path -> method -> route
        self._patterned: list[Route] = []

    def add(self, methods: str | tuple[str, ...], pattern: str, handler: Handler, quiet: bool = False) -> Route:
        methods = (methods,) if isinstance(methods, str) else tuple(methods)
        route = Route(methods, pattern, handler, quiet)
        self.routes.append(route)
        if route.regex is None:
            by_method = self._static.setdefault(pattern, {})
            for method in methods:
                by_method[method] = route
        else:
            self._patterned.append(route)
        return route

    def match(self, method: str, path: str) -> tuple[Route | None, dict[str, str]]:
        """The route for this method and raw (still percent-encoded) path, with its
        decoded parameters; (None, {}) when no route takes it. HEAD is answered as GET."""
        by_method = self._static.get(path)
        if by_method is not None:
            route = by_method.get(method) or (by_method.get("GET") if method == "HEAD" else None)
            return route, {}
        for route in self._patterned:
            found = route.regex.match(path)
            if found is not None and (method in route.methods or (method == "HEAD" and "GET" in route.methods)):
                return route, {name: unquote(value) for name, value in found.groupdict().items()}
        return None, {}

    def has_path(self, path: str) -> bool:
        """Some route answers this path, whatever the method (a WebSocket handshake on it
        is that route's request, not a session)."""
        return path in self._static or any(route.regex.match(path) for route in self._patterned)

    def dispatch(self, route: Route, request: Request) -> Response:
        """The route's answer; any error it raises becomes its JSON answer here."""
        try:
            return route.handler(request)
        except HTTPError as e:
            log_error(request.method, request.path, e)
            return error_response(e)
        except Exception as e:  # noqa: BLE001 - a bug or a model failure is a 500 with its message
            log.exception("unhandled error on %s %s", request.method, request.path)
            return error_response(HTTPError(f"internal error: {type(e).__name__}: {e}", 500))


# A 4xx's reason in the log is one short line: the answer carries it whole.
LOGGED_REASON_CHARS = 300


def log_error(method: str, path: str, e: HTTPError) -> None:
    if e.status == Unavailable.status:
        # A model still loading is the normal state of a start, not an error: an
        # ERROR line here would trip alarms on every deploy.
        log.debug("%s %s -> %d: %s", method, path, e.status, e.message)
    elif e.status >= 500:
        if not e.logged:
            log.error("%s %s -> %d: %s", method, path, e.status, e.message)
    else:
        # The client's mistake, said at the default level so that whoever runs the
        # endpoint sees why without turning on debug; no traceback, one line.
        reason = e.message if len(e.message) <= LOGGED_REASON_CHARS else e.message[:LOGGED_REASON_CHARS] + " ..."
        log.info("%s %s -> %d: %s", method, path, e.status, reason)


def reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"

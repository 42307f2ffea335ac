"""One access-log line per request, with fields CloudWatch can filter on, and the
request's metrics.

Written by the worker after each answer, instead of gunicorn's access log, buffered
(logs.AccessLines: a line costs a few microseconds, not logging's tens): SageMaker
pings every few seconds, so a successful /ping is logged at DEBUG, and in JSON mode
each line carries its fields (method, path, route, status, bytes, latency, inference
id, request id, worker) instead of one preformatted message. Every HTTP request passes here once,
answered, so its metrics (count by route and status, duration) are recorded here too.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import time
from typing import Callable

from smserve import logs, metrics
from smserve.core import session_ids

log = logging.getLogger(logs.ACCESS_LOGGER)
# A worker's buffered access lines (buffer_lines); None elsewhere: through `logging`.
_lines: logs.AccessLines | None = None

# Headers SageMaker and AWS load balancers use to identify a request.
REQUEST_ID_KEYS = ("HTTP_X_AMZN_REQUESTID", "HTTP_X_AMZN_SAGEMAKER_INFERENCE_ID", "HTTP_X_AMZN_TRACE_ID",
                   "HTTP_X_REQUEST_ID")
# The stateful session a request is in (NEW_SESSION, or its ID).
SESSION_KEY = "HTTP_" + session_ids.SESSION_ID.upper().replace("-", "_")
_NEW_SESSION_HEADER = session_ids.NEW_SESSION_ID.lower()
# The id a caller gave InvokeEndpoint (InferenceId), else SageMaker's own request id.
INFERENCE_ID_KEYS = ("HTTP_X_AMZN_SAGEMAKER_INFERENCE_ID", "HTTP_X_AMZN_REQUESTID", "HTTP_X_AMZN_TRACE_ID",
                     "HTTP_X_REQUEST_ID")
# What the line reads of an environ.
_LINE_KEYS = ("PATH_INFO", "REQUEST_METHOD", "REMOTE_ADDR", SESSION_KEY) + REQUEST_ID_KEYS
# A caller's id is written as sent up to this length (SageMaker's InferenceId: 64).
MAX_ID_CHARS = 256
# What a request that no route took is counted as: never its raw path, which a
# caller chooses, so the metrics' series stay bounded.
UNMATCHED = "unmatched"


class Answered:
    """What the access line says of a request: filled in as the answer takes shape."""

    __slots__ = ("status", "sent", "quiet", "environ", "route", "headers")

    def __init__(self):
        self.status = 0
        self.sent = 0
        self.quiet = False  # a health check: a success is logged at DEBUG
        self.environ = None  # the WSGI environ, when the app answered
        self.route = None  # the matched route's pattern: the metrics' bounded label, never the raw path
        self.headers = None  # the route's answer's headers (a NEW_SESSION answer's new ID is read there)


def peer(addr) -> str:
    """The client's address as the access log writes it."""
    if isinstance(addr, tuple) and addr:
        return str(addr[0])
    return str(addr or "-")


def request_environ(req, addr) -> dict:
    """What log_request reads from a WSGI environ, for a request answered without one
    (the worker's direct routes, WebSocket handshakes): gunicorn's parsed request."""
    environ = {"REQUEST_METHOD": req.method, "PATH_INFO": req.path, "REMOTE_ADDR": peer(addr)}
    for name, value in req.headers:
        key = _ENVIRON_KEY.get(name)
        if key is not None:
            environ[key] = value
    return environ


# A header's name as gunicorn gives it (upper case) -> its WSGI environ key, for the
# headers the line reads: one look-up a header instead of building each one's key.
# (Both spellings, as the environ's own key reads a header named with "_" or "-".)
_ENVIRON_KEY = {name: key for key in REQUEST_ID_KEYS + (SESSION_KEY,) for name in (key[5:].replace("_", "-"), key[5:])}


def _opened_session(headers) -> str | None:
    """The ID a NEW_SESSION request's answer opened (its New-Session-Id header), else None."""
    for name, value in headers or ():
        if name.lower() == _NEW_SESSION_HEADER:
            return value.split(";", 1)[0]
    return None


def log_request(environ: dict | Callable[[], dict], status: int, sent: int, started: float, quiet: bool = False,
                route: str | None = None, headers=None) -> None:
    """quiet: a health check's route, whose success SageMaker asks for every few seconds.
    route: the pattern of the route that answered (None: none did; the Flask app's
    own rule, if it has one, then names it). headers: the answer's, where a NEW_SESSION
    request's answer names the session it opened (only read for such a request)."""
    seconds = time.monotonic() - started
    if route is None:
        environ = _made(environ)
        route = _app_rule(environ) or UNMATCHED
    metrics.request(route, status, seconds)
    level = logging.DEBUG if status == 200 and quiet else logging.INFO
    if not log.isEnabledFor(level):
        return
    lines = _lines
    if lines is not None:
        if type(environ) is dict:
            # (A WSGI environ holds the body: only what the line reads waits with it.)
            environ = {key: environ[key] for key in _LINE_KEYS if key in environ}
        lines.add(logging.getLevelName(level), (environ, status, sent, seconds, route, headers))
        return
    message, fields = describe(environ, status, sent, seconds, route, headers, True)
    log.log(level, "%s", message, extra={"fields": fields})


def describe(environ: dict | Callable[[], dict], status: int, sent: int, seconds: float, route: str,
             headers, with_fields: bool) -> tuple[str, dict | None]:
    """A request's access line: its text message, and its fields for the JSON form."""
    environ = _made(environ)
    path = environ.get("PATH_INFO", "")
    method = environ.get("REQUEST_METHOD", "-")
    remote = environ.get("REMOTE_ADDR", "-")
    inference_id = _first(environ, INFERENCE_ID_KEYS)
    session = _first(environ, (SESSION_KEY,))
    if session == session_ids.NEW_SESSION:
        session = _opened_session(headers) or session
    message = '%s%d %d %.1fms id=%s' % (_request_part(remote, method, path), status, sent, seconds * 1000.0,
                                        _token(inference_id))
    if session is not None:
        message += " session=" + _token(session)
    if not with_fields:
        return message, None
    fields = {
        "method": method,
        "path": path,
        "route": route,
        "status": status,
        "bytes": sent,
        "latency_ms": round(seconds * 1000.0, 3),
        "remote": remote,
        "worker": os.getpid(),
    }
    if inference_id is not None:
        fields["inference_id"] = inference_id
    request_id = _first(environ, REQUEST_ID_KEYS)
    if request_id is not None:
        fields["request_id"] = request_id
    if session is not None:
        fields["session_id"] = session
    return message, fields


# The start of a line, `remote "METHOD PATH" `, by (remote, method, path): most lines
# repeat one of a few. Bounded (a caller chooses the path): emptied when full.
_request_parts: dict[tuple[str, str, str], str] = {}
_REQUEST_PARTS_KEPT = 256


def _request_part(remote: str, method: str, path: str) -> str:
    key = (remote, method, path)
    part = _request_parts.get(key)
    if part is None:
        # (One _quotable for both: JSON escapes character by character, so escaping the
        # two joined is escaping each.)
        part = '%s "%s" ' % (remote, _quotable(method + " " + path))
        if len(_request_parts) >= _REQUEST_PARTS_KEPT:
            _request_parts.clear()
        _request_parts[key] = part
    return part


def buffer_lines(fmt: str) -> None:
    """In a worker, once its gevent hub runs: access lines from here on are written
    buffered (logs.AccessLines), flushed ACCESS_FLUSH_S after the first one waiting, and
    by flush() at SIGTERM and before the worker exits (at the latest by atexit)."""
    global _lines
    import gevent  # here: only a worker runs a hub (the master imports this module too)

    _lines = logs.AccessLines(fmt, sys.stderr.fileno(), logs.timer_on(gevent.get_hub().loop, logs.ACCESS_FLUSH_S),
                              describe)
    logs.flush_on_exit(_lines)
    atexit.register(flush)


def flush() -> None:
    """Writes the access lines still buffered (a no-op outside a worker)."""
    logs.flush_access_lines()


def _made(environ):
    """environ may be given as the function that makes it: made only when it is read."""
    return environ() if callable(environ) else environ


def _first(environ: dict, keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = environ.get(key)
        if value:
            return value[:MAX_ID_CHARS]
    return None


def _token(value: str | None) -> str:
    """The id as one token of the text line: as it is when it is plain, else quoted, so
    a caller's id cannot forge the line's other fields."""
    if value is None:
        return "-"
    return value if _plain(value) and " " not in value else json.dumps(value)


def _quotable(value: str) -> str:
    """A field the line writes between double quotes (the method and path): as it is when
    it is plain, else escaped as JSON escapes a string, so that a '"' in a request's
    target cannot end the quotes and forge the fields after them."""
    return value if _plain(value) else json.dumps(value)[1:-1]


def _plain(value: str) -> bool:
    return value.isascii() and value.isprintable() and '"' not in value and "\\" not in value


def _app_rule(environ: dict) -> str | None:
    """The Flask rule that answered a request outside the table (a route a user added
    to the app): bounded like the table's patterns."""
    request = environ.get("werkzeug.request")
    rule = getattr(request, "url_rule", None)
    return getattr(rule, "rule", None)

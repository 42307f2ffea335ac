"""One access-log line per request, with fields CloudWatch can filter on, and the
request's metrics.

Written by the worker after each answer, instead of gunicorn's access log, buffered
(logs.AccessLines: a line costs far less than one through logging): SageMaker
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
from json.encoder import encode_basestring_ascii

from smserve import logs, memo, metrics
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


class Unparsed:
    """A request the parser refused (400, 408, 414, 431), as its line writes it: no method,
    path or header read."""

    method = path = "-"
    headers = ()


UNPARSED = Unparsed()


def peer(addr) -> str:
    """The client's address as the access log writes it."""
    if isinstance(addr, tuple) and addr:
        return str(addr[0])
    return str(addr or "-")


# A header's name as gunicorn gives it (upper case) -> its WSGI environ key, for the
# headers the line reads of a request answered without an environ: one look-up a header
# instead of building each one's key.
# (Both spellings, as the environ's own key reads a header named with "_" or "-".)
_ENVIRON_KEY = {name: key for key in REQUEST_ID_KEYS + (SESSION_KEY,) for name in (key[5:].replace("_", "-"), key[5:])}


def _opened_session(headers) -> str | None:
    """The ID a NEW_SESSION request's answer opened (its New-Session-Id header), else None."""
    for name, value in headers or ():
        if name.lower() == _NEW_SESSION_HEADER:
            return value.split(";", 1)[0]
    return None


def log_request(request: dict | tuple, status: int, sent: int, started: float, quiet: bool = False,
                route: str | None = None, headers=None) -> None:
    """request: the WSGI environ the app answered with, or (req, addr), gunicorn's parsed
    request and the peer's address, for a request answered without one (the worker's
    direct routes, refusals). quiet: a health check's route, whose success SageMaker asks
    for every few seconds. route: the pattern of the route that answered (None: none did;
    the Flask app's own rule, if it has one, then names it). headers: the answer's, where
    a NEW_SESSION request's answer names the session it opened (only read for such a
    request)."""
    seconds = time.monotonic() - started
    environ = None if type(request) is tuple else request
    if route is None:
        route = (environ is not None and _app_rule(environ)) or UNMATCHED
    metrics.request(route, status, seconds)
    level = logging.DEBUG if status == 200 and quiet else logging.INFO
    if not log.isEnabledFor(level):
        return
    lines = _lines
    with_request_id = lines is None or lines.json
    if environ is not None:
        get = environ.get
        details = _details(get("REMOTE_ADDR", "-"), get("REQUEST_METHOD", "-"), get("PATH_INFO", ""), environ,
                           status, sent, seconds, route, headers, with_request_id)
    else:
        req, addr = request
        ids = {}
        for name, value in req.headers:
            if name in _ENVIRON_KEY:
                ids[_ENVIRON_KEY[name]] = value
        details = _details(peer(addr), req.method, req.path, ids, status, sent, seconds, route, headers,
                           with_request_id)
    if lines is not None:
        lines.add(level, details)
        return
    message, fields = describe(details, True)
    log.log(level, "%s", message, extra={"fields": fields})


def _details(remote: str, method: str, path: str, ids: dict, status: int, sent: int, seconds: float, route: str,
             headers, with_request_id: bool) -> tuple:
    """What a request's line says (describe's arguments), read now and as strings and
    numbers only: a line waiting in the buffer keeps neither the request, its environ
    (which holds the body) nor the answer's headers alive: what a waiting line holds
    counts against the collector's gen0 threshold until the flush frees it. ids: the
    environ, or the id headers' values by their environ keys."""
    if not ids:
        return remote, method, path, status, sent, seconds, route, None, None, None
    session = _first(ids, (SESSION_KEY,))
    if session == session_ids.NEW_SESSION:
        session = _opened_session(headers) or session
    return (remote, method, path, status, sent, seconds, route, _first(ids, INFERENCE_ID_KEYS),
            _first(ids, REQUEST_ID_KEYS) if with_request_id else None, session)


# A line's text message, `remote "METHOD PATH" status bytes latency id=... [session=...]`:
# MESSAGE_FORMAT % message_args(details).
MESSAGE_FORMAT = '%s%d %d %.1fms id=%s%s'


def message_args(details: tuple) -> tuple:
    remote, method, path, status, sent, seconds, _, inference_id, _, session = details
    return (_request_parts.get((remote, method, path)) or _request_part(remote, method, path), status, sent,
            seconds * 1000.0, "-" if inference_id is None else _token(inference_id),
            "" if session is None else " session=" + _token(session))


# The JSON form after its head (`{"time": ..., "pid": N, "message": `): the message (as
# MESSAGE_FORMAT writes it, inside JSON's quotes), then the fields in describe's order,
# as JsonFormatter writes them: JSON_FORMAT % json_args(details).
# (MESSAGE_FORMAT has nothing JSON escapes: its arguments are escaped instead.)
JSON_FORMAT = f'"{MESSAGE_FORMAT}", %s, "status": %d, "bytes": %d, "latency_ms": %r, "remote": %s, "worker": %d%s}}'


def json_args(details: tuple) -> tuple:
    remote, method, path, status, sent, seconds, route, inference_id, request_id, session = details
    key = (method, path, route, remote)
    message_part, request, peer_json = _json_parts.get(key) or _json_part(key)
    ids = ""
    if inference_id is not None or request_id is not None or session is not None:
        ids = "".join(f', "{name}": {encode_basestring_ascii(value)}' for name, value in (
            ("inference_id", inference_id), ("request_id", request_id), ("session_id", session)) if value is not None)
    return (message_part, status, sent, seconds * 1000.0,
            "-" if inference_id is None else _json_inner(_token(inference_id)),
            "" if session is None else _json_inner(" session=" + _token(session)),
            request, status, sent, _latency_ms(seconds), peer_json, _pid[0], ids)


def _latency_ms(seconds: float) -> float:
    """The JSON form's latency_ms: to the microsecond (cheaper than round())."""
    return int(seconds * 1e6 + 0.5) / 1000


def _json_inner(text: str) -> str:
    """text as it reads inside a JSON string's quotes."""
    return text if _plain(text) else encode_basestring_ascii(text)[1:-1]


def describe(details: tuple, with_fields: bool) -> tuple[str, dict | None]:
    """A request's access line from its _details: its text message, and its fields for
    the JSON form."""
    message = MESSAGE_FORMAT % message_args(details)
    if not with_fields:
        return message, None
    remote, method, path, status, sent, seconds, route, inference_id, request_id, session = details
    fields = {
        "method": method,
        "path": path,
        "route": route,
        "status": status,
        "bytes": sent,
        "latency_ms": _latency_ms(seconds),
        "remote": remote,
        "worker": _pid[0],
    }
    if inference_id is not None:
        fields["inference_id"] = inference_id
    if request_id is not None:
        fields["request_id"] = request_id
    if session is not None:
        fields["session_id"] = session
    return message, fields


# This process's ID (the JSON line's "worker"), read once, and again in a forked child.
_pid = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))

# The start of a line, `remote "METHOD PATH" `, by (remote, method, path): most lines
# repeat one of a few. Bounded (a caller chooses the path): emptied when full.
_request_parts: dict[tuple[str, str, str], str] = {}
_REQUEST_PARTS_KEPT = 256


# The JSON form's `"method": ..., "path": ..., "route": ...` and its remote, by (method,
# path, route, remote): as _request_parts.
_json_parts: dict[tuple[str, str, str, str], tuple[str, str, str]] = {}


def _json_part(key: tuple[str, str, str, str]) -> tuple[str, str, str]:
    """The message's start inside JSON's quotes, `"method": ..., "path": ..., "route": ...`
    and the remote as JSON, for (method, path, route, remote)."""
    method, path, route, remote = key
    return memo.keep(_json_parts, key, (
        _json_inner(_request_parts.get((remote, method, path)) or _request_part(remote, method, path)),
        f'"method": {encode_basestring_ascii(method)}, "path": {encode_basestring_ascii(path)}, '
        f'"route": {encode_basestring_ascii(route)}', encode_basestring_ascii(remote)), _REQUEST_PARTS_KEPT)


def _request_part(remote: str, method: str, path: str) -> str:
    """The start of a line, where _request_parts has none for it yet."""
    # (One _quotable for both: JSON escapes character by character, so escaping the two
    # joined is escaping each.)
    return memo.keep(_request_parts, (remote, method, path), '%s "%s" ' % (remote, _quotable(method + " " + path)),
                     _REQUEST_PARTS_KEPT)


def buffer_lines(fmt: str) -> None:
    """In a worker, once its gevent hub runs: access lines from here on are written
    buffered (logs.AccessLines), flushed ACCESS_FLUSH_S after the first one waiting, and
    by flush() at SIGTERM and before the worker exits (at the latest by atexit)."""
    global _lines
    import gevent  # here: only a worker runs a hub (the master imports this module too)

    _lines = access_lines(fmt, sys.stderr.fileno(), logs.timer_on(gevent.get_hub().loop, logs.ACCESS_FLUSH_S))
    logs.flush_on_exit(_lines)
    atexit.register(flush)


def access_lines(fmt: str, fd: int, schedule) -> logs.AccessLines:
    """The buffer a worker writes its access lines through (fmt: text or json)."""
    return logs.AccessLines(fmt, fd, schedule,
                            (JSON_FORMAT, json_args) if fmt == "json" else (MESSAGE_FORMAT, message_args), shorter)


# What ends a string the line had to cut (shorter).
CUT_MARK = "..."


def shorter(details: tuple, chars: int) -> tuple:
    """details with what the client chose (method, path, ids, session) cut to `chars`
    each: for a line too long for one atomic write (escaping makes a target of a few KB
    a line of tens)."""
    remote, method, path, status, sent, seconds, route, inference_id, request_id, session = details
    return (remote, _cut(method, chars), _cut(path, chars), status, sent, seconds, route, _cut(inference_id, chars),
            _cut(request_id, chars), _cut(session, chars))


def _cut(value: str | None, chars: int) -> str | None:
    return value if value is None or len(value) <= chars else value[:chars] + CUT_MARK


def flush() -> None:
    """Writes the access lines still buffered (a no-op outside a worker)."""
    logs.flush_access_lines()


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

"""One access-log line per request, with fields CloudWatch can filter on.

Written by the worker after each answer, instead of gunicorn's access log: SageMaker
pings every few seconds, so a successful /ping is logged at DEBUG, and in JSON mode
each line carries its fields (method, path, status, bytes, latency, request id,
worker) instead of one preformatted message.
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("smserve.access")

# Headers SageMaker and AWS load balancers use to identify a request.
REQUEST_ID_KEYS = ("HTTP_X_AMZN_REQUESTID", "HTTP_X_AMZN_SAGEMAKER_INFERENCE_ID", "HTTP_X_AMZN_TRACE_ID",
                   "HTTP_X_REQUEST_ID")


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
        key = "HTTP_" + name.replace("-", "_")
        if key in REQUEST_ID_KEYS:
            environ[key] = value
    return environ


def log_request(environ: dict, status: int, sent: int, started: float, quiet: bool = False) -> None:
    """quiet: a health check's route, whose success SageMaker asks for every few seconds."""
    path = environ.get("PATH_INFO", "")
    level = logging.DEBUG if status == 200 and quiet else logging.INFO
    if not log.isEnabledFor(level):
        return
    method = environ.get("REQUEST_METHOD", "-")
    latency_ms = round((time.monotonic() - started) * 1000.0, 3)
    fields = {
        "method": method,
        "path": path,
        "status": status,
        "bytes": sent,
        "latency_ms": latency_ms,
        "remote": environ.get("REMOTE_ADDR", "-"),
        "worker": os.getpid(),
    }
    for key in REQUEST_ID_KEYS:
        if environ.get(key):
            fields["request_id"] = environ[key]
            break
    log.log(level, '%s "%s %s" %d %d %.1fms', fields["remote"], method, path, status, sent, latency_ms,
            extra={"fields": fields})

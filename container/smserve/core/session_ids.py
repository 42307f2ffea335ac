"""SageMaker's stateful-session headers, and the session IDs this server gives.

SageMaker passes InvokeEndpoint's `SessionId` as `X-Amzn-SageMaker-Session-Id`:
`NEW_SESSION`, or an ID the container gave. The container answers a new one with
`X-Amzn-SageMaker-New-Session-Id: <id>; Expires=<YYYY-MM-DDTHH:MM:SSZ>` and a closed one
with `X-Amzn-SageMaker-Closed-Session-Id: <id>`. An ID is letters and digits in groups
joined by hyphens, at most 256 characters with its Expires (SageMaker's patterns).

An ID says which worker holds its session, and which start of that worker:
`<worker index>-<the worker's start token>-<32 random hex digits>`. Whichever worker
accepts a request reads the owner from it and hands the connection there
(http/handoff.py); a worker started again has a new token, so an ID from before its
restart is refused (its state died with the old process), never served without it.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass

from smserve.errors import BadRequest

SESSION_ID = "X-Amzn-SageMaker-Session-Id"
NEW_SESSION_ID = "X-Amzn-SageMaker-New-Session-Id"
CLOSED_SESSION_ID = "X-Amzn-SageMaker-Closed-Session-Id"
NEW_SESSION = "NEW_SESSION"
# SageMaker's pattern for a session ID, and its bound on the New-Session-Id header.
_ID = re.compile(r"[a-zA-Z0-9](?:-*[a-zA-Z0-9])*")
MAX_HEADER_CHARS = 256
_OURS = re.compile(r"(\d{1,4})-([0-9a-f]{8})-([0-9a-f]{32})")
# The Expires attribute's form, in UTC.
EXPIRES_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True)
class SessionId:
    """A session ID this server gave: which worker holds it, and which start of it."""

    worker: int
    start: str
    text: str


def start_token() -> str:
    """A worker start's token: 8 hex digits, different at every (re)start."""
    return secrets.token_hex(4)


def new_id(worker: int, start: str) -> str:
    return f"{worker}-{start}-{secrets.token_hex(16)}"


def requested(value: str | None) -> str | None:
    """The request's session header, checked: None without one, NEW_SESSION, or an ID
    of SageMaker's form (400 otherwise, the value never echoed raw)."""
    if value is None:
        return None
    if value == NEW_SESSION:
        return value
    if len(value) > MAX_HEADER_CHARS or not _ID.fullmatch(value):
        raise BadRequest(f"{SESSION_ID} must be {NEW_SESSION} or a session ID this endpoint gave (letters, digits "
                         f"and hyphens, at most {MAX_HEADER_CHARS}), not {value[:64]!r}"
                         + (" ..." if len(value) > 64 else ""))
    return value


def parse(value: str) -> SessionId | None:
    """The owner of an ID of our form; None for any other (no session of ours has it)."""
    found = _OURS.fullmatch(value)
    if found is None:
        return None
    return SessionId(int(found.group(1)), found.group(2), value)


def owner(value: str | None) -> int | None:
    """The worker index an existing session's ID names, read off a request's header
    value cheaply (no checks: the owner checks); None for none, NEW_SESSION or a
    value not of our form."""
    if not value or value == NEW_SESSION:
        return None
    found = _OURS.fullmatch(value)
    return int(found.group(1)) if found else None


def expires_text(expires_at: float) -> str:
    """An expiry (time.time() seconds) as Expires writes it, in UTC."""
    return time.strftime(EXPIRES_FORMAT, time.gmtime(expires_at))


def new_session_header(session_id: str, expires_at: float) -> str:
    """The New-Session-Id value: the ID and its expiry."""
    return f"{session_id}; Expires={expires_text(expires_at)}"

"""The opening handshake of a WebSocket session (RFC 6455 section 4.2): which requests
may switch protocols, and the 101 that does."""

from __future__ import annotations

import base64
import binascii
from http import HTTPStatus

from wsproto.utilities import generate_accept_token

from smserve.core import session_ids
from smserve.errors import BadRequest
from smserve.http.handoff import session_header

# SageMaker's path; the caller may choose another (X-Amzn-SageMaker-Model-Invocation-Path):
# any path that is not a route of the table takes a handshake (offers_websocket).
PATH = "/invocations-bidirectional-stream"


class HandshakeRefused(Exception):
    """A request that cannot open a session: answered with this status, then closed."""

    def __init__(self, status: HTTPStatus, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.headers = headers or {}


def offers_websocket(req) -> bool:
    """The request asks to switch to WebSocket (Upgrade lists it): on a path of no route,
    it opens a session there. A scan of the head's few fields, no allocation."""
    for name, value in req.headers:
        if name == "UPGRADE" and "websocket" in value.lower():
            return True
    return False


def check_handshake(req) -> str:
    """The request's Sec-WebSocket-Key, once the request is a handshake we take;
    HandshakeRefused otherwise."""
    headers: dict[str, list[str]] = {}
    for name, value in req.headers:
        headers.setdefault(name, []).append(value)

    def one(name: str) -> str:
        return ",".join(headers.get(name, ()))

    if req.method != "GET":
        raise HandshakeRefused(HTTPStatus.METHOD_NOT_ALLOWED, f"{req.path} takes a WebSocket handshake (GET), not "
                               f"{req.method}", {"Allow": "GET"})
    if req.version < (1, 1):
        # RFC 6455 4.1: the handshake is an HTTP/1.1 (or later) request; HTTP/1.0 has no
        # Upgrade, and a 1.0 intermediary would pass the 101 on without switching.
        raise HandshakeRefused(HTTPStatus.BAD_REQUEST, f"a WebSocket handshake must be HTTP/1.1 (RFC 6455 4.1), not "
                               f"HTTP/{req.version[0]}.{req.version[1]}")
    connection = [token.strip().lower() for token in one("CONNECTION").split(",")]
    # Upgrade is a list of protocols the client could switch to (RFC 9110 7.8): it
    # offers WebSocket if the list holds it (RFC 6455 4.2.1), whatever else it offers.
    offered = [token.strip().lower() for token in one("UPGRADE").split(",")]
    if "websocket" not in offered or "upgrade" not in connection:
        raise HandshakeRefused(HTTPStatus.UPGRADE_REQUIRED, f"{req.path} speaks WebSocket only: send Upgrade: websocket "
                               "and Connection: Upgrade", {"Upgrade": "websocket", "Sec-WebSocket-Version": "13"})
    if one("SEC-WEBSOCKET-VERSION").strip() != "13":
        raise HandshakeRefused(HTTPStatus.UPGRADE_REQUIRED, "only WebSocket version 13 (RFC 6455) is spoken",
                               {"Sec-WebSocket-Version": "13"})
    keys = headers.get("SEC-WEBSOCKET-KEY", [])
    if len(keys) > 1:
        # RFC 6455 4.1: the field appears once. Two would leave it open which one the
        # accept token answers.
        raise HandshakeRefused(HTTPStatus.BAD_REQUEST, "Sec-WebSocket-Key must be sent once")
    key = keys[0].strip() if keys else ""
    try:
        if len(base64.b64decode(key, validate=True)) != 16:
            raise ValueError
    except (ValueError, binascii.Error):
        raise HandshakeRefused(HTTPStatus.BAD_REQUEST, "Sec-WebSocket-Key must be 16 bytes in base64") from None
    if _has_body(headers):
        # After the 101 the connection carries frames: a body's bytes would be read as
        # frames. A handshake is a GET without one.
        raise HandshakeRefused(HTTPStatus.BAD_REQUEST, "a WebSocket handshake has no body: send no Content-Length "
                               "(or 0) and no Transfer-Encoding")
    return key


def _has_body(headers: dict[str, list[str]]) -> bool:
    if "TRANSFER-ENCODING" in headers:
        return True
    return any(value.strip() != "0" for value in headers.get("CONTENT-LENGTH", ()))


def accept_response(key: str) -> bytes:
    """The 101 for a key check_handshake took (so ASCII: base64)."""
    token = generate_accept_token(key.encode("ascii")).decode("ascii")
    return (
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {token}\r\n\r\n"
    ).encode("ascii")


def check_session(server, req) -> None:
    """A handshake naming a stateful session (X-Amzn-SageMaker-Session-Id) is held to the
    rules an HTTP request naming it is: a malformed ID, or one this worker does not hold
    open (unknown, forged, closed, expired, its predecessor's), is a 400 before any 101.
    (One another worker holds was handed to it before this: http/handoff.py.)"""
    value = session_header(req)
    if value is None:
        return
    try:
        requested = session_ids.requested(value)
        if requested != session_ids.NEW_SESSION:
            server.sessions.find(requested, server)
    except BadRequest as e:
        raise HandshakeRefused(HTTPStatus.BAD_REQUEST, e.message) from None

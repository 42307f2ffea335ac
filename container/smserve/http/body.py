"""A request's body, read whole before the route runs: within the body deadline and the
payload limit, chunked bodies bounded in chunks as well as bytes, and every way a body
can be wrong answered with the status that says so.

Reading turns on the event loop (Turn): recv() on a gevent socket yields only when the
socket is empty, so a client that keeps sending (a big body, after an error answer, or a
big WebSocket message) would hold the loop, and every /ping behind it, for as long as it
sends; a reader calls `turn.take()` after each read instead."""

from __future__ import annotations

import io
import time
from http import HTTPStatus

import gevent
from gunicorn.http import errors as http_errors
from gunicorn.http.body import LengthReader

READ_SIZE = 1024 * 1024
# A body up to this size is joined from its reads in one copy (_Body).
JOIN_BYTES = 1024 * 1024
# Non-empty chunks in one chunked body, as Triton's HTTP front end allows (its wording
# too): each costs a Python-level parse, so many tiny chunks cost far more than their bytes.
MAX_CHUNKS = 1 << 16


# Longest one greenlet's busy reading runs before the others (a /ping) get a turn.
LOOP_TURN_S = 0.002


class Turn:
    """One reader's share of the loop (the module's docstring says why)."""

    def __init__(self) -> None:
        self.since = time.monotonic()

    def take(self) -> None:
        """Yield to the loop if this reader has had it for LOOP_TURN_S."""
        if time.monotonic() - self.since > LOOP_TURN_S:
            # sleep(0) may resume this greenlet before the loop polls for I/O again;
            # any positive time waits for the next poll.
            gevent.sleep(LOOP_TURN_S / 20)
            self.since = time.monotonic()


class ClientError(Exception):
    """The request cannot be served as sent; answered with a JSON error, then closed."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def joined_headers(req) -> dict[str, str]:
    """Header name (upper case) -> value, repeated fields joined with a comma as WSGI
    joins them (so an ambiguous repeat stays visible to the codecs)."""
    headers: dict[str, str] = {}
    for name, value in req.headers:
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    return headers


def asks_to_close(req) -> bool:
    """`close` among the Connection header's options, in any of its fields (RFC 9112 9.6):
    gunicorn's own check reads only a first field that is exactly `close`."""
    for name, value in req.headers:
        if name == "CONNECTION" and any(option.strip(" \t").lower() == "close" for option in value.split(",")):
            return True
    return False


def _too_big(settings) -> str:
    return f"exceeds the payload limit of {settings.max_body_bytes} bytes ({settings.body_limit_setting})"


def check_head(req, settings) -> int | None:
    """What the head alone says is wrong with the body: a transfer coding we do not
    undo, or a Content-Length over the payload limit. The Content-Length, if any."""
    check_transfer_coding(req)
    declared = content_length(req)
    if declared is not None and declared > settings.max_body_bytes:
        raise ClientError(413, f"request body of {declared} bytes {_too_big(settings)}")
    return declared


def read_body(req, declared: int | None, settings, unreader=None) -> bytes:
    """The whole body, within the body deadline and the payload limit; `declared`:
    its Content-Length, from check_head, which the head has passed. unreader: the
    parser's, whose socket a body of known length is read from directly."""
    limit = settings.max_body_bytes
    too_big = _too_big(settings)
    if req.body is None:
        return b""
    turn = Turn()
    if declared is not None and unreader is not None and isinstance(getattr(req.body, "reader", None), LengthReader):
        return _read_sized(req, declared, unreader, turn)
    check_chunks(req.body, limit, too_big, turn)
    body = _Body()
    total = 0
    try:
        # (The body deadline is the connection's: its reads raise the 408 when they would
        # wait past it.)
        while True:
            data = req.body.read(READ_SIZE)
            if not data:
                break
            total += len(data)
            if total > limit:
                raise ClientError(413, f"request body {too_big}")
            body.add(data)
            turn.take()  # a fast sender of a big body must not hold the loop
    except (http_errors.ParseException, http_errors.NoMoreData) as e:
        status, message = parse_error(e)
        raise ClientError(status, f"malformed request body: {message}") from None
    if declared is not None and total < declared:
        raise ClientError(400, f"request body ended after {total} of its {declared} bytes (Content-Length)")
    return body.value()


class _Body:
    """A body's reads, gathered. Up to JOIN_BYTES they are kept as they came and joined
    once at the end (one copy of the body); past that they grow in a BytesIO, whose
    buffer is enlarged in place and whose getvalue() hands it over without a copy,
    where joining would copy the whole body in one step with the GIL held (/ping
    waiting)."""

    __slots__ = ("parts", "size", "grown")

    def __init__(self, first: bytes = b""):
        self.parts = [first] if first else []
        self.size = len(first)
        self.grown: io.BytesIO | None = None

    def add(self, data: bytes) -> None:
        self.size += len(data)
        if self.grown is not None:
            self.grown.write(data)
        elif self.size <= JOIN_BYTES:
            self.parts.append(data)
        else:
            self.grown = io.BytesIO(b"".join(self.parts))
            self.grown.seek(0, io.SEEK_END)
            self.grown.write(data)
            self.parts = []

    def value(self) -> bytes:
        if self.grown is not None:
            return self.grown.getvalue()
        parts = self.parts
        return parts[0] if len(parts) == 1 else b"".join(parts)


def _read_sized(req, declared: int, unreader, turn: Turn) -> bytes:
    """A body of `declared` bytes, read from the socket under gunicorn's reader: what
    came with the head (and is buffered), then straight from the socket, each byte
    copied once on its way to the one buffer that is handed over. gunicorn's Body,
    LengthReader and Unreader pass every byte through three buffers; its reader is
    then told the body has been read."""
    ahead = unreader.take_buffered()
    if len(ahead) > declared:
        unreader.unread(ahead[declared:])  # a pipelined request's first bytes
        ahead = ahead[:declared]
    source = unreader.sock
    got = len(ahead)
    body = _Body(ahead)
    while got < declared:
        data = source.recv(min(declared - got, READ_SIZE))
        if not data:
            break
        got += len(data)
        body.add(data)
        turn.take()
    req.body.reader.length = 0  # nothing left for gunicorn's reader: the parser moves to the next request
    if got < declared:
        raise ClientError(400, f"request body ended after {got} of its {declared} bytes (Content-Length)")
    return body.value()


def check_chunks(body, limit: int, too_big: str, turn: Turn) -> None:
    """A chunked body is refused as soon as its declared chunk sizes pass the limit,
    not after that many bytes have been read (or waited for), and past MAX_CHUNKS
    chunks. Each chunk is parsed in Python, and one read of the body parses as many as
    its bytes hold (a million in 6 MB of one-byte chunks), so the loop gets its turns
    between chunks too."""
    reader = getattr(body, "reader", None)
    parse = getattr(reader, "parse_chunk_size", None)
    if parse is None:
        return
    declared = 0
    chunks = 0

    def checked(unreader, data=None):
        nonlocal declared, chunks
        size, rest = parse(unreader, data)
        declared += size
        if declared > limit:
            raise ClientError(413, f"chunked request body of at least {declared} bytes {too_big}")
        if size:
            chunks += 1
            if chunks > MAX_CHUNKS:
                raise ClientError(400, f"Chunked request body exceeds maximum of {MAX_CHUNKS} non-empty chunks. "
                                  "Send fewer or larger HTTP chunks.")
        turn.take()
        return size, rest

    reader.parse_chunk_size = checked


def check_transfer_coding(req) -> None:
    """gunicorn lets gzip, deflate and compress through as transfer codings, for the
    application to undo; ours do not, so such a body would reach the codecs still
    compressed. RFC 9112 6.1: a transfer coding the server does not understand is 501."""
    for name, value in req.headers:
        if name == "TRANSFER-ENCODING":
            codings = [v.strip(" \t").lower() for v in value.split(",")]
            others = [c for c in codings if c != "chunked"]
            if others:
                raise ClientError(501, f"Transfer-Encoding {', '.join(others)} is not supported: send the body "
                                  "chunked or with a Content-Length (compressed, if you like, with "
                                  "Content-Encoding: gzip or deflate)")


def content_length(req) -> int | None:
    for name, value in req.headers:
        if name == "CONTENT-LENGTH":
            return int(value)  # gunicorn has checked it is one non-negative integer
    return None


# gunicorn's parse errors whose own `code` (400, or none) is not the status that says what
# is wrong. An Expect gunicorn does not meet (anything but 100-continue) is RFC 9110
# 10.1.1's 417.
_PARSE_STATUS = (
    (http_errors.LimitRequestLine, HTTPStatus.REQUEST_URI_TOO_LONG),
    (http_errors.LimitRequestHeaders, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE),
    (http_errors.UnsupportedTransferCoding, HTTPStatus.NOT_IMPLEMENTED),
    (http_errors.ExpectationFailed, HTTPStatus.EXPECTATION_FAILED),
)


def parse_error(e: Exception) -> tuple[int, str]:
    if isinstance(e, http_errors.NoMoreData):
        return int(HTTPStatus.BAD_REQUEST), "the connection ended inside the request"
    status = getattr(e, "code", HTTPStatus.BAD_REQUEST)
    for kind, named in _PARSE_STATUS:
        if isinstance(e, kind):
            status = named
            break
    if not 400 <= status < 600:
        status = HTTPStatus.BAD_REQUEST
    return int(status), f"{type(e).__name__}: {e}"

"""Request bodies sent compressed: `Content-Encoding: gzip` or `deflate`.

tritonclient compresses a request when asked (`request_compression_algorithm`), as
Triton's HTTP front end accepts. A compressed body is inflated before any protocol
sees it, into at most the payload limit: a few KB of gzip can claim gigabytes, so the
output is bounded as it is made, never after. zlib releases the GIL while it inflates,
and the work grows with the output, not with the body on the wire, so it always runs on
a codec thread. Any other coding is a 415 that names the ones taken.
"""

from __future__ import annotations

import zlib

from smserve.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType

IDENTITY = "identity"
# Inflated per zlib call: the list of pieces stays short and the limit is checked often.
_PIECE = 1 << 20
# Compressed bytes handed to zlib per call.
_FEED = 64 << 10
_GZIP_MAGIC = b"\x1f\x8b"
# gzip members one after another in one body. Each costs a fresh inflater whatever its
# size, and an empty one is 20 bytes that add nothing to the output limit; bgzip's
# 64 KB blocks make ~1,600 of them for the largest body (100 MB).
MAX_MEMBERS = 10_000


def codings(header: str | None) -> list[str]:
    """The codings a Content-Encoding header lists, in the order they were applied
    (identity dropped); a coding we cannot undo is a 415."""
    if not header:
        return []
    listed = [token.strip().lower() for token in header.split(",")]
    found = []
    for token in listed:
        if token == IDENTITY:
            continue
        if token not in _WBITS:
            raise UnsupportedMediaType(f"Content-Encoding '{token}' is not supported: send the body as it is "
                                       f"(identity), or compressed with gzip or deflate")
        found.append(token)
    return found


def decode(body: bytes, header: str | None, limit: int, limit_setting: str, server) -> bytes:
    """The body with its content codings undone, on a codec thread; unchanged when it
    has none. More than `limit` bytes of output is a 413."""
    applied = codings(header)
    if not applied or not body:  # no body is no body, however it says it is coded
        return body
    for coding in reversed(applied):
        # The size given is the work's bound (the limit), so it goes to a codec thread.
        body = server.codec(limit, inflate, body, coding, limit, limit_setting)
    return body


def inflate(data: bytes, coding: str, limit: int, limit_setting: str = "") -> bytes:
    """gzip (one or more members) or deflate (zlib-wrapped, as RFC 9110 defines it, or
    raw, as some clients send it) -> the bytes, at most `limit` of them."""
    wbits = _WBITS[coding]
    if coding == "deflate" and not _zlib_header(data):
        wbits = -zlib.MAX_WBITS
    pieces: list[bytes] = []
    size = 0
    view = memoryview(data)
    at = 0
    members = 1
    inflater = zlib.decompressobj(wbits)
    try:
        while True:
            # Fed a bounded chunk at a time: zlib copies the input it has not used into
            # unconsumed_tail on every call, which over a whole body would be quadratic.
            pending = view[at : at + _FEED]
            at += len(pending)
            while True:
                piece = inflater.decompress(pending, _PIECE)
                size += len(piece)
                if size > limit:
                    raise PayloadTooLarge(f"Decompressed data size exceeds the maximum allowed value of {limit} "
                                          f"bytes ({limit_setting or 'the payload limit'})")
                pieces.append(piece)
                pending = inflater.unconsumed_tail
                # A full piece with no input left may still have output in zlib's window.
                if inflater.eof or (not pending and len(piece) < _PIECE):
                    break
            if inflater.eof:
                # Where this stream ended: what it did not use of the last chunk was fed.
                at -= len(inflater.unused_data)
                if at >= len(view) or _all_zero(view, at):  # (gzip(1) takes zero padding too)
                    return b"".join(pieces)
                # gzip allows members one after another (RFC 1952 2.2); anything else is not ours to guess.
                if coding == "deflate" or view[at : at + 2] != _GZIP_MAGIC:
                    raise BadRequest(f"{len(view) - at} bytes follow the end of the body's {coding} stream")
                members += 1
                if members > MAX_MEMBERS:
                    raise BadRequest(f"the body's gzip stream has more than {MAX_MEMBERS} members")
                inflater = zlib.decompressobj(wbits)
            elif at >= len(view):
                raise BadRequest(f"the body ends before its {coding} stream does (Content-Encoding: {coding})")
    except zlib.error as e:
        raise BadRequest(f"the body is not valid {coding} data (Content-Encoding: {coding}): {e}") from None


def _all_zero(view: memoryview, at: int) -> bool:
    for start in range(at, len(view), _FEED):
        window = bytes(view[start : start + _FEED])
        if window.count(0) != len(window):
            return False
    return True


_WBITS = {
    "gzip": 16 + zlib.MAX_WBITS,
    "x-gzip": 16 + zlib.MAX_WBITS,
    "deflate": zlib.MAX_WBITS,
}


def _zlib_header(data: bytes) -> bool:
    """RFC 1950's two header bytes: method 8 (deflate) and a check value divisible by 31."""
    return len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0

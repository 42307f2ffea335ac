"""Request bodies sent compressed: `Content-Encoding: gzip` or `deflate`.

tritonclient compresses a request when asked (`request_compression_algorithm`), as
Triton's HTTP front end accepts. A compressed body is inflated before any protocol
sees it, into at most the payload limit: a few KB of gzip can claim gigabytes, so the
output is bounded as it is made, never after. zlib releases the GIL while it inflates,
and the work grows with the output, not with the body on the wire, so it always runs on
a codec thread. Any other coding is a 415 that names the ones taken.

Bounded in total too: a hundred bodies of 100 KB can each claim the payload limit, and
a body inflated ahead of its turn would be held while it waits for a codec thread and
the model. So each worker holds at most as many payload limits of inflated bytes as it
has codec threads (InflatedBytes): a body is inflated only when that leaves room, and
its bytes count from then until its request is done, when the route releases them
(Inflated.release: once the answer is made, or a streamed answer has ended). A
request that finds no room within INFLATE_WAIT_S is a 503 with Retry-After, so memory
stays in proportion to what was received.
"""

from __future__ import annotations

import zlib
from collections import deque

from gevent.event import Event

from smserve.errors import BadRequest, PayloadTooLarge, Unavailable, UnsupportedMediaType

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
# How long a request waits for room among the inflated bodies before its 503: well
# within SageMaker's 60 s invocation timeout, so the client hears why.
INFLATE_WAIT_S = 30.0


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


def decode(body: bytes, header: str | None, limit: int, limit_setting: str, offload,
           ledger: "InflatedBytes") -> "Inflated":
    """The body with its content codings undone (unchanged when it has none), holding
    its room in the worker's ledger until the caller releases it. More than `limit`
    bytes of output is a 413. offload(size, fn, *args): runs fn on a codec thread when
    size says it is big (engine/runtime/threads.Pools.offload)."""
    applied = codings(header)
    if not applied or not body:  # no body is no body, however it says it is coded
        return Inflated(body)
    ledger.reserve(limit)  # the most this body can become, until it is made
    try:
        for coding in reversed(applied):
            # The size given is the work's bound (the limit), so it goes to a codec thread.
            body = offload(limit, inflate, body, coding, limit, limit_setting)
    except BaseException:
        ledger.release(limit)
        raise
    ledger.release(limit - len(body))  # from now on the body counts as what it became
    return Inflated(body, ledger, len(body))


class Inflated:
    """A request's body as the protocols read it, and the room it holds in its worker's
    ledger until release(). The route that asked for it releases it once, when the
    request is done: whatever still refers to the bytes then (an array viewing them) is
    the request's own and goes with it."""

    __slots__ = ("body", "_ledger", "_size")

    def __init__(self, body: bytes, ledger: "InflatedBytes | None" = None, size: int = 0):
        self.body = body
        self._ledger = ledger
        self._size = size

    def release(self) -> None:
        """Gives the room back (once; later calls do nothing) and lets go of the body."""
        ledger, self._ledger = self._ledger, None
        self.body = b""
        if ledger is not None:
            ledger.release(self._size)


class InflatedBytes:
    """One worker's inflated request bodies, at most `capacity` bytes of them at once.

    Used on the event loop only. Two numbers and the queue of requests waiting for
    room: a reservation and a release are O(1) whatever came before, and a request done
    leaves nothing here. Room is handed out first come, first served: a release wakes
    the requests at the head of the queue that now fit."""

    def __init__(self, capacity: int, wait_s: float = INFLATE_WAIT_S):
        self.capacity = capacity
        self.wait_s = wait_s
        self.reserved = 0  # bytes of bodies being inflated (their limit) or in use (their size)
        self._waiting: deque[tuple[Event, int]] = deque()

    @classmethod
    def for_worker(cls, codec_threads: int, limit: int) -> "InflatedBytes":
        """Room for as many bodies of the limit as the worker has codec threads (each
        inflates one at a time), and never less than one."""
        return cls(max(1, codec_threads) * limit)

    @property
    def in_flight(self) -> int:
        """Bytes reserved for bodies being inflated or held by requests not yet done."""
        return self.reserved

    def reserve(self, size: int) -> None:
        """Wait, in turn, until `size` more bytes fit; a 503 with Retry-After if they do
        not within wait_s."""
        if not self._waiting and self.reserved + size <= self.capacity:
            self.reserved += size
            return
        turn = (Event(), size)
        self._waiting.append(turn)
        try:
            turn[0].wait(self.wait_s)
        except BaseException:  # its greenlet killed while it waited (the client gone at a drain's end)
            self._withdraw(turn)
            raise
        if turn[0].is_set():
            return  # _admit counted it in
        self._withdraw(turn)
        raise Unavailable(f"this worker holds {self.reserved} bytes of decompressed request bodies, its most "
                          f"({self.capacity}); retry, or send the body uncompressed", headers={"Retry-After": "1"})

    def release(self, size: int) -> None:
        self.reserved -= size
        self._admit()

    def _withdraw(self, turn: tuple[Event, int]) -> None:
        if turn[0].is_set():
            self.release(turn[1])  # let in just as it left
        else:
            self._waiting.remove(turn)
            self._admit()  # it may have held back smaller requests behind it

    def _admit(self) -> None:
        while self._waiting and self.reserved + self._waiting[0][1] <= self.capacity:
            event, size = self._waiting.popleft()
            self.reserved += size
            event.set()


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

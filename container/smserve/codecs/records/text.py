"""A text body's lines, cut into slices of whole lines a bounded size each.

Every record format here (CSV, JSON Lines) reads one record a line; parsing a slice of
lines per C call, not the whole body, lets the event loop's thread get the GIL between
slices (slices.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from smserve.codecs import slices
from smserve.errors import BadRequest

WHITESPACE = b" \t\r\n\f\v"
# What a blank line holds.
BLANK = " \t\r\f\v"
BLANK_BYTES = BLANK.encode()


def lines(body: bytes, size: int | None = None) -> Iterator[tuple[bytes, int]]:
    """(slice, number of its first line): whole lines, at most `size` bytes together or
    one longer line alone, with the newline between slices dropped and trailing blank
    lines ignored."""
    for start, stop, number in spans(body, size or slices.TEXT_BYTES):
        yield body[start:stop], number


def spans(body: bytes, size: int) -> Iterator[tuple[int, int, int]]:
    """lines() as (start, stop, number of its first line) in `body`: a slice longer than
    `size` is one line, and the caller can read it a bounded piece at a time."""
    end = len(body)
    while end:  # trailing whitespace, a bounded piece at a time
        chunk = body[max(0, end - 4096) : end]
        kept = len(chunk.rstrip(WHITESPACE))
        end -= len(chunk) - kept
        if kept:
            break
    if not end:
        raise BadRequest("request body holds no records")
    pos, number = 0, 1
    while pos < end:
        stop = end if end - pos <= size else body.rfind(b"\n", pos, pos + size + 1)
        if stop < 0:  # the line at pos is longer than a slice: it goes alone
            stop = body.find(b"\n", pos + size, end)
            stop = end if stop < 0 else stop
            lines_in = 1
        else:
            lines_in = body.count(b"\n", pos, stop) + 1
        yield pos, stop, number
        number += lines_in
        pos = stop + 1

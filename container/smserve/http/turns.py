"""Turns on the event loop for greenlets that read a socket the client keeps full.

recv() on a gevent socket yields to the loop only when the socket is empty, so a client
that keeps sending (a fast sender of a big body or of a big WebSocket message) would
hold the loop, and every /ping behind it, for as long as it sends. A reader calls
`turn.take()` after each read; every LOOP_TURN_S of reading it lets the others run.
"""

from __future__ import annotations

import time

import gevent

# Longest one greenlet's busy reading runs before the others (a /ping) get a turn.
LOOP_TURN_S = 0.002


class Turn:
    def __init__(self) -> None:
        self.since = time.monotonic()

    def take(self) -> None:
        """Yield to the loop if this reader has had it for LOOP_TURN_S."""
        if time.monotonic() - self.since > LOOP_TURN_S:
            # sleep(0) may resume this greenlet before the loop polls for I/O again;
            # any positive time waits for the next poll.
            gevent.sleep(LOOP_TURN_S / 20)
            self.since = time.monotonic()

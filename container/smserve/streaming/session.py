"""What a WebSocket session is to the code that answers it, apart from the transport.

The transport (http/websocket.py) owns the connection: the handshake, wsproto's
framing, pings, sending with a deadline, the closing handshake and the drain at
SIGTERM. It hands each complete message to a Session and sends what the session gives
it; a session never sees a frame or a socket. Two kinds: default sessions, each message
answered through the protocol table (default_session.py), and a model's own stream_fn
(stream_fn.py); handlers.py chooses.
"""

from __future__ import annotations

import logging
from typing import Callable

# RFC 6455's close codes by name (NORMAL_CLOSURE, GOING_AWAY, POLICY_VIOLATION,
# MESSAGE_TOO_BIG, INTERNAL_ERROR, TRY_AGAIN_LATER, ...): wsproto's table, not a copy.
from wsproto.frame_protocol import CloseReason

from smserve.core.context import RequestContext

__all__ = ["CloseReason", "Closing", "MAX_PENDING", "Send", "Session", "SessionContext"]

log = logging.getLogger(__name__)

# Messages held ahead of their answers in one session: enough to fill a batch, bounded
# so that a client that never reads its answers stops being read.
MAX_PENDING = 64

# The transport's send: (a str for a text frame or bytes for a binary one, whether it
# ends the message). Raises OSError once the session cannot carry more.
Send = Callable[[object, bool], None]


class Closing(Exception):
    """Ends a session with a WebSocket close code and reason."""

    def __init__(self, code: CloseReason, reason: str):
        super().__init__(f"{int(code)} {reason}")
        self.code = code
        self.reason = reason


class SessionContext(RequestContext):
    """What a stream_fn knows of its connection: a request context (core/context.py) of
    its handshake (SageMaker's headers, `path`, `query_string` and `query`), with the
    client's address and whether the server is shutting down. The handshake's answer is
    sent before the session starts: `response_custom_attributes` is not sent."""

    __slots__ = ("peer", "shutting_down")

    def __init__(self, headers, path: str = "", query_string: str = "", peer: str = "",
                 target_model: str | None = None):
        super().__init__(headers, path, query_string, target_model)
        self.peer = peer
        # Set when the server begins to shut down (SIGTERM): finish, the messages end soon.
        self.shutting_down = False

    def for_message(self) -> RequestContext:
        """A default session's message's own context (a hook may set its attributes):
        the handshake's headers, path and query, shared, not copied."""
        return RequestContext(self.headers, self.path, self.query_string, self._target_model)


class Session:
    """The transport's view of whoever answers a session. deliver() runs on the
    transport's reader, answer() in a greenlet of its own, until the answers are done."""

    # Whether the messages received before the client's Close are still answered (then
    # the session closes), as they are at SIGTERM; otherwise the client's Close drops them.
    answers_after_close = False

    def __init__(self) -> None:
        self.answered = 0
        self.warned_text = False

    def check_text(self, text, what: str) -> None:
        """A text answer (streaming.text.TextPieces) that was not valid in its charset
        went out with U+FFFD in its place: said once a session, the model's bug."""
        if text is not None and text.invalid and not self.warned_text:
            self.warned_text = True
            log.warning("%s is not valid %s, but a text message must be: the bytes that are not were sent as "
                        "U+FFFD (logged once a session)", what, text.charset)

    def deliver(self, message) -> None:
        """A complete message (str for text, bytes for binary). May wait: that is the
        back-pressure, the transport reads nothing more meanwhile."""
        raise NotImplementedError

    def end_of_messages(self) -> None:
        """No message will follow (the client closed, or the server drains)."""
        raise NotImplementedError

    def answer(self, send: Send) -> None:
        """Send the answers until the session's work is done; a Closing says how it ends."""
        raise NotImplementedError

    def release(self) -> None:
        """The session is over: give back what it held."""

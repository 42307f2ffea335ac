"""Which session answers a new WebSocket session: the model's stream_fn if it has one,
else a default session (each message through the protocol table)."""

from __future__ import annotations

from smserve.engine.worker.served import ServedModel
from smserve.errors import HTTPError
from smserve.streaming.default_session import DefaultSession
from smserve.streaming.session import CloseReason, Closing, Session, SessionContext
from smserve.streaming.stream_fn import StreamFnSession


def open_session(server: ServedModel, settings, context: SessionContext) -> Session:
    """The session for this connection, or Closing: the model is not ready (1013 while
    it loads, 1011 if it failed), a query option it cannot take (1008), or the worker
    holds its most stream_fn sessions (1013)."""
    try:
        server.check_ready()
    except HTTPError as e:
        raise Closing(CloseReason.TRY_AGAIN_LATER if e.status == 503 else CloseReason.INTERNAL_ERROR,
                      e.message) from None
    stream_fn = server.model.hooks.stream_fn
    if stream_fn is None:
        return DefaultSession(server, settings, context)
    if not server.stream_sessions.take():
        raise Closing(CloseReason.TRY_AGAIN_LATER, f"this worker holds its most stream_fn sessions "
                      f"({settings.max_sessions}, SMSERVE_MAX_SESSIONS); try again later")
    return StreamFnSession(server, stream_fn, context)

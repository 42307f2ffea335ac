"""A request in a stateful session (InvokeEndpoint's SessionId): opened, found, answered
and closed around the request's own answer (engine/sessions/store.py keeps the state).

- `X-Amzn-SageMaker-Session-Id: NEW_SESSION` opens one through the model's
  open_session; the answer carries `X-Amzn-SageMaker-New-Session-Id: <id>;
  Expires=<...>`. The request itself is answered in the new session (its hooks see
  `context.session`), unless its body is only `{"requestType": "NEW_SESSION"}`: then
  the answer is the session's ID and expiry, as JSON.
- An ID continues the session: the request's hooks see its state as `context.session`
  (and may change it, or set another); its answer is the request's own.
- Closing, the container's convention (SageMaker leaves it to the container): a JSON
  body `{"requestType": "CLOSE"}` closes the session without inference (as AWS's
  examples do), or the header form, `CustomAttributes` holding `session=close`,
  closes it once this request is answered. Either answer carries
  `X-Amzn-SageMaker-Closed-Session-Id: <id>`.
- The request that opens a session and fails closes it again: its client never learnt
  the ID.
"""

from __future__ import annotations

import orjson

from smserve.core import media, session_ids
from smserve.core.context import CUSTOM_ATTRIBUTES
from smserve.engine.sessions.store import CLOSED
from smserve.engine.worker.served import ServedModel
from smserve.errors import BadRequest
from smserve.routes.table import Request, Response, json_response, when_answered

CONTROL_KEY = "requestType"
OPEN, CLOSE = session_ids.NEW_SESSION, "CLOSE"
# The header form of a close: this token among the request's custom attributes.
CLOSE_ATTRIBUTE = "session=close"
# A control body is a small JSON object; nothing bigger is parsed to look for one.
MAX_CONTROL_BYTES = 4096


def answer(server: ServedModel, request: Request, message, respond, reply_response) -> Response:
    """The request's answer in its session: respond(message) -> the request's own reply,
    reply_response(reply, message) -> its Response."""
    value = session_ids.requested(request.header(session_ids.SESSION_ID))
    table = server.sessions
    control = _control(message)
    context = message.context
    if value == session_ids.NEW_SESSION:
        server.check_ready()
        if control == CLOSE:
            raise BadRequest(f'{{"{CONTROL_KEY}": "{CLOSE}"}} closes a session: send it with the session\'s ID in '
                             f"{session_ids.SESSION_ID}, not {session_ids.NEW_SESSION}")
        session, opened = table.open(server, context), True
        headers = [(session_ids.NEW_SESSION_ID, session.new_session_header)]
    else:
        if control == OPEN:
            raise BadRequest(f'{{"{CONTROL_KEY}": "{OPEN}"}} opens a session: send it with {session_ids.SESSION_ID}: '
                             f"{session_ids.NEW_SESSION}, not an ID")
        # Found (or refused) before the model is asked for: a worker started again
        # refuses its predecessor's sessions while its own model still loads.
        session, opened = table.find(value, server), False
        server.check_ready()
        headers = []
    table.hold(session)
    if control is not None:
        try:
            if control == CLOSE:
                table.close(session, CLOSED, context, held=True, answer=True)
                return json_response(orjson.dumps({"closed": session.id}),
                                     headers=[(session_ids.CLOSED_SESSION_ID, session.id)])
            return json_response(orjson.dumps({"session": session.id, "expires": session.expires}), headers=headers)
        finally:
            table.release(session, session.state)
    context.session, context.session_id = session.state, session.id
    closing = _asks_to_close(request)
    try:
        response = reply_response(respond(message), message)
    except BaseException:
        try:
            if opened:  # the opening request failed: its client never learnt the ID
                table.close(session, CLOSED, context, held=True)
        finally:
            table.release(session, context.session)
        raise
    if closing:
        headers.append((session_ids.CLOSED_SESSION_ID, session.id))
    response.headers.extend(headers)
    # The session's turn lasts until the answer is made: a streamed one's last chunk.
    return when_answered(response, lambda: _done(table, session, context, closing, response.streamed))


def _done(table, session, context, closing: bool, streamed: bool) -> None:
    """The request is answered: its state kept, the session closed if it asked, and
    the session's next request may go. A state past the sessions' memory budget closes
    the session: a body in hand is replaced by the 507; a streamed one has gone out,
    and the session's next request is told why it is closed."""
    over = None
    try:
        if closing:
            table.close(session, CLOSED, context, held=True)
    finally:
        over = table.release(session, context.session)
    if over is not None and not streamed:
        raise over


def _control(message) -> str | None:
    """OPEN or CLOSE when the body is a session control message, else None."""
    body = message.body
    if message.kind != media.JSON or len(body) > MAX_CONTROL_BYTES or CONTROL_KEY.encode() not in body:
        return None
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    kind = document.get(CONTROL_KEY) if isinstance(document, dict) else None
    return kind if kind in (OPEN, CLOSE) else None


def _asks_to_close(request: Request) -> bool:
    attributes = request.header(CUSTOM_ATTRIBUTES) or ""
    return any(token.strip().lower() == CLOSE_ATTRIBUTE for token in attributes.replace(";", ",").split(","))

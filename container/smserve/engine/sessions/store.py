"""One worker's stateful sessions: their state, expiry and bounds, opened and closed
through the model's own hooks.

A model keeps sessions when its code/inference.py defines `open_session(context)`,
whose return value is the session's state: any object the hooks read and change as
`context.session` (a chat's history, a KV cache on the GPU, an uploaded document).
`close_session(state, context)`, if defined, lets it go: when the client closes the
session, when it expires, when its model is unloaded, and at SIGTERM once the requests
in flight have finished.

- A session lives in the worker that opened it (every request of it is handed to that
  worker: http/handoff.py) and belongs to the model it was opened on.
- Its requests run one at a time, in the order they arrive: a session's state is never
  read and written by two requests at once, and a request is never served without its
  state (an expired or closed session's request is a 400 naming the session).
- It expires SMSERVE_SESSION_TTL_S after it opened, as its New-Session-Id's Expires
  said; use does not renew it: SageMaker routes by that Expires, and a session kept
  past it here would be one that no request could reach. A request in flight at the
  expiry finishes with its state; the session closes after it.
- A worker holds at most SMSERVE_MAX_SESSIONS of them. A worker that is full closes
  the session idle longest, if one has been idle SMSERVE_SESSION_IDLE_S, to open a new
  one (close_session's reason: idle); else the new one is a 429 saying when one may
  end. Their state's memory is counted where it can be (tensors' and arrays' data, and
  every other object in it at its own size) for /metrics, and bounded: the request
  whose state takes the worker's sessions past SMSERVE_SESSION_STATE_MB is answered
  507 and its session closed (reason: memory), the others untouched. Every object is
  counted, a slice at a time between turns of the loop, until the count passes what
  is left of the bound: a state of many small objects is held to it as one of few.
- A request naming a session closed for being idle or for its memory is told so (400).
"""

from __future__ import annotations

import collections
import logging
import time

import gevent
from gevent.lock import Semaphore

from smserve import metrics
from smserve.core import session_ids
from smserve.engine.sessions.measure import count
from smserve.engine.sessions import hooks as session_hooks
from smserve.errors import BadRequest, HTTPError, InsufficientStorage, TooManyRequests, Unavailable

log = logging.getLogger(__name__)

# How often expired sessions are looked for: a session closes at most this late.
SWEEP_S = 0.5
OPENED, CLOSED, EXPIRED, UNLOADED, SHUTDOWN = "opened", "closed", "expired", "unloaded", "shutdown"
IDLE, MEMORY = "idle", "memory"
# How many sessions closed for being idle or for their memory are remembered, so that
# their next request is told why (the IDs only, so the memory stays small).
REMEMBERED_ENDS = 4096


class Session:
    __slots__ = ("id", "server", "state", "opened_at", "expires_at", "lock", "closed", "state_bytes", "used_at")

    def __init__(self, session_id: str, server, state, ttl_s: float):
        self.id = session_id
        self.server = server  # the model's ModelServer: its hooks open and close the state
        self.state = state
        self.opened_at = time.time()
        self.expires_at = self.opened_at + ttl_s  # wall clock, as Expires says it
        self.lock = Semaphore()  # one request at a time, first come first served
        self.closed = False
        self.state_bytes = 0
        self.used_at = time.monotonic()  # when its last request was answered (or it opened)

    @property
    def model(self) -> str | None:
        return self.server.name

    def expired(self, now: float | None = None) -> bool:
        return (now if now is not None else time.time()) >= self.expires_at

    @property
    def new_session_header(self) -> str:
        return session_ids.new_session_header(self.id, self.expires_at)

    @property
    def expires(self) -> str:
        """When it expires, as Expires says it (UTC)."""
        return session_ids.expires_text(self.expires_at)


class SessionTable:
    def __init__(self, settings, worker_index: int):
        self.ttl_s = settings.session_ttl_s
        self.max_sessions = settings.max_sessions
        self.idle_s = settings.session_idle_s
        self.max_state_bytes = settings.session_state_mb * 2**20
        self.wait_s = float(settings.request_timeout)  # the most a request waits for its session's turn
        self.worker_index = worker_index
        self.start = session_ids.start_token()
        self._open: dict[str, Session] = {}
        self._sweeper = None
        self._expiring: set[str] = set()  # sessions whose close at expiry waits for their turn
        self.state_bytes = 0  # what the open sessions' state holds, as state_size tells it
        # Sessions whose open_session runs now: their slots are taken before the hook
        # yields, so requests that arrive meanwhile count them.
        self._opening = 0
        self._ended: collections.OrderedDict[str, str] = collections.OrderedDict()  # ID -> IDLE or MEMORY

    def __len__(self) -> int:
        return len(self._open)

    def _counted(self, session: Session, state_bytes: int) -> None:
        self.state_bytes += state_bytes - session.state_bytes
        session.state_bytes = state_bytes

    # ------------------------------------------------------------ opening and finding

    def open(self, server, context) -> Session:
        """A new session on server's model, its state from the model's open_session."""
        hooks = server.model.hooks
        if not hooks.keeps_sessions:
            raise BadRequest(f"this model keeps no sessions ({session_ids.SESSION_ID}: {session_ids.NEW_SESSION}): "
                             "its code/inference.py defines no open_session(context) (docs/model.md#stateful-sessions)")
        if len(self._open) + self._opening >= self.max_sessions:
            self._close_idlest()
        if len(self._open) + self._opening >= self.max_sessions:
            soonest = min((s.expires_at for s in self._open.values()), default=time.time())
            wait = max(1, min(int(soonest - time.time()) + 1, int(self._soonest_idle()) + 1))
            raise TooManyRequests(f"this worker holds its most sessions ({self.max_sessions}, SMSERVE_MAX_SESSIONS), "
                                  f"none idle {self.idle_s:g} s (SMSERVE_SESSION_IDLE_S): close one, or retry in "
                                  f"{wait} s", headers={"Retry-After": str(wait)})
        session_id = session_ids.new_id(self.worker_index, self.start)
        context.session_id = session_id
        self._opening += 1
        try:
            session = Session(session_id, server, session_hooks.open_session(server, context), self.ttl_s)
            self._open[session_id] = session  # (counted open before the slot is given back)
        finally:
            self._opening -= 1
        session.lock.acquire()  # (free: nobody knows its ID yet)
        try:
            over = self._recounted(session, session.state)
        except BaseException:
            gevent.spawn(self.close, session, CLOSED)  # its client never learns the ID
            raise
        if over:
            raise self._over(session)
        metrics.stateful_session(OPENED, len(self._open), self.state_bytes)
        if self._sweeper is None:
            self._sweeper = gevent.spawn(self._sweep)
        log.debug("session %s opened on model %r, expires in %.0f s", session_id, server.name, self.ttl_s)
        return session

    def find(self, session_id: str, server) -> Session:
        """The open session of that ID, for a request to server's model; 400 otherwise."""
        session = self._open.get(session_id)
        if session is None and session_id in self._ended:
            why = (f"it was closed after {self.idle_s:g} s idle (SMSERVE_SESSION_IDLE_S) to make room for another"
                   if self._ended[session_id] == IDLE else
                   f"it was closed when its state took this worker's sessions past {self.max_state_bytes >> 20} MB "
                   "(SMSERVE_SESSION_STATE_MB)")
            raise BadRequest(f"session {session_id!r} is not open: {why}; open another with "
                             f"{session_ids.SESSION_ID}: {session_ids.NEW_SESSION}")
        if session is None:
            theirs = session_ids.parse(session_id)
            why = ("its worker has started again since, and its state went with the old one"
                   if theirs is not None and theirs.worker == self.worker_index and theirs.start != self.start
                   else "unknown, closed or expired")
            raise BadRequest(f"session {session_id!r} is not open: {why}; open another with "
                             f"{session_ids.SESSION_ID}: {session_ids.NEW_SESSION}")
        if session.server is not server:
            raise BadRequest(f"session {session_id!r} belongs to model {session.model!r}, not {server.name!r}")
        return session

    def hold(self, session: Session) -> None:
        """Wait for the session's turn (its earlier requests finish first); 400 if it
        closed or expired meanwhile, 503 if the turn does not come within the request
        timeout (another request of the session is still streaming, say). Every hold
        is followed by one release."""
        if not session.lock.acquire(timeout=self.wait_s):
            raise Unavailable(f"session {session.id!r} is busy: its earlier request has not finished within "
                              f"{self.wait_s:.0f} s (a session's requests run one at a time)", headers={"Retry-After": "1"})
        if session.closed or session.expired():
            session.lock.release()
            state = "expired" if session.expired() and not session.closed else "closed"
            raise BadRequest(f"session {session.id!r} is not open: {state}"
                             + (f" at {session.expires}" if state == "expired" else ""))

    def release(self, session: Session, state=None) -> HTTPError | None:
        """The request is done with the session: state is what its hooks left as
        context.session (kept as the session's state). When that state takes the
        worker's sessions past their memory budget, the session is closed (reason
        memory) and the 507 its request is owed comes back, for the caller to raise
        where the answer is still to be made."""
        return self._over(session) if self._recounted(session, state) else None

    def _over(self, session: Session) -> InsufficientStorage:
        return InsufficientStorage(
            f"session {session.id!r} is closed: its state took this worker's sessions past "
            f"{self.max_state_bytes >> 20} MB (SMSERVE_SESSION_STATE_MB); open another with "
            f"{session_ids.SESSION_ID}: {session_ids.NEW_SESSION}",
            headers={session_ids.CLOSED_SESSION_ID: session.id})

    def _recounted(self, session: Session, state) -> bool:
        """The session's state counted again, its turn (held) given back after; whether
        that took the sessions past their bound (the session is closed then). Counted
        in a greenlet of its own that holds the turn until the count ends: a caller
        interrupted meanwhile (its answer's deadline) leaves no state uncounted, nor one
        that the session's next request changes while it is read."""
        return gevent.spawn(self._recount, session, state).get()

    def _recount(self, session: Session, state) -> bool:
        try:
            if session.closed:
                return False
            session.state = state
            session.used_at = time.monotonic()
            others = self.state_bytes - session.state_bytes
            self._counted(session, count(state, self.max_state_bytes - others))
            over = self.state_bytes > self.max_state_bytes
            if over:
                self.close(session, MEMORY, held=True)
            metrics.session_state(self.state_bytes)
            return over
        finally:
            session.lock.release()

    def _close_idlest(self) -> None:
        """A full worker makes room: the session idle longest closes, if it has been
        idle idle_s and no request of it is waiting or running."""
        now = time.monotonic()
        idle = [s for s in self._open.values() if not s.lock.locked() and now - s.used_at >= self.idle_s]
        if idle:
            session = min(idle, key=lambda s: s.used_at)
            log.info("session %s idle %.0f s closed to open another (SMSERVE_SESSION_IDLE_S)", session.id,
                     now - session.used_at)
            self.close(session, IDLE)

    def _soonest_idle(self) -> float:
        """Seconds until an open session could be closed for being idle, if none comes back."""
        now = time.monotonic()
        return max(0.0, min((self.idle_s - (now - s.used_at) for s in self._open.values()), default=self.idle_s))

    # ------------------------------------------------------------ closing

    def close(self, session: Session, how: str, context=None, held: bool = False, answer: bool = False) -> None:
        """Close it through the model's close_session (on the inference thread), after the
        requests already in it; held: the caller holds its turn already (and keeps it).
        answer: close_session's failure is the request's answer (a close asked for by
        itself); else it is logged, and the session is closed all the same."""
        if not held:
            session.lock.acquire()
        try:
            if session.closed:
                return
            session.closed = True
            self._open.pop(session.id, None)
            if how in (IDLE, MEMORY):
                self._ended[session.id] = how
                while len(self._ended) > REMEMBERED_ENDS:
                    self._ended.popitem(last=False)
            self._counted(session, 0)
            metrics.stateful_session(how, len(self._open), self.state_bytes)
            try:
                session_hooks.close_session(session.server, session.state, context, session.id, how)
            except HTTPError as e:
                if answer:
                    raise
                log.warning("session %s (%s): %s", session.id, how, e.message)
            finally:
                session.state = None
        finally:
            if not held:
                session.lock.release()

    def close_model(self, server) -> None:
        """Every session of a model being unloaded."""
        for session in [s for s in self._open.values() if s.server is server]:
            self.close(session, UNLOADED)

    def close_all(self) -> None:
        """At SIGTERM, once the requests in flight are answered: every session closed
        through its model's hook."""
        if self._sweeper is not None:
            self._sweeper.kill(block=False)
            self._sweeper = None
        sessions = list(self._open.values())
        if sessions:
            log.info("closing %d session(s) at shutdown", len(sessions))
        for session in sessions:
            self.close(session, SHUTDOWN)

    def _sweep(self) -> None:
        while True:
            gevent.sleep(SWEEP_S)
            now = time.time()
            for session in [s for s in self._open.values() if s.expired(now) and s.id not in self._expiring]:
                # Each on its own: one whose request still streams must not hold the others' close back.
                self._expiring.add(session.id)
                gevent.spawn(self._expire, session)

    def _expire(self, session: Session) -> None:
        try:
            self.close(session, EXPIRED)
        except Exception:  # noqa: BLE001 - one session's hook must not stop the others' expiry
            log.exception("closing expired session %s failed", session.id)
        finally:
            self._expiring.discard(session.id)

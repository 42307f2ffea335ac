"""The threads a worker's models share, and the hop from the event loop to one of them.

gevent's pools start a thread only when one is wanted: codec threads decode and encode
big bodies, session threads run stream_fn sessions (one each), hook threads run the
models' input_fn and output_fn. The calling greenlet waits for its thread; the loop does not.
"""

from __future__ import annotations

from dataclasses import dataclass

from gevent.threadpool import ThreadPool

# Bodies (and outputs) from this size on are decoded (encoded) on a codec thread.
OFFLOAD_BYTES = 256 * 1024


@dataclass(frozen=True)
class Pools:
    codec: ThreadPool
    session: ThreadPool
    hooks: ThreadPool

    @classmethod
    def sized(cls, codec: int, session: int, hooks: int) -> "Pools":
        return cls(ThreadPool(codec), ThreadPool(session), ThreadPool(hooks))

    def offload(self, size: int, fn, *args):
        """Run a decode or encode: inline when it is small (a thread hop costs more than
        the work), on a codec thread when its cost grows with a big body, so the event
        loop keeps answering /ping meanwhile."""
        if size < OFFLOAD_BYTES:
            return fn(*args)
        return on_thread(self.codec, fn, args)

    def on_hooks(self, fn, *args):
        """fn on a hook thread, whatever its cost: a hook of the user's, whose cost is
        not known from the body's size."""
        return on_thread(self.hooks, fn, args)

    def on_session(self, lock, fn, *args):
        """fn on a stream_fn session's thread, holding lock (the model lock, shared with
        the inference thread) only while fn runs."""
        return on_thread(self.session, fn, args, lock)


class Slots:
    """A count of held things bounded by `most` (a worker's stream_fn sessions)."""

    def __init__(self, most: int):
        self.most = most
        self.held = 0

    def take(self) -> bool:
        """Count one in, unless `most` are held."""
        if self.held >= self.most:
            return False
        self.held += 1
        return True

    def give_back(self) -> None:
        self.held -= 1


def on_thread(pool, fn, args, lock=None):
    """fn(*args) on one of pool's threads (holding lock, if given, while it runs); the
    calling greenlet waits, the loop does not. fn's exception is raised here, in the
    caller: it travels back as a value, since the pool would print a traceback for what
    is often a client's 4xx."""
    ok, value = pool.apply(_captured, (fn, args, lock))
    if ok:
        return value
    raise value


def _captured(fn, args, lock):
    if lock is not None:
        lock.acquire()
    try:
        return True, fn(*args)
    except BaseException as e:  # noqa: BLE001 - re-raised on the event loop's side
        return False, e
    finally:
        if lock is not None:
            lock.release()

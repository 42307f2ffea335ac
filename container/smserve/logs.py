"""Logging for gunicorn and the server, as text or one JSON object a line (for CloudWatch).

The access lines, one per request, do not go through `logging` in a worker: AccessLines
writes them in the same two forms, preformatted and buffered (logging's record, its
formatter and a write() with a flush per line cost a third of a small request's time)."""

from __future__ import annotations

import json
import logging
import os
import select
import time
from json.encoder import encode_basestring_ascii

ACCESS_LOGGER = "smserve.access"
# How long an access line may wait in the buffer: CloudWatch sees it this late at most,
# and a worker killed outright (kill -9, the OOM killer) loses at most this much.
ACCESS_FLUSH_S = 0.1
# At most this many lines wait (so at most this many are lost with ACCESS_FLUSH_S).
ACCESS_BUFFER_LINES = 64
# One write to a pipe up to this size is never interleaved with another process's
# write (POSIX): lines are written at most this many bytes at a time, so two workers'
# lines never mix.
ACCESS_BUFFER_BYTES = select.PIPE_BUF
# A time's milliseconds as logging's format writes them (",%03d"), made once.
_MILLIS = tuple("%03d" % millis for millis in range(1000))


def json_time(created: float) -> str:
    seconds = int(created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int((created - seconds) * 1000):03d}Z"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        entry = {
            "time": json_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        # Structured fields (the access log's method, path, status, ...) as top-level keys.
        entry.update(getattr(record, "fields", None) or {})
        if record.exc_text:  # (made where the record was logged: handed over without exc_info)
            entry["exception"] = record.exc_text
        return json.dumps(entry)


TEXT_FORMAT = "%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s"


def config_dict(level: str, fmt: str) -> dict:
    """A logging dictConfig for gunicorn's `logconfig_dict`: one handler on stderr."""
    formatter = {"()": JsonFormatter} if fmt == "json" else {"format": TEXT_FORMAT}
    handler = {"class": "logging.StreamHandler", "formatter": "default", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": formatter},
        "handlers": {"default": handler},
        "root": {"level": level.upper(), "handlers": ["default"]},
        "loggers": {
            "gunicorn.error": {"level": level.upper(), "handlers": [], "propagate": True},
            "gunicorn.access": {"level": "INFO", "handlers": [], "propagate": True},
            ACCESS_LOGGER: {"level": level.upper(), "handlers": [], "propagate": True},
        },
    }


# How long flush() (at exit, by logging.shutdown) waits for the writer's lines to be out.
LOG_FLUSH_WAIT_S = 5.0


def thread_safe_logging() -> None:
    """In a worker, right after gevent's monkey-patching, which gives logging's module
    lock and every handler's lock gevent's: those are not safe between OS threads (a
    waiting thread can miss its wake-up for good), and hook threads, the inference
    thread and the event loop all log. Locks become real ones again (a handler made
    later too), and the root logger's handlers are written by one real thread
    (HandOver): logging anywhere never waits on another thread's write."""
    from gevent import monkey

    real_rlock = monkey.get_original("_thread", "RLock")

    def create_lock(handler: logging.Handler) -> None:
        handler.lock = real_rlock()
        logging._register_at_fork_reinit_lock(handler)  # as logging's own createLock

    logging.Handler.createLock = create_lock
    with logging._lock:  # (gevent's still, and free: one thread runs yet)
        logging._lock = real_rlock()
    for ref in list(logging._handlerList):
        handler = ref()
        if handler is not None:
            handler.lock = real_rlock()
    root = logging.getLogger()
    targets = list(root.handlers)
    if targets:
        hand_over = HandOver(targets, monkey.get_original("_queue", "SimpleQueue"),
                             monkey.get_original("_thread", "allocate_lock"),
                             monkey.get_original("_thread", "start_new_thread"))
        for handler in targets:
            root.removeHandler(handler)
        root.addHandler(hand_over)
        hand_over.start()
        # A process forked from the worker has no writer thread (threads do not survive a fork).
        os.register_at_fork(after_in_child=hand_over.start)


class HandOver(logging.Handler):
    """Records for `targets`, made ready where they are logged (the message formatted,
    the traceback as text: nothing of the caller's objects crosses) and handed through
    a thread-safe queue to write_forever, the one thread that writes them. handle()
    takes no lock: putting on the queue is safe from any thread or greenlet."""

    def __init__(self, targets: list[logging.Handler], make_queue, allocate_lock, start_new_thread):
        super().__init__()
        self.targets = targets
        self._make_queue, self._allocate_lock, self._start_new_thread = make_queue, allocate_lock, start_new_thread
        self._queue = None
        self._exceptions = logging.Formatter()

    def start(self) -> None:
        """A new queue (a forked child's copy holds its parent's records) and its writer."""
        self._queue = queue = self._make_queue()
        self._start_new_thread(self.write_forever, (queue,))

    def handle(self, record: logging.LogRecord) -> bool:
        if not self.filter(record):
            return False
        try:
            record.msg, record.args = record.getMessage(), None
            if record.exc_info:
                record.exc_text = record.exc_text or self._exceptions.formatException(record.exc_info)
                record.exc_info = None
            self._queue.put(record)
        except Exception:  # noqa: BLE001 - as logging's own handlers: reported, never raised
            self.handleError(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self.handle(record)

    def flush(self) -> None:
        """Returns once what was handed over before is written (LOG_FLUSH_WAIT_S at most)."""
        done = self._allocate_lock()
        done.acquire()
        self._queue.put(done)
        done.acquire(timeout=LOG_FLUSH_WAIT_S)

    def write_forever(self, queue) -> None:
        while True:
            item = queue.get()
            if not isinstance(item, logging.LogRecord):  # flush()'s marker
                for handler in self.targets:
                    handler.flush()
                item.release()
                continue
            for handler in self.targets:
                if item.levelno >= handler.level:
                    handler.handle(item)


class AccessLines:
    """The access logger's lines, as config_dict's handler would write them (TEXT_FORMAT
    or JsonFormatter, byte for byte), gathered and written whole lines at a time.

    A request hands over only its details; its line is made at flush, with the others
    waiting. `message`, (format, args), makes what follows a line's head (its time, level
    and logger) as `format % args(details)`: the text message, or for JSON the message
    and the fields and the closing brace; the waiting lines are then made in one
    %-format, a third of what making each costs.

    `shorter(details, chars)`, if given, makes a line that would not fit one write
    (ACCESS_BUFFER_BYTES) from details whose long strings are cut to `chars`, shorter
    each try until it fits; without it such a line is written alone.

    Not thread-safe: one thread (the worker's event loop) adds lines. `schedule(fn)`
    runs fn once, ACCESS_FLUSH_S later, on that thread; flush() must also run at exit."""

    def __init__(self, fmt: str, fd: int, schedule, message: tuple, shorter=None):
        self.json = fmt == "json"
        self._shorter = shorter
        self.fd = fd
        self._schedule = schedule
        # The time, its milliseconds, the middle, then what message makes.
        self._line_format = "%s%s%s" + message[0] + "\n"
        self._message_args = message[1]
        self._pid = os.getpid()
        self._pending: list[tuple] = []
        self._scheduled = False
        self._second = -1
        self._stamp = ""  # the time down to the second, made once a second
        # What a line says between its time and its message, by level: made once.
        self._middles: dict[int, str] = {}

    def add(self, level: int, details: tuple) -> None:
        """level: logging's (INFO, DEBUG)."""
        self._pending.append((time.time(), level, details))
        if len(self._pending) >= ACCESS_BUFFER_LINES:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._schedule(self._flush_later)

    def _flush_later(self) -> None:
        self._scheduled = False
        self.flush()

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        try:
            data = self._batch_lines(pending).encode("utf-8", "backslashreplace")
        except Exception:  # noqa: BLE001 - one line that cannot be made: the others are, one by one
            data, pending = b"".join(self._each_line(pending)), None
        # (backslashreplace: a lone surrogate cannot cost the lines)
        self._write_lines(data, pending)

    def _batch_lines(self, pending: list[tuple]) -> str:
        args: list = []
        extend = args.extend
        message_args = self._message_args
        middles = self._middles
        for created, level, details in pending:
            second = int(created)
            if second != self._second:
                self._new_second(second)
            extend((self._stamp, _MILLIS[int((created - second) * 1000)], middles.get(level) or self._middle(level)))
            extend(message_args(details))
        return (self._line_format * len(pending)) % tuple(args)

    def _each_line(self, pending: list[tuple]):
        for line in pending:
            try:
                yield self._fitting(line)
            except Exception:  # noqa: BLE001 - a line that cannot be made must not cost the others
                logging.getLogger(__name__).exception("an access line could not be made")

    def _fitting(self, line: tuple) -> bytes:
        """One line, its strings cut by `shorter` (halved each try) until it fits a write."""
        created, level, details = line
        data = self._batch_lines([line]).encode("utf-8", "backslashreplace")
        chars = ACCESS_BUFFER_BYTES
        while len(data) > ACCESS_BUFFER_BYTES and self._shorter is not None and chars > 1:
            chars //= 2
            data = self._batch_lines([(created, level, self._shorter(details, chars))]).encode(
                "utf-8", "backslashreplace")
        return data

    def _new_second(self, second: int) -> None:
        self._second = second
        self._stamp = (time.strftime('{"time": "%Y-%m-%dT%H:%M:%S.', time.gmtime(second)) if self.json else
                       time.strftime("%Y-%m-%d %H:%M:%S,", logging.Formatter.converter(second)))

    def _middle(self, level: int) -> str:
        name = logging.getLevelName(level)
        self._middles[level] = middle = (
            f'Z", "level": {encode_basestring_ascii(name)}, "logger": "{ACCESS_LOGGER}", "pid": {self._pid}, '
            '"message": ' if self.json else f" [{self._pid}] {name} {ACCESS_LOGGER}: ")
        return middle

    def _write_lines(self, data: bytes, pending: list[tuple] | None) -> None:
        """Whole lines, at most ACCESS_BUFFER_BYTES a write (a pipe takes that much in one
        piece, never mixed with another process's write). A longer line is made again
        to fit (_fitting; pending: data's lines, one each, when it holds one made whole)."""
        view = memoryview(data)
        start, size = 0, len(data)
        while start < size:
            end = start + ACCESS_BUFFER_BYTES
            if end < size:
                cut = data.rfind(b"\n", start, end)
                if cut < 0:  # one line longer than a write
                    cut = data.find(b"\n", start)
                    end = cut + 1 if cut >= 0 else size
                    if not self._write(view[start:end] if pending is None else
                                       self._fitting(pending[data.count(b"\n", 0, start)])):
                        return
                    start = end
                    continue
                end = cut + 1
            if not self._write(view[start:end]):
                return
            start = end

    def _write(self, data) -> bool:
        """False when stderr is gone (as logging's handler would: lines lost, never a
        request failed)."""
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError:
            return False
        return True


def timer_on(loop, seconds: float):
    """AccessLines' `schedule` on a gevent loop: fn runs once, `seconds` after each call.
    A new timer each call: libev's one-shot timer, started again once it has fired, fires
    at once (the time it was set for is spent), which wrote the lines at every turn of
    the loop (at -c 1, a write per request) instead of every ACCESS_FLUSH_S. And from the
    clock's time, not the loop's: that is the time of its last turn, which a long pass
    on the loop's thread leaves behind by as much."""

    def schedule(fn) -> None:
        loop.timer(seconds).start(fn, update=True)

    return schedule


# The worker's AccessLines (access.buffer_lines), for every way out of the process.
_exiting_flushes: list[AccessLines] = []


def flush_on_exit(lines: AccessLines) -> None:
    """lines are written by flush_access_lines(), which each way a worker ends calls."""
    _exiting_flushes.append(lines)


def flush_access_lines() -> None:
    """Writes the access lines the worker holds (nothing outside a worker)."""
    for lines in _exiting_flushes:
        lines.flush()

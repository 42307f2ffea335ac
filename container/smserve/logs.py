"""Logging for gunicorn and the server, as text or one JSON object a line (for CloudWatch).

The access lines, one per request, do not go through `logging` in a worker: AccessLines
writes them in the same two forms, preformatted and buffered (logging's record, its
formatter and a write() with a flush per line cost a third of a small request's time)."""

from __future__ import annotations

import json
import logging
import math
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
        entry = {
            "time": json_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        # Structured fields (the access log's method, path, status, ...) as top-level keys.
        entry.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
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


class AccessLines:
    """The access logger's lines, as config_dict's handler would write them (TEXT_FORMAT
    or JsonFormatter, byte for byte), gathered and written whole lines at a time.

    A request hands over only its details; its line is made at flush, with the others
    waiting: made one after another, lines cost a third of what each made in the midst
    of its request's work costs. `describe(details, with_fields)` makes a line's
    message and (for JSON) its fields.

    Not thread-safe: one thread (the worker's event loop) adds lines. `schedule(fn)`
    runs fn once, ACCESS_FLUSH_S later, on that thread; flush() must also run at exit."""

    def __init__(self, fmt: str, fd: int, schedule, describe):
        self.json = fmt == "json"
        self.fd = fd
        self._schedule = schedule
        self._describe = describe
        self._pid = os.getpid()
        self._pending: list[tuple] = []
        self._scheduled = False
        self._second = -1
        self._stamp = ""  # the time down to the second, made once a second
        # What a line says between its time and its message, by level: made once.
        self._middles: dict[int, str] = {}
        self._json_keys: dict[str, str] = {}  # a field's name as JSON writes it, with its separators

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
        chunk: list[str] = []
        size = 0
        for created, level, details in pending:
            try:
                line = self._line(created, level, *self._describe(details, self.json))
            except Exception:  # noqa: BLE001 - a line that cannot be made must not cost the others
                logging.getLogger(__name__).exception("an access line could not be made")
                continue
            length = len(line) if line.isascii() else len(line.encode())
            if size + length > ACCESS_BUFFER_BYTES and chunk:
                self._write("".join(chunk).encode())
                chunk, size = [], 0
            chunk.append(line)
            size += length
        if chunk:
            self._write("".join(chunk).encode())

    def _line(self, created: float, level: int, message: str, fields: dict | None) -> str:
        second = int(created)
        if second != self._second:
            self._second = second
            self._stamp = (time.strftime('{"time": "%Y-%m-%dT%H:%M:%S.', time.gmtime(second)) if self.json else
                           time.strftime("%Y-%m-%d %H:%M:%S,", logging.Formatter.converter(second)))
        middle = self._middles.get(level)
        if middle is None:
            name = logging.getLevelName(level)
            middle = self._middles[level] = (
                f'Z", "level": {encode_basestring_ascii(name)}, "logger": "{ACCESS_LOGGER}", "pid": {self._pid}, '
                '"message": ' if self.json else f" [{self._pid}] {name} {ACCESS_LOGGER}: ")
        millis = _MILLIS[int((created - second) * 1000)]
        if not self.json:
            return "".join((self._stamp, millis, middle, message, "\n"))
        parts = [self._stamp, millis, middle, encode_basestring_ascii(message)]
        keys = self._json_keys
        for key, value in fields.items():
            name = keys.get(key)
            if name is None:
                if len(keys) >= 64:
                    keys.clear()
                name = keys[key] = ", " + encode_basestring_ascii(key) + ": "
            kind = type(value)
            parts += (name, encode_basestring_ascii(value) if kind is str else repr(value) if kind is int
                      else _json_value(value))
        parts.append("}\n")
        return "".join(parts)

    def _write(self, data: bytes) -> None:
        """One write of whole lines (a pipe takes up to ACCESS_BUFFER_BYTES in one piece)."""
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError:
            pass  # stderr gone (as logging's handler would): lines lost, never a request failed


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


def _json_value(value) -> str:
    """A value as json.dumps writes it (its default separators, ASCII), without the
    encoder's set-up, which costs more than the few values of an access line."""
    kind = type(value)
    if kind is str:
        return encode_basestring_ascii(value)
    if kind is int or (kind is float and math.isfinite(value)):
        return repr(value)
    return json.dumps(value)

"""logs.AccessLines writes the access line as the logging handler would (text and JSON,
byte for byte), buffered: whole lines, never more than a pipe writes atomically, out
when its timer fires, when ACCESS_BUFFER_LINES wait, or at flush()."""

from __future__ import annotations

import json
import logging
import os
import time
import weakref

import pytest

from smserve import logs
from smserve.http import access

FIELDS = {"method": "POST", "path": "/caf\u00e9/\"q\"\\", "route": "/invocations", "status": 200, "bytes": 419,
          "latency_ms": 14.497, "remote": "10.0.0.1", "worker": 29251, "inference_id": "a b\" 200 0",
          "session_id": "NEW_SESSION", "extra": None}
MESSAGE = '10.0.0.1 "POST /invocations" 200 419 14.5ms id="a b\\" 200 0"'


def given(details: tuple) -> tuple:
    """AccessLines' message args that write what they were given: details are (message,
    fields), and a JSON line's tail is made as json.dumps writes it."""
    message, fields = details
    if fields is None:
        return (message,)
    return (json.dumps(message) + "".join(f", {json.dumps(k)}: {json.dumps(v)}" for k, v in fields.items()) + "}",)


def access_lines(fmt: str, fd: int, schedule) -> logs.AccessLines:
    return logs.AccessLines(fmt, fd, schedule, ("%s", given))


class Scheduled:
    """A stand-in for the worker loop's timer: records what was scheduled."""

    def __init__(self):
        self.calls: list = []

    def __call__(self, fn):
        self.calls.append(fn)

    def fire(self):
        calls, self.calls = self.calls, []
        for fn in calls:
            fn()


@pytest.fixture
def pipe():
    read, write = os.pipe()
    os.set_blocking(read, False)
    yield read, write
    os.close(read)
    os.close(write)


def drain(fd: int) -> bytes:
    try:
        return os.read(fd, 1 << 20)
    except BlockingIOError:
        return b""


def as_logging_writes(fmt: str, levelname: str, created: float, message: str, fields: dict) -> str:
    formatter = logs.JsonFormatter() if fmt == "json" else logging.Formatter(logs.TEXT_FORMAT)
    record = logging.LogRecord(logs.ACCESS_LOGGER, logging.getLevelName(levelname), __file__, 1, message, None, None)
    record.created, record.msecs = created, int((created - int(created)) * 1000)
    record.fields = fields
    return formatter.format(record) + "\n"


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("levelname", ["INFO", "DEBUG"])
def test_the_line_is_the_logging_handlers_byte_for_byte(monkeypatch, pipe, fmt, levelname):
    read, write = pipe
    created = 1764841403.416
    monkeypatch.setattr(logs.time, "time", lambda: created)
    lines = access_lines(fmt, write, Scheduled())
    lines.add(logging.getLevelName(levelname), (MESSAGE, FIELDS if fmt == "json" else None))
    lines.flush()
    assert drain(read).decode() == as_logging_writes(fmt, levelname, created, MESSAGE, FIELDS)


def test_json_lines_parse_to_every_field():
    entry = json.loads(as_logging_writes("json", "INFO", time.time(), MESSAGE, FIELDS))
    assert {k: entry[k] for k in FIELDS} == FIELDS and entry["message"] == MESSAGE


def test_lines_wait_for_the_timer_which_is_set_once(pipe):
    read, write = pipe
    timer = Scheduled()
    lines = access_lines("text", write, timer)
    for i in range(3):
        lines.add(logging.INFO, (f"line {i}", None))
    assert drain(read) == b"" and len(timer.calls) == 1
    timer.fire()
    assert drain(read).decode().count("smserve.access: line") == 3
    lines.add(logging.INFO, ("after", None))
    assert len(timer.calls) == 1  # a new line sets it again
    assert logs.ACCESS_FLUSH_S <= 0.1


def test_a_full_buffer_is_written_without_waiting_for_the_timer(pipe):
    read, write = pipe
    lines = access_lines("text", write, Scheduled())
    for i in range(logs.ACCESS_BUFFER_LINES):
        lines.add(logging.INFO, (f"line {i}", None))
    assert drain(read).decode().count("smserve.access: line") == logs.ACCESS_BUFFER_LINES


def test_each_write_is_whole_lines_within_what_a_pipe_writes_atomically(monkeypatch):
    writes: list[bytes] = []
    monkeypatch.setattr(logs.os, "write", lambda fd, data: writes.append(bytes(data)) or len(data))
    lines = access_lines("text", 99, Scheduled())
    for i in range(200):
        lines.add(logging.INFO, (f"{i} " + "x" * (i * 7), None))
    lines.add(logging.INFO, ("y" * (2 * logs.ACCESS_BUFFER_BYTES), None))  # longer than a write: written alone
    lines.add(logging.INFO, ("last", None))
    lines.flush()
    assert len(writes) > 5
    for data in writes:
        assert data.endswith(b"\n")
        assert len(data) <= logs.ACCESS_BUFFER_BYTES or data.count(b"\n") == 1
    text = b"".join(writes).decode()
    assert [line.rsplit(": ", 1)[1].split(" ")[0] for line in text.splitlines()[:200]] == [str(i) for i in range(200)]


# Requests whose lines must read as logging's: ids to quote, a session, a target with a
# quote, a backslash and non-ASCII in it, a peer without an address.
ENVIRONS = [
    {"REQUEST_METHOD": "POST", "PATH_INFO": "/invocations", "REMOTE_ADDR": "10.0.0.1",
     "HTTP_X_AMZN_SAGEMAKER_INFERENCE_ID": "inf-42", "HTTP_X_AMZN_REQUESTID": "req-7", access.SESSION_KEY: "sess-1"},
    {"REQUEST_METHOD": "GET", "PATH_INFO": '/caf\u00e9/"q"\\ 200 0', "REMOTE_ADDR": "10.0.0.2",
     "HTTP_X_REQUEST_ID": 'a b" 200 0'},
    {"REQUEST_METHOD": "POST", "PATH_INFO": "/models/m/invoke", "HTTP_X_AMZN_TRACE_ID": "Root=1-2-3"},
    {"REQUEST_METHOD": "PUT", "PATH_INFO": "/t\tab\x7f", "REMOTE_ADDR": "10.0.0.3",
     "HTTP_X_AMZN_SAGEMAKER_INFERENCE_ID": "del\x7f\\", access.SESSION_KEY: 'ses "q"'},
]


def test_log_request_writes_through_the_buffer_what_logging_would_log(monkeypatch, caplog, pipe):
    read, write = pipe
    started = time.monotonic()
    monkeypatch.setattr(access.time, "monotonic", lambda: started + 0.0145)
    with caplog.at_level(logging.INFO, logger=logs.ACCESS_LOGGER):
        for environ in ENVIRONS:
            access.log_request(environ, 200, 419, started, route="/invocations")
        records = list(caplog.records)
        for fmt in ("text", "json"):
            monkeypatch.setattr(access, "_lines", access.access_lines(fmt, write, Scheduled()))
            for environ in ENVIRONS:
                access.log_request(environ, 200, 419, started, route="/invocations")
            access._lines.flush()
            lines = drain(read).decode().splitlines()
            assert len(lines) == len(records)
            for line, record in zip(lines, records):
                if fmt == "text":
                    assert line.endswith(f"INFO smserve.access: {record.getMessage()}")
                else:  # byte for byte after the time (each made its own)
                    assert line.split('Z", ', 1)[1] == logs.JsonFormatter().format(record).split('Z", ', 1)[1]
                    assert json.loads(line)["message"] == record.getMessage()
    assert len(caplog.records) == len(ENVIRONS)  # the buffered lines bypassed logging


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_line_that_cannot_be_made_costs_only_itself(caplog, pipe, fmt):
    read, write = pipe
    lines = access.access_lines(fmt, write, Scheduled())
    good = ("10.0.0.1", "POST", "/invocations", 200, 2, 0.001, "/invocations", None, None, None)
    lines.add(logging.INFO, good)
    lines.add(logging.INFO, good[:3] + ("not a status",) + good[4:])
    lines.add(logging.INFO, good)
    with caplog.at_level(logging.ERROR, logger=logs.__name__):
        lines.flush()
    assert [r.getMessage() for r in caplog.records] == ["an access line could not be made"]
    written = drain(read).decode().splitlines()
    assert len(written) == 2 and all('POST /invocations\\" 200 2 ' in line or 'POST /invocations" 200 2 ' in line
                                     for line in written)


class Parsed:
    """What log_request reads of gunicorn's parsed request."""

    def __init__(self, headers):
        self.method, self.path, self.headers = "POST", "/invocations", headers


class Held:
    """Something a request holds (its body, its headers), that a weakref can follow."""


class Headers(list):
    """A header list a weakref can follow."""


def test_a_waiting_line_keeps_nothing_of_its_request_alive(monkeypatch, caplog, pipe):
    """A line waits with strings and numbers only: the request, its environ (which holds
    the body) and the answer's headers are freed with the request, not at the flush.
    (Kept, they counted against the collector's gen0 threshold until the flush: at -c 16
    it ran every ~70 requests, and not at all at warning.)"""
    read, write = pipe
    caplog.set_level(logging.INFO, logger=logs.ACCESS_LOGGER)
    lines = access.access_lines("json", write, Scheduled())
    monkeypatch.setattr(access, "_lines", lines)
    body = Held()
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/mine", "REMOTE_ADDR": "10.0.0.1", "wsgi.input": body,
               "HTTP_X_AMZN_REQUESTID": "req-7"}
    req = Parsed(Headers([("HOST", "x"), ("X-AMZN-SAGEMAKER-INFERENCE-ID", "inf-1"),
                          ("X-AMZN-SAGEMAKER-SESSION-ID", "NEW_SESSION")]))
    answer = Headers([("Content-Type", "application/json"),
                      ("X-Amzn-SageMaker-New-Session-Id", "sess-9; Expires=2026-12-05T10:00:00Z")])
    started = time.monotonic()
    access.log_request(environ, 200, 2, started, route="/mine")
    access.log_request((req, ("10.0.0.2", 5151)), 200, 3, started, route="/invocations", headers=answer)
    held = [weakref.ref(thing) for thing in (body, req, req.headers, answer)]
    del body, environ, req, answer
    assert [ref() for ref in held] == [None] * 4
    for _, _, details in lines._pending:
        assert {type(value) for value in details} <= {str, int, float, type(None)}
    lines.flush()
    first, second = (json.loads(line) for line in drain(read).decode().splitlines())
    assert (first["path"], first["remote"], first["request_id"], first["bytes"]) == ("/mine", "10.0.0.1", "req-7", 2)
    assert "inference_id" not in first or first["inference_id"] == "req-7"
    assert (second["path"], second["remote"], second["inference_id"], second["session_id"]) == (
        "/invocations", "10.0.0.2", "inf-1", "sess-9")


def test_on_the_worker_loop_each_line_waits_for_the_timer_not_only_the_first(pipe):
    """A libev one-shot timer started again after it has fired fires at once: with one
    timer reused, every line after the first flush was written at the next turn of the
    loop (a write per request at -c 1), not within ACCESS_FLUSH_S as a batch. Timed from
    the loop's clock, which is that of its last turn, a line also went out at once after
    the loop's thread had been busy longer than the wait."""
    import gevent

    read, write = pipe
    lines = access_lines("text", write, logs.timer_on(gevent.get_hub().loop, 0.3))
    gevent.sleep(0.01)  # a turn of the loop: its clock is read
    time.sleep(0.5)  # then it falls behind, as behind a long pass on the loop's thread
    for i in range(3):  # the first round passed before; the others wrote at once
        lines.add(logging.INFO, (f"line {i}", None))
        gevent.sleep(0.02)  # turns of the loop
        assert drain(read) == b"", f"round {i}: written before its timer"
        deadline = time.monotonic() + 5
        while not (written := drain(read)) and time.monotonic() < deadline:
            gevent.sleep(0.02)
        assert written.endswith(f"line {i}\n".encode())


def test_a_line_utf8_cannot_carry_is_written_escaped_with_the_others(pipe):
    read, write = pipe
    lines = access_lines("text", write, Scheduled())
    lines.add(logging.INFO, ("lone \udc80 surrogate", None))
    lines.add(logging.INFO, ("after", None))
    lines.flush()
    assert [line.split(": ", 1)[1] for line in drain(read).decode().splitlines()] == ["lone \\udc80 surrogate", "after"]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_line_too_long_for_one_write_is_cut_to_fit_with_the_others_whole(monkeypatch, caplog, fmt):
    """A target of escaped characters (each '"' six in a JSON line) makes a line of tens
    of KB: its client strings are cut until it fits one atomic write."""
    writes: list[bytes] = []
    monkeypatch.setattr(logs.os, "write", lambda fd, data: writes.append(bytes(data)) or len(data))
    lines = access.access_lines(fmt, 99, Scheduled())
    long_path = "/" + '"\\\x01\u00e9' * 1500
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": long_path, "REMOTE_ADDR": "10.0.0.1",
               "HTTP_X_AMZN_SAGEMAKER_INFERENCE_ID": '"' * 256, "HTTP_X_AMZN_REQUESTID": "\\" * 256,
               access.SESSION_KEY: "\x02" * 256}
    monkeypatch.setattr(access, "_lines", lines)
    caplog.set_level(logging.INFO, logger=logs.ACCESS_LOGGER)
    for i in range(3):
        access.log_request({**environ, "PATH_INFO": f"/short/{i}"}, 200, 10, time.monotonic())
        access.log_request(environ, 200, 10, time.monotonic())
    lines.flush()
    assert writes and all(len(data) <= logs.ACCESS_BUFFER_BYTES and data.endswith(b"\n") for data in writes)
    text = b"".join(writes).decode().splitlines()
    assert len(text) == 6
    if fmt == "json":
        entries = [json.loads(line) for line in text]
        assert [e["path"] for e in entries[::2]] == [f"/short/{i}" for i in range(3)]
        for entry in entries[1::2]:
            assert entry["path"].endswith(access.CUT_MARK) and long_path.startswith(entry["path"][:-3])
            assert entry["inference_id"].startswith('"') and entry["status"] == 200
    assert all(access.CUT_MARK in line for line in text[1::2])

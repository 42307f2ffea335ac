"""Reading InvokeEndpointWithResponseStream's event stream as the parts arrive.

SageMaker relays the container's chunked answer as PayloadPart events whose bytes are
cut wherever the network cut them: a JSON Lines record or a Server-Sent Event may span
parts, and one part may hold several. So the bytes are reassembled here and printed
per record (JSON Lines), per event (text/event-stream), or as they come (other text).

Two kinds of failure end a stream, each as one DeployError line (exit 1):
- SageMaker's: a ModelStreamError (the container broke the stream or ran out of time)
  or InternalStreamFailure event; botocore raises those as EventStreamError.
- The container's: once the first chunk is sent the status cannot change any more, so
  this project's server ends a failed stream with an error record in the stream's own
  format: `event: error` with `data: {"error": ...}` (SSE), or a last JSON Lines
  record that is `{"error": ...}` alone. An SSE `event: end` marks a normal end.
"""

from __future__ import annotations

import codecs
import json
from typing import Iterable, Iterator

from botocore.exceptions import EventStreamError

from deploy import codec
from deploy.aws import DeployError

SSE = "text/event-stream"
# Media types whose records are lines; ndjson is JSON Lines under another name.
LINE_TYPES = (codec.JSONLINES, "application/x-ndjson", "application/jsonl", "application/x-jsonlines", codec.CSV)


class Fragment(str):
    """Part of a line: printed without a newline, as it arrived."""


class LineDecoder:
    """Bytes in, complete lines out; a line split across parts waits for its end."""

    def __init__(self, json_records: bool = False):
        self._pending = b""
        self._json_records = json_records

    def feed(self, data: bytes) -> Iterator[str]:
        for line in self._lines(data):
            yield self._checked(line)

    def close(self) -> Iterator[str]:
        for line in self._close():
            yield self._checked(line)

    def _checked(self, line: str) -> str:
        if self._json_records and line.startswith('{"error"'):
            record = _json(line)
            if isinstance(record, dict) and list(record) == ["error"]:
                raise DeployError(f"the model's stream failed: {_one_line(record['error'])}")
        return line

    def _lines(self, data: bytes) -> Iterator[str]:
        self._pending += data
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode("utf-8", "replace")

    def _close(self) -> Iterator[str]:
        if self._pending.strip():
            yield self._pending.rstrip(b"\r").decode("utf-8", "replace")
        self._pending = b""


class EventDecoder:
    """Server-Sent Events (the WHATWG event-stream format): one printed item per event.

    `data:` lines of one event are joined with newlines; comments (`:`), `id:` and
    `retry:` lines are read and not printed. An event cut off by the end of the stream
    is still printed: it is the model's last word, not noise.
    """

    def __init__(self):
        self._lines = LineDecoder()
        self._data: list[str] = []
        self._event = "message"

    def feed(self, data: bytes) -> Iterator[str]:
        for line in self._lines._lines(data):
            yield from self._line(line)

    def close(self) -> Iterator[str]:
        for line in self._lines._close():
            yield from self._line(line)
        yield from self._dispatch()

    def _line(self, line: str) -> Iterator[str]:
        if line == "":
            yield from self._dispatch()
            return
        if line.startswith(":"):
            return
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value

    def _dispatch(self) -> Iterator[str]:
        data, event = "\n".join(self._data), self._event
        had_data = bool(self._data)
        self._data, self._event = [], "message"
        if event == "error":
            record = _json(data)
            message = record.get("error", data) if isinstance(record, dict) else data
            raise DeployError(f"the model's stream failed: {_one_line(message)}")
        if event == "end" or not had_data:
            return
        yield data


class TextDecoder:
    """Other text: each part printed as it comes; a UTF-8 character split across parts waits."""

    def __init__(self):
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._wrote = False
        self._ends_line = True

    def feed(self, data: bytes) -> Iterator[str]:
        text = self._utf8.decode(data)
        if text:
            self._wrote, self._ends_line = True, text.endswith("\n")
            yield Fragment(text)

    def close(self) -> Iterator[str]:
        tail = self._utf8.decode(b"", final=True)
        if tail:
            self._wrote, self._ends_line = True, tail.endswith("\n")
            yield Fragment(tail)
        if self._wrote and not self._ends_line:
            yield Fragment("\n")


class WholeDecoder:
    """Binary answers (npy, v2 binary): nothing to print until the last part."""

    def __init__(self, content_type: str):
        self._content_type = content_type
        self._parts: list[bytes] = []

    def feed(self, data: bytes) -> Iterator[str]:
        self._parts.append(data)
        return iter(())

    def close(self) -> Iterator[str]:
        from deploy.invoke import render

        yield render(b"".join(self._parts), self._content_type)


def decoder_for(content_type: str):
    kind = codec.media_type(content_type or "")
    if kind == SSE:
        return EventDecoder()
    if kind in LINE_TYPES:
        return LineDecoder(json_records=kind != codec.CSV)
    if kind.startswith("text/") or kind == codec.JSON or kind.endswith("+json"):
        return TextDecoder()
    return WholeDecoder(content_type)


def printable(events: Iterable[dict], content_type: str) -> Iterator[str]:
    """What `invoke --stream` prints, item by item, as the events arrive."""
    decoder = decoder_for(content_type)
    try:
        for event in events:
            if "PayloadPart" in event:
                yield from decoder.feed(event["PayloadPart"].get("Bytes", b""))
            elif "ModelStreamError" in event or "InternalStreamFailure" in event:
                raise DeployError(stream_failure(event))
    except EventStreamError as error:
        raise DeployError(stream_failure(error)) from None
    yield from decoder.close()


def stream_failure(failure: dict | EventStreamError) -> str:
    """One line for a stream that broke: ModelStreamError carries the container's error code."""
    if isinstance(failure, EventStreamError):
        info = dict(failure.response.get("Error", {}))
        kind = info.get("Code") or "stream error"
        detail = {**failure.response.get(kind, {}), **info}
    else:
        kind = "ModelStreamError" if "ModelStreamError" in failure else "InternalStreamFailure"
        detail = failure[kind]
    message = " ".join(str(detail.get("Message") or "no message").split())
    code = detail.get("ErrorCode")
    where = "the model's stream failed" if kind == "ModelStreamError" else "the stream failed inside SageMaker"
    return f"{where}: {kind}{f' {code}' if code else ''}: {message}"



def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _one_line(value) -> str:
    return " ".join(str(value).split()) or "no message"

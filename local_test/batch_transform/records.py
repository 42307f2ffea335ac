"""Input files as records, records as mini-batches, and answers back as output lines."""

from __future__ import annotations

import json
import math
import re
from typing import Iterator

from local_test.batch_transform.config import MB
from local_test.batch_transform.errors import BatchFailed


def split_records(data: bytes, split_type: str) -> list[bytes]:
    """The records of one input file; a blank line is a separator, not a record."""
    if split_type == "None":
        return [data] if data else []
    records = []
    for line in data.split(b"\n"):
        if line.endswith(b"\r"):
            line = line[:-1]
        if line.strip():
            records.append(line)
    return records


def pack_batches(
    records: list[bytes], strategy: str, max_payload_bytes: int | None, split_type: str = "Line"
) -> Iterator[tuple[int, list[bytes], bytes, str | None]]:
    """Yield (first record index, records, body, error) in input order.

    MULTI_RECORD fills a mini-batch with whole records, each newline-terminated, while
    the body stays within MaxPayloadInMB. A record that alone exceeds it becomes a
    mini-batch of its own that carries an error instead of being sent: SageMaker
    fails such a record rather than splitting it.
    """
    if split_type == "None":
        for i, record in enumerate(records):
            error = _oversize(len(record), max_payload_bytes, "the file")
            yield i, [record], record, error
        return

    current: list[bytes] = []
    current_size = 0
    first = 0
    for i, record in enumerate(records):
        size = len(record) + 1
        error = _oversize(size, max_payload_bytes, f"record {i + 1}")
        if error:
            if current:
                yield first, current, _body(current), None
                current, current_size = [], 0
            yield i, [record], b"", error
            first = i + 1
            continue
        fits = max_payload_bytes is None or current_size + size <= max_payload_bytes
        if current and (strategy == "SINGLE_RECORD" or not fits):
            yield first, current, _body(current), None
            current, current_size = [], 0
        if not current:
            first = i
        current.append(record)
        current_size += size
    if current:
        yield first, current, _body(current), None


def _body(records: list[bytes]) -> bytes:
    return b"".join(record + b"\n" for record in records)


def _oversize(size: int, limit: int | None, what: str) -> str | None:
    if limit is not None and size > limit:
        return (
            f"{what} is {size} bytes, over MaxPayloadInMB ({limit // MB} MB = {limit} bytes); "
            "SageMaker does not split a record"
        )
    return None


def response_lines(body: bytes) -> list[bytes]:
    """One entry per newline-terminated line; a CR before the newline is dropped."""
    lines = body.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def join_record(record: bytes, output: bytes, kind: str) -> bytes:
    """JoinSource=Input for one record, as SageMaker documents it.

    CSV: the input row followed by the output row's columns. JSON: the output goes
    into the input object under "SageMakerOutput"; an input that is not an object
    (an array, a scalar) is wrapped as {"SageMakerInput": ..., "SageMakerOutput": ...}.
    """
    if kind == "csv":
        return record + b"," + output
    try:
        source = json.loads(record)
    except ValueError as exc:
        raise BatchFailed(f"JoinSource=Input: input record is not JSON ({exc})") from None
    try:
        result = json.loads(output)
    except ValueError:
        # A model whose JSON Lines output is plain text still gets joined, as a string.
        result = output.decode("utf-8", "replace")
    if isinstance(source, dict):
        joined = dict(source)
        joined["SageMakerOutput"] = result
    else:
        joined = {"SageMakerInput": source, "SageMakerOutput": result}
    return json.dumps(joined, separators=(",", ":")).encode()


_JSON_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def named_record(record: bytes, inputs: tuple[tuple[str, int | None], ...]) -> bytes:
    """A CSV record as one JSON Lines object, its columns given to the named inputs in
    order (the last takes the rest): `1,2,3` with ((a, 2), (b, None)) -> {"a":[1,2],"b":[3]}.

    A cell that is a JSON number goes as written, not through a float here; another
    number (`.5`, `1.`, `+3`) goes as the float it is; anything else goes as a string,
    which the server refuses naming the record's line, as it would the CSV cell.
    A record with too few columns gives the later inputs fewer values, and the server's
    shape check names it: the server, not this runner, knows each input's shape."""
    values = [_json_value(cell.strip()) for cell in record.split(b",")]
    parts = []
    at = 0
    for name, columns in inputs:
        taken = values[at:] if columns is None else values[at:at + columns]
        at += len(taken)
        parts.append(json.dumps(name).encode() + b":[" + b",".join(taken) + b"]")
    return b"{" + b",".join(parts) + b"}"


def _json_value(cell: bytes) -> bytes:
    if _JSON_NUMBER.fullmatch(cell):
        return cell
    try:
        number = float(cell)
    except ValueError:
        number = None
    if number is not None and math.isfinite(number):  # JSON has no NaN or infinity
        return repr(number).encode()
    return json.dumps(cell.decode("utf-8", "replace")).encode()


"""CSV request bodies: one record a line, numeric cells, read by numpy's C reader a slice at a time.

Text carries finite numbers only (simple.py's header has the rules).
"""

from __future__ import annotations

import codecs
import io
import math
import re

import numpy as np

from smserve.codecs import slices
from smserve.codecs.records.text import BLANK, BLANK_BYTES, spans
from smserve.errors import BadRequest

# The plain spelling of a number, which np.loadtxt and float() read alike; any other
# cell (other whitespace, nan, inf, junk) is judged by np.loadtxt itself. The fraction's
# digits follow a point, never the integer's digits directly: a long cell of digits and
# then junk is refused in linear time, not quadratic.
_FINITE = re.compile(r"[ \t]*[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[ \t]*")
_NON_FINITE = re.compile(r"\s*[+-]?(?:nan|inf|infinity)\s*", re.IGNORECASE)

#
# One rule for errors, whatever the slicing: a body's error is that of its first bad
# line, and a line's is the first of: not UTF-8, blank, wrong column count (more than
# the model's input takes, for line 1), then its first bad cell. A slice numpy reads
# cleanly holds no bad line; a slice it refuses is walked line by line, and every line
# is judged alone by the same test, so a sliced parse names the very line (and words)
# one parse of the whole body names.
#
# A line longer than a slice (a million columns on one line) is read alone, cut at
# commas into pieces of about a slice each: numpy reads a line's cells the same
# together or apart. Before any cell it is checked whole, a bounded window at a time,
# for what comes first in the rule (UTF-8, blank, its column count), and a line 1
# wider than the model's input is refused there, before a cell is converted.

# No number is written this long; a cell past it is refused without being read (numpy
# would convert it in one call, holding the GIL all along).
MAX_CELL_BYTES = slices.CSV_TEXT_BYTES


def csv(body: bytes, size: int | None = None, max_columns: int | None = None, input_name: str = "input") -> np.ndarray:
    """CSV rows -> a 2-D float64 array, numpy's C reader one slice at a time.

    max_columns: the most values a record of the model's input holds, when its
    metadata says: a wider line 1 is refused before its cells are read."""
    size = min(size or slices.CSV_TEXT_BYTES, MAX_CELL_BYTES)  # every line that may hold a too-long cell is long
    parts: list[np.ndarray] = []
    columns = None
    for start, stop, first in spans(body, size):
        if stop - start > size:  # one line, longer than a slice
            count = _csv_long_line_columns(body, start, stop, first)
            if columns is None:
                columns = count
                _check_width(first, columns, max_columns, input_name)
            elif count != columns:
                raise _column_count_error(first, count, columns)
            parts.append(_csv_long_line(body, start, stop, first, columns, size))
            continue
        piece = body[start:stop]
        if columns is None:
            line = piece.split(b"\n", 1)[0]
            columns = line.count(b",") + 1
            if max_columns is not None and columns > max_columns:
                _csv_line_text(line, first)  # not UTF-8, or blank, comes first
                _check_width(first, columns, max_columns, input_name)
        values = _csv_piece(piece, columns)
        if values is None:
            _csv_culprit(piece, first, columns)
        parts.append(values)
    return slices.stack(parts)


def _check_width(number: int, columns: int, max_columns: int | None, input_name: str) -> None:
    if max_columns is not None and columns > max_columns:
        raise BadRequest(f"CSV line {number} has {columns} columns; input '{input_name}' takes at most {max_columns}")


def _column_count_error(number: int, count: int, columns: int) -> BadRequest:
    return BadRequest(
        f"CSV line {number} has {count} columns, line 1 has {columns}: every record needs the same number of columns"
    )


def _csv_piece(piece: bytes, columns: int) -> np.ndarray | None:
    """The slice's rows, or None when any of its lines is bad. A blank line needs no
    search of its own (a regex over every slice would cost more than the parse): np.loadtxt
    skips it or refuses it, and either way the row count below or the parse fails."""
    if piece.count(b"\r") != piece.count(b"\r\n") + piece.endswith(b"\r"):
        return None  # a lone CR: np.loadtxt would take it as a line end
    values = _loadtxt(piece)
    if values is None or values.shape != (piece.count(b"\n") + 1, columns) or not np.isfinite(values).all():
        return None
    return values


def _loadtxt(text: bytes) -> np.ndarray | None:
    """np.loadtxt's float64 rows of `text`; None where it refuses it, or finds no row."""
    if not text.strip(b"\r\n"):
        return None  # (numpy warns of an empty input, then gives no row)
    try:
        return np.loadtxt(io.StringIO(text.decode("utf-8")), delimiter=",", dtype=np.float64, ndmin=2,
                          comments=None, quotechar=None)
    except (UnicodeDecodeError, ValueError):
        return None


def _csv_culprit(piece: bytes, first: int, columns: int):
    """Raise the error of the slice's first bad line."""
    for number, raw in enumerate(piece.split(b"\n"), start=first):
        cells = _csv_line_text(raw, number).split(",")
        if len(cells) != columns:
            raise _column_count_error(number, len(cells), columns)
        _csv_cell_culprit(cells, number, 1)
    raise BadRequest("CSV body does not parse as numbers")  # not reached: some line above is bad


def _csv_line_text(raw: bytes, number: int) -> str:
    """A line's text without its CR; raises when it is not UTF-8 or is blank."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"body is not UTF-8 text (line {number})") from None
    if line.endswith("\r"):
        line = line[:-1]
    if not line.strip(BLANK):
        raise BadRequest(f"line {number} is empty: each line must be one record")
    return line


def _csv_cell_culprit(cells: list[str], number: int, first: int) -> None:
    """Raise for the first bad one of these cells of line `number`, the first of them
    in column `first`; None when all are numbers."""
    for column, cell in enumerate(cells, start=first):
        problem = _cell_problem(cell)
        if problem:
            raise BadRequest(f"CSV line {number}, column {column}: {cell.strip()[:40]!r} {problem}")


def _csv_long_line_columns(body: bytes, start: int, stop: int, number: int) -> int:
    """The column count of the line body[start:stop], once it is known to be UTF-8 and
    not blank (which come first), a bounded window at a time."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    blank, commas = True, 0
    for at in range(start, stop, slices.SCAN_BYTES):
        window = body[at : min(at + slices.SCAN_BYTES, stop)]
        try:
            decoder.decode(window, final=at + slices.SCAN_BYTES >= stop)
        except UnicodeDecodeError:
            raise BadRequest(f"body is not UTF-8 text (line {number})") from None
        blank = blank and not window.strip(BLANK_BYTES)
        commas += window.count(b",")
    if blank:
        raise BadRequest(f"line {number} is empty: each line must be one record")
    return commas + 1


def _csv_long_line(body: bytes, start: int, stop: int, number: int, columns: int, size: int) -> np.ndarray:
    """The line body[start:stop] (UTF-8, not blank, `columns` cells) as a (1, columns)
    row: its cells cut at commas into runs of about `size` bytes, each read alone."""
    if body[stop - 1 : stop] == b"\r":
        stop -= 1  # the line's own CR; any other is a lone one, which no cell may hold
    out = np.empty((1, columns), dtype=np.float64)
    at, column = start, 1  # where the run of cells starts, and its first cell's column
    while True:
        if stop - at <= size:
            cut = stop
        else:
            cut = body.rfind(b",", at, at + size + 1)
            if cut < 0:  # the cell at `at` is longer than a slice
                cut = body.find(b",", at + size, min(stop, at + MAX_CELL_BYTES + 1))
                if cut < 0 and stop - at > MAX_CELL_BYTES:
                    cut = body.find(b",", at, stop)
                    cut = stop if cut < 0 else cut
                    out[0, column - 1] = _padded_cell(body, at, cut, number, column)
                    column += 1
                    if cut >= stop:
                        return out
                    at = cut + 1
                    continue
                cut = stop if cut < 0 else cut
        run = body[at:cut]
        values = _csv_cells(run)
        if values is None:
            _csv_cell_culprit(run.decode("utf-8").split(","), number, column)
            raise BadRequest("CSV body does not parse as numbers")  # not reached: a cell above is bad
        out[0, column - 1 : column - 1 + len(values)] = values
        column += len(values)
        if cut >= stop:
            return out
        at = cut + 1


def _padded_cell(body: bytes, start: int, stop: int, number: int, column: int) -> float:
    """A cell over MAX_CELL_BYTES, body[start:stop]. No number needs that many bytes,
    but padding can make one that long, as a client filling a body to an exact size
    does: spaces around it, zeros before its digits, zeros after a fraction's last
    digit. Those are taken off (a bounded window a step), and what is left must be a
    number of at most MAX_CELL_BYTES; anything else is refused without being read."""
    start = _skip(body, start, stop, b" \t")
    stop = _skip_back(body, start, stop, b" \t")
    sign = body[start : start + 1] if body[start : start + 1] in (b"+", b"-") else b""
    digits = start + len(sign)
    start = _skip(body, digits, stop, b"0")
    # One zero is kept where any were taken: "000e5" reads "0e5", "000 5" reads "0 5"
    # (refused, as numpy refuses it), and a cell of spaces alone stays blank (refused).
    zero = b"0" if start > digits else b""
    if (stop - start > MAX_CELL_BYTES and body.find(b".", start, stop) >= 0
            and body.find(b"e", start, stop) < 0 and body.find(b"E", start, stop) < 0):
        stop = max(_skip_back(body, start, stop, b"0"), start + 1)  # keep the point's neighbour
    if stop - start > MAX_CELL_BYTES:
        raise BadRequest(f"CSV line {number}, column {column}: a cell over {MAX_CELL_BYTES} bytes long "
                         "is not a number")
    cell = sign + zero + body[start:stop]
    values = _csv_cells(cell) if cell.strip(b"+-") else None
    if values is None and not cell.strip():
        raise BadRequest(f"CSV line {number}, column {column}: '' is not a number")
    if values is None:
        _csv_cell_culprit([cell.decode("utf-8")], number, column)
        raise BadRequest(f"CSV line {number}, column {column}: not a number")  # not reached
    return float(values[0])


def _skip(body: bytes, at: int, stop: int, chars: bytes) -> int:
    """The first position in body[at:stop] whose byte is not one of chars."""
    other = re.compile(b"[^" + re.escape(chars) + b"]")
    while at < stop:
        step = min(stop, at + slices.SCAN_BYTES)
        found = other.search(body, at, step)
        if found:
            return found.start()
        at = step
    return stop


def _skip_back(body: bytes, start: int, stop: int, chars: bytes) -> int:
    """The end of body[start:stop] without its trailing run of chars."""
    while stop > start:
        step = max(start, stop - slices.SCAN_BYTES)
        kept = len(body[step:stop].rstrip(chars))
        if kept:
            return step + kept
        stop = step
    return start


def _csv_cells(run: bytes) -> np.ndarray | None:
    """A run of one line's cells as a 1-D array; None when any of them is bad."""
    if b"\r" in run:
        return None  # a lone CR (the line's own was taken off)
    values = _loadtxt(run)
    if values is None or values.shape != (1, run.count(b",") + 1) or not np.isfinite(values).all():
        return None
    return values[0]


def _cell_problem(cell: str) -> str | None:
    """What is wrong with one cell, as np.loadtxt judges it; None if it is a finite number."""
    if _FINITE.fullmatch(cell):
        value = float(cell)
    elif "\r" in cell or "\n" in cell:
        return "is not a number"  # (numpy would read it as two lines)
    else:  # another spelling numpy may take (other whitespace, nan, inf): ask numpy
        try:
            value = float(np.loadtxt(io.StringIO(cell + ",0"), delimiter=",", dtype=np.float64, ndmin=2,
                                     comments=None, quotechar=None)[0, 0])
        except ValueError:
            return "is not a number"
    if math.isfinite(value):
        return None
    if _NON_FINITE.fullmatch(cell):
        return "is not a finite number (text carries finite numbers only; send NaN/inf in .npy or binary)"
    return "is out of range for a 64-bit float"

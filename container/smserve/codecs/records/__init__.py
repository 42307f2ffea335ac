"""Numeric records from CSV, JSON Lines and JSON request text, parsed in bounded slices.

Each parse works on about `slices.TEXT_BYTES` of text per C call (split at newlines, or
at record boundaries of a JSON list; CSV `slices.CSV_TEXT_BYTES`, and a CSV line longer
than that is cut at commas) so the event loop's thread gets the GIL between slices; the
result is the same array, and the same error, as one parse of the whole body. Text
carries finite numbers only (see simple.py's header for the rules).

- text: a body's lines, in slices of whole lines;
- csvrows: CSV;
- jsonlines: JSON Lines, one record a line (numbers, or named inputs);
- jsondoc: JSON documents, and the number checks every JSON form shares.

May import: codecs/' own modules, core/ and the base modules.
"""

from smserve.codecs.records.csvrows import MAX_CELL_BYTES, csv
from smserve.codecs.records.jsondoc import (
    RECORD_KEYS,
    SLICED_JSON_MIN_BYTES,
    c_records,
    check_numbers,
    parse,
    parse_document,
    too_deep,
)
from smserve.codecs.records.jsonlines import jsonlines, jsonlines_named
from smserve.codecs.records.text import lines

__all__ = [
    "MAX_CELL_BYTES",
    "RECORD_KEYS",
    "SLICED_JSON_MIN_BYTES",
    "c_records",
    "check_numbers",
    "csv",
    "jsonlines",
    "jsonlines_named",
    "lines",
    "parse",
    "parse_document",
    "too_deep",
]

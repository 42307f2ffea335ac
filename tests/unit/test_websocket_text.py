"""A text message whose bytes come in pieces (a streamed answer's chunks, a stream_fn's
items): every frame is text, however the pieces split a character, and the frames
together are the answer's text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smserve.streaming.text import TextPieces, item_payload


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]


@settings(max_examples=300, deadline=None)
@given(st.text(), st.lists(st.integers(min_value=0), max_size=12))
def test_utf8_split_anywhere_comes_out_whole(answer, cuts):
    text = TextPieces("text/plain")
    frames = [text.piece(piece) for piece in split(answer.encode("utf-8"), cuts)] + [text.end()]
    assert all(type(frame) is str for frame in frames)
    assert "".join(frames) == answer
    assert not text.invalid


def test_a_character_split_over_three_pieces_waits_for_its_last_byte():
    text = TextPieces("text/plain; charset=utf-8")
    assert [text.piece(p) for p in (b"caf", b"\xc3", b"\xa9", b" ok")] + [text.end()] == ["caf", "", "\u00e9", " ok", ""]


@pytest.mark.parametrize("pieces, expected", [
    ([b"ok", b"\xff", b"!"], "ok\ufffd!"),              # a byte that is never UTF-8
    ([b"ok", b"\xc3"], "ok\ufffd"),                      # a character cut off at the end
    ([b"\xc3", b"A", b"\xa9"], "\ufffdA\ufffd"),         # a character broken in the middle
])
def test_bytes_that_are_not_utf8_become_replacement_characters(pieces, expected):
    text = TextPieces("text/plain")
    frames = [text.piece(p) for p in pieces] + [text.end()]
    assert all(type(frame) is str for frame in frames)
    assert "".join(frames) == expected
    assert text.invalid


def test_valid_pieces_after_an_invalid_one_keep_a_split_character():
    text = TextPieces("text/plain")
    frames = [text.piece(p) for p in (b"\xff", b"caf\xc3", b"\xa9")] + [text.end()]
    assert "".join(frames) == "\ufffdcaf\u00e9"


@pytest.mark.parametrize("media, encoded, expected", [
    ("text/plain; charset=ISO-8859-1", "café".encode("latin-1"), "café"),
    ('text/csv; charset="utf-16"', "a,é".encode("utf-16"), "a,é"),
    ("text/plain; charset=no-such-charset", "café".encode("utf-8"), "café"),  # unknown: UTF-8
    ("text/plain; charset=base64", b"Y2Fm", "Y2Fm"),  # not a text encoding: UTF-8
])
def test_the_answers_charset_decides_how_its_bytes_are_read(media, encoded, expected):
    text = TextPieces(media)
    assert "".join([text.piece(encoded[:3]), text.piece(encoded[3:]), text.end()]) == expected


def test_stream_fn_items_of_a_text_message_may_split_a_character_between_bytes_and_str():
    text = TextPieces()
    frames = [item_payload(item, text, line=True) for item in ("x", b"caf\xc3", b"\xa9", " ok", {"n": 1})]
    frames.append(text.end())
    assert all(type(frame) is str for frame in frames)
    assert "".join(frames) == 'xcafé ok{"n":1}\n'


def test_a_str_after_an_incomplete_character_ends_that_character():
    text = TextPieces()
    frames = [item_payload(item, text) for item in (b"caf\xc3", "e")] + [text.end()]
    assert "".join(frames) == "caf\ufffde" and text.invalid


def test_binary_messages_are_left_as_bytes():
    assert item_payload(b"\xc3", None) == b"\xc3"
    assert item_payload("é", None) == "é".encode("utf-8")

"""A WebSocket message's fragments, put together: the bytes or text sent, whatever the
fragmenting (a binary message past one fragment grows in one buffer, not a final join)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smserve.http.websocket import _Inbound


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_binary_fragments_make_the_message_sent(fragments):
    inbound = _Inbound(text=False)
    for fragment in fragments:
        if fragment:  # (the session adds only non-empty data)
            inbound.add(fragment)
    message = inbound.message()
    assert type(message) is bytes or len([f for f in fragments if f]) == 1
    assert bytes(message) == b"".join(fragments)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=16), max_size=8))
def test_text_fragments_make_the_message_sent(fragments):
    inbound = _Inbound(text=True)
    for fragment in fragments:
        if fragment:
            inbound.add(fragment)
    assert inbound.message() == "".join(fragments)


@pytest.mark.parametrize("text, empty", [(False, b""), (True, "")])
def test_an_empty_message_is_empty(text, empty):
    assert _Inbound(text=text).message() == empty

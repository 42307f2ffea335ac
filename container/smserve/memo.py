"""Memos keyed by what clients send (a path, a header, a peer's address): bounded, so a
client that varies its keys costs at most `most` entries of memory."""

from __future__ import annotations


def keep(memo: dict, key, value, most: int):
    """memo[key] = value, the memo emptied first when it holds `most` entries (cheaper
    than evicting one by one, and a client repeating a few keys makes them again at
    once). Returns value."""
    if len(memo) >= most:
        memo.clear()
    memo[key] = value
    return value

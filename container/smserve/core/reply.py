"""An answer as every route and transport sees it: a body, or chunks to send as they come.

Below the protocols and the response streams, which both build one, so neither needs
the other to name it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Iterable


@dataclass
class Reply:
    """An answer: one body, or chunks to stream as they come (`body` an iterator)."""

    body: bytes | Iterable[bytes]
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def streamed(self) -> bool:
        return not isinstance(self.body, (bytes, bytearray, memoryview))

    @property
    def media(self) -> str:
        return self.headers.get("Content-Type", "")


def is_stream(value) -> bool:
    """A hook's result that is an iterator of items to send one by one (a predict_fn's
    answer, a stream_fn's fragmented message), not one value: a generator, or anything
    with __next__ that is not an array or a container."""
    if isinstance(value, (str, bytes, bytearray, memoryview, dict, list, tuple)):
        return False
    return inspect.isgenerator(value) or (hasattr(value, "__next__") and not hasattr(value, "shape"))

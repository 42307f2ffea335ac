"""Small file-system steps the worker's shared folders need."""

from __future__ import annotations

import contextlib
import os


def remove(path: str) -> None:
    """Remove a file; one already gone (another worker's clean-up, a restart's) is no error."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)

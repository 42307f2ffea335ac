"""The media types of the simple protocols: one list, read by the codecs, the protocol
table and the settings (which check SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT against it).

Nothing heavy is imported here: `serve` reads the settings before any worker exists.
"""

from __future__ import annotations

import functools

JSON = "application/json"
CSV = "text/csv"
JSONLINES = "application/jsonlines"
NPY = "application/x-npy"
# Several named arrays in one body (np.savez), as the SageMaker inference toolkit names it.
NPZ = "application/x-npz"
# What an answer can be (Accept); .npz is a request type only.
MEDIA_TYPES = (JSON, CSV, JSONLINES, NPY)
# What a request body can be.
REQUEST_TYPES = MEDIA_TYPES + (NPZ,)
# Other spellings clients use for the same formats.
ALIASES = {
    "application/x-jsonlines": JSONLINES,
    "application/jsonl": JSONLINES,
    "application/json-lines": JSONLINES,
    "application/npy": NPY,
    "application/npz": NPZ,
    "text/plain+csv": CSV,
}


@functools.lru_cache(maxsize=256)
def media_type(content_type: str | None) -> str:
    """'text/csv; charset=utf-8' -> 'text/csv', with aliases resolved."""
    value = (content_type or "").split(";")[0].strip().lower()
    return ALIASES.get(value, value)

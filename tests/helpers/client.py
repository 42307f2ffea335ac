"""What a test's client sends and reads: .npy bodies, and POSTs to a running server (each its own
connection, so a server's workers take turns)."""

from __future__ import annotations

import io
import json

import numpy as np
import requests

JSON = "application/json"


def npy(array) -> bytes:
    """An array as an application/x-npy body."""
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(array))
    return buffer.getvalue()


def from_npy(data: bytes) -> np.ndarray:
    """An application/x-npy answer's array (never a pickle)."""
    return np.load(io.BytesIO(data), allow_pickle=False)


def post(url: str, body, headers: dict[str, str] | None = None, *, content_type: str = JSON,
         accept: str | None = None, timeout: float = 60) -> requests.Response:
    """POST body to url (path included): bytes as they are, anything else as JSON."""
    data = body if isinstance(body, bytes) else json.dumps(body)
    head = {"Content-Type": content_type, **({"Accept": accept} if accept else {}), **(headers or {})}
    return requests.post(url, data=data, headers=head, timeout=timeout)


def invoke(server, body, content_type: str = JSON, accept: str | None = None, headers: dict[str, str] | None = None,
           timeout: float = 60) -> requests.Response:
    """POST body to a server's /invocations."""
    return post(server.url + "/invocations", body, headers, content_type=content_type, accept=accept, timeout=timeout)

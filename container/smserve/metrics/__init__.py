"""The server's metrics: what the rest of the code records, and nothing else to know.

The package's face: `from smserve import metrics; metrics.request(...)`. The recording
lives in recording.py, the families in catalog.py, the per-request tallies in tally.py,
the workers' CPU and memory in process.py and the /metrics answer in exposition.py;
none of them imports this face back.
"""

from __future__ import annotations

from smserve.metrics.recording import (ModelStats, enable, enabled, families, forget_model, model, registry,  # noqa: F401
                                       request, session_handoff, session_state, stateful_session, stream_chunk,
                                       stream_started,
                                       websocket_message, websocket_session)
from smserve.metrics.tally import flush  # noqa: F401 - for the scrape

__all__ = ["ModelStats", "enable", "enabled", "families", "flush", "forget_model", "model", "registry", "request",
           "session_handoff", "session_state", "stateful_session", "stream_chunk", "stream_started", "websocket_message",
           "websocket_session"]

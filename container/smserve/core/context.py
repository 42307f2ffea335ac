"""A request's context, as the model's hooks see it: SageMaker's headers, the request's
path and query, and the custom attributes to send back.

`input_fn`, `predict_fn`, `output_fn` (engine/hooks/script.py) may declare a last parameter
named `context`; a `stream_fn` always gets one (streaming/session.py SessionContext,
which is one of these). One is built per request (per message, in a default WebSocket
session), and only when a hook asks for it: the headers are wrapped, never copied.
"""

from __future__ import annotations

import logging
from typing import Iterator, Mapping
from urllib.parse import parse_qsl

__all__ = ["CUSTOM_ATTRIBUTES", "INFERENCE_ID", "TARGET_MODEL", "Headers", "RequestContext",
           "response_custom_attributes"]

log = logging.getLogger(__name__)

CUSTOM_ATTRIBUTES = "X-Amzn-SageMaker-Custom-Attributes"
INFERENCE_ID = "X-Amzn-SageMaker-Inference-Id"
TARGET_MODEL = "X-Amzn-SageMaker-Target-Model"
# SageMaker's limit on CustomAttributes, both ways: visible US-ASCII, at most 1024 characters.
MAX_CUSTOM_ATTRIBUTES = 1024


class Headers(Mapping):
    """A request's headers, read-only, looked up in any case (`headers["content-type"]`,
    `headers.get("X-Amzn-SageMaker-Custom-Attributes")`); names iterate in lower case.
    A repeated field's values are joined with commas. Wraps the server's own table of
    upper-case names without copying it."""

    __slots__ = ("_upper",)

    def __init__(self, upper: Mapping[str, str]):
        self._upper = upper

    def __getitem__(self, name: str) -> str:
        return self._upper[name.upper()]

    def get(self, name: str, default=None):
        return self._upper.get(name.upper(), default)

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and name.upper() in self._upper

    def __iter__(self) -> Iterator[str]:
        return (name.lower() for name in self._upper)

    def __len__(self) -> int:
        return len(self._upper)

    def __repr__(self) -> str:
        return f"Headers({dict(self.items())!r})"


class RequestContext:
    """One request's context. Read: `custom_attributes`, `inference_id`, `target_model`
    (each None when the request did not carry it), `headers`, `path`, `query_string`
    and `query` (parsed, a dict of str), `device` (the model's torch.device),
    `session_id` and `close_reason` (a stateful session's), `system_properties` (the
    SageMaker toolkit's: `model_dir`, `gpu_id`, None on the CPU). Read and write: `session`
    (a stateful session's state); `response_custom_attributes`, sent back as
    X-Amzn-SageMaker-Custom-Attributes (SageMaker's `CustomAttributes`)."""

    __slots__ = ("headers", "path", "query_string", "_target_model", "_query", "response_custom_attributes", "device",
                 "session", "session_id", "close_reason", "system_properties")

    def __init__(self, headers: Mapping[str, str], path: str = "", query_string: str = "",
                 target_model: str | None = None):
        """headers: the request's, upper-case names (routes.table.Request.headers), or Headers.
        target_model: the model a multi-model route names, when no header does."""
        self.headers = headers if isinstance(headers, Headers) else Headers(headers)
        self.path = path
        self.query_string = query_string or ""
        self._target_model = target_model
        self._query: dict[str, str] | None = None
        self.response_custom_attributes: str | None = None
        # The model's torch.device (the worker's GPU, or the CPU), set by the server
        # before the hooks run: where a hook puts tensors of its own.
        self.device = None
        # As the SageMaker toolkit's context has them (engine/toolkit.system_properties),
        # set with the device.
        self.system_properties: dict = {}
        # A stateful session's (engine/sessions/store.py): its state (the hooks may change it,
        # or set another), its ID, and in close_session why it ends.
        self.session = None
        self.session_id: str | None = None
        self.close_reason: str | None = None

    @property
    def custom_attributes(self) -> str | None:
        return self.headers.get(CUSTOM_ATTRIBUTES)

    @property
    def inference_id(self) -> str | None:
        return self.headers.get(INFERENCE_ID)

    @property
    def target_model(self) -> str | None:
        return self.headers.get(TARGET_MODEL) or self._target_model

    @property
    def query(self) -> dict[str, str]:
        if self._query is None:
            self._query = dict(parse_qsl(self.query_string, keep_blank_values=True))
        return self._query

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(path={self.path!r}, query_string={self.query_string!r}, "
                f"custom_attributes={self.custom_attributes!r}, inference_id={self.inference_id!r}, "
                f"target_model={self.target_model!r})")


def response_custom_attributes(context: RequestContext | None) -> str | None:
    """The custom attributes a hook set for the response, once checked: a value that
    cannot be a header field (not a str, not visible ASCII, over SageMaker's 1024
    characters) is not sent, and the log says why, so no hook can forge other headers."""
    if context is None:
        return None
    value = context.response_custom_attributes
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_CUSTOM_ATTRIBUTES or \
            not (value.isascii() and value.isprintable()):
        log.warning("context.response_custom_attributes not sent: it must be a str of visible ASCII characters, "
                    "at most %d (SageMaker's limit), not %.80r", MAX_CUSTOM_ATTRIBUTES, value)
        return None
    return value

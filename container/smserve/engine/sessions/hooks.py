"""A stateful session's open and close through the model's own hooks, on the inference
thread (they may put tensors on the model's device).

`served` is the model's served model (engine/worker/served.ServedModel): its loaded
model, its runner and its hook contexts are what these read.
"""

from __future__ import annotations

from smserve.core.context import RequestContext
from smserve.engine.hooks.script import hook_error


def open_session(served, context):
    """The model's open_session(context): a new session's state."""
    hook = served.model.hooks.open_session
    served.hook_contexts(context)

    def run():
        try:
            return hook(context)
        except Exception as e:  # noqa: BLE001 - answered, naming the hook
            raise hook_error("open_session", e, client_fault=False) from e

    return served.runner.call(run)


def close_session(served, state, context, session_id: str, how: str) -> None:
    """The model's close_session(state, context), if it has one; context.close_reason
    says why (closed, expired, unloaded, shutdown)."""
    hook = served.model.hooks.close_session if served.model is not None else None
    if hook is None:
        return
    context = context if context is not None else RequestContext({})  # (at expiry: no request)
    context.session, context.session_id, context.close_reason = state, session_id, how
    served.hook_contexts(context)

    def run():
        try:
            hook(state, context)
        except Exception as e:  # noqa: BLE001
            raise hook_error("close_session", e, client_fault=False) from e

    served.runner.call(run)

"""A request's context as the model's hooks get it (input_fn ... stream_fn, the session
hooks): the model's device and the toolkit's system_properties, made once per model."""

from __future__ import annotations

from smserve import toolkit


class HookContexts:
    """Fills in a model's part of each request's context (core/context.py)."""

    __slots__ = ("device", "system_properties")

    def __init__(self, model_dir: str, device):
        self.device = device
        self.system_properties = toolkit.system_properties(model_dir, device)

    def __call__(self, context):
        """context, naming the model's device, with the toolkit's system_properties."""
        context.device = self.device
        context.system_properties = self.system_properties
        return context

    def of(self, message):
        """The message's context (protocols' Message, made on first use), filled in."""
        return self(message.context)

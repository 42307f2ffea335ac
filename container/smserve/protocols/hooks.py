"""The model's own hooks as a wire protocol: its input_fn reads the body (any
Content-Type), or the built-in codecs do and its output_fn (or a predict_fn that
streams) answers. The chain itself (input_fn, the batcher, output_fn) is the engine's
(engine/hooks/chain.py); this module chooses the Accept each step is asked for."""

from __future__ import annotations

from smserve.codecs import simple
from smserve.core import media
from smserve.core.inference import InferenceRequest
from smserve.core.reply import Reply
from smserve.engine.worker.served import ServedModel
from smserve.errors import NotAcceptable
from smserve.protocols import streams
from smserve.protocols.kserve_v2 import v2_reply
from smserve.protocols.message import HANDED_BACK, Message, Protocol, default_accept, input_fn_takes, negotiate, preferred
from smserve.protocols.simple import answer_labels, decode_builtin, encode_simple
from smserve.settings import Settings


class Hooks(Protocol):
    """The model's own input_fn / output_fn (or a predict_fn that streams) decides:
    any Content-Type when it has an input_fn, the simple types otherwise. An input_fn
    that returns NotImplemented hands the body back: the table is asked again without
    it, so the built-in codecs decode it (a KServe v2 document gets a v2 answer)."""

    name = "hooks"
    for_byte_hooks = True

    def takes(self, message, server):
        if not server.traits.byte_hooks:
            return False
        if input_fn_takes(message, server):
            return True
        # Without it: the built-in codecs decode, and output_fn or a streaming predict_fn answer.
        hooks = server.model.hooks
        return (hooks.output_fn is not None or hooks.streams) and message.kind in media.REQUEST_TYPES

    def answer(self, message, server, settings):
        if input_fn_takes(message, server):
            value, decoded = server.hook_chain.input(message), False
            if value is NotImplemented:
                message.input_fn_declined = True
                return HANDED_BACK
        else:
            value = server.pools.offload(len(message.body), decode_builtin, message.body, message.content_type,
                                         server.metadata, settings.max_body_bytes)
            if isinstance(value, InferenceRequest):
                return v2_reply(server, value, sagemaker=True, message=message)
            decoded = True
        hooks = server.model.hooks
        stream_format = None
        if hooks.streams:
            # Known to stream: an Accept no stream can meet is refused before the model runs.
            stream_format = streams.negotiate(message.accept, hooks.output_with(lambda: message.context))
        accept, encode = _accept_and_encoder(message, server, settings, decoded)
        server.check_ready()  # (still, after input_fn's turn on a hook thread)
        result = server.hook_chain.answer(value, message, accept, encode, decoded)
        if not isinstance(result, tuple):  # predict_fn returned an iterator: stream it
            return streams.streamed_reply(server, message, result, stream_format)
        payload, media_type = result
        return Reply(payload, {"Content-Type": media_type})


def _accept_and_encoder(message: Message, server: ServedModel, settings: Settings, decoded: bool):
    """The Accept output_fn is asked for, and the built-in encoder of named arrays.

    The built-in encoders answer when there is no output_fn, or when it hands the
    prediction back (NotImplemented). Whether predict_fn streams is known from what it
    returns, and a stream type is acceptable then: a refusal waits for the result."""
    default = default_accept(settings, message.kind)
    try:
        builtin, refusal = negotiate(message.accept, default), None
        labels = answer_labels(message.accept, builtin, server.metadata)
    except NotAcceptable as e:
        builtin, refusal, labels = default, e, None
    # The records' wrapper is answered in kind only where the built-in codecs read it:
    # a body input_fn read is the script's own, answered bare as the toolkit's output_fn does.
    wrapped = decoded and simple.wraps_records(message.body, message.content_type)

    def encode(outputs):
        if refusal is not None:
            raise refusal
        return encode_simple(outputs, builtin, labels, wrapped)

    # The user's output_fn may speak types we do not: it gets the client's first choice.
    accept = preferred(message.accept, default) if server.model.hooks.output_fn is not None else builtin
    return accept, encode

"""The wire protocols of /invocations, as one table that every route uses.

Each protocol says which requests it takes (from the Content-Type, a v2 header and
what the model's hooks handle) and how a body becomes an answer: decode, infer,
encode. `/invocations` and the WebSocket session pick the first protocol that takes a
message and call it; neither re-implements the choice. Decoding and encoding whose
cost grows with the body run on the codec threads, inference on the inference thread,
so the event loop only moves bytes. The protocols: protocols/kserve_v2.py,
protocols/hooks.py (the model's own), protocols/simple.py.
"""

from __future__ import annotations

from smserve.core import media
from smserve.core.reply import Reply
from smserve.engine.worker.served import ServedModel
from smserve.errors import UnsupportedMediaType
from smserve.protocols.hooks import Hooks
from smserve.protocols.kserve_v2 import SageMakerBinary, V2JsonBinary, V2OctetStream, v2_reply
from smserve.protocols.message import HANDED_BACK, OCTET_STREAM, Message, Protocol, default_accept, negotiate, preferred
from smserve.protocols.simple import Json, Simple, answer_labels, encode_simple, simple_reply
from smserve.protocols.streams import streamed_reply
from smserve.settings import Settings

# Reply and the negotiation helpers are named here too: routes and sessions read the
# protocol table's module for everything about answering.
__all__ = ["Message", "Reply", "Protocol", "PROTOCOLS", "choose", "answer", "v2_reply", "simple_reply",
           "streamed_reply", "default_accept", "negotiate", "preferred", "answer_labels", "encode_simple",
           "OCTET_STREAM"]

SUPPORTED_REQUEST_TYPES = (
    "application/json (simple or KServe v2)",
    media.CSV,
    media.JSONLINES,
    media.NPY,
    f"{media.NPZ} (several named arrays)",
    "application/octet-stream (KServe v2 binary)",
    "application/vnd.sagemaker-triton.binary+json;json-header-size=N",
)

# Order matters: the v2 forms are recognised by their headers before the model's hooks
# see a body; JSON is sniffed for a v2 document only when no hook takes it.
PROTOCOLS: tuple[Protocol, ...] = (SageMakerBinary(), V2OctetStream(), V2JsonBinary(), Hooks(), Json(), Simple())


def choose(message: Message, server: ServedModel) -> Protocol:
    kind = message.kind
    for protocol in PROTOCOLS:
        if protocol.kinds is not None and kind not in protocol.kinds:
            continue
        if protocol.marker is not None and protocol.marker not in message.content_type:
            continue
        if protocol.for_byte_hooks and not server.traits.may_handle_bytes:
            continue
        if protocol.takes(message, server):
            return protocol
    if message.input_fn_declined:
        raise UnsupportedMediaType(
            f"unsupported Content-Type {message.content_type!r}: the model's input_fn handed it back (it returned "
            "NotImplemented) and the built-in codecs take only: " + ", ".join(SUPPORTED_REQUEST_TYPES))
    raise UnsupportedMediaType(
        f"unsupported Content-Type {message.content_type!r}; send one of: " + ", ".join(SUPPORTED_REQUEST_TYPES)
        + "; or read any other type (an image, say) with an input_fn in the model's code/inference.py "
        "(docs/model.md#your-own-input-formats)")


def answer(message: Message, server: ServedModel, settings: Settings) -> Reply:
    """The one way a message becomes a reply, for every route. A body the model's
    input_fn hands back is answered by the protocol the table chooses without it."""
    while True:
        protocol = choose(message, server)
        server.check_ready()
        reply = protocol.answer(message, server, settings)
        if reply is not HANDED_BACK:
            return reply

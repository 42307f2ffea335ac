"""The wire protocols: which one takes a message (TABLE, the order they are asked in;
protocols/message.ProtocolTable: decode, infer, encode), each protocol in its own
module (kserve_v2, hooks, simple) over what they share (message), content negotiation,
and response streaming of an iterator a model returns. They ask the served model what
engine/worker/served.ServedModel states, no more.

May import: engine/, codecs/, core/ and the base modules; not routes/, streaming/ or http/.
"""

from smserve.protocols.hooks import Hooks
from smserve.protocols.kserve_v2 import SageMakerBinary, V2JsonBinary, V2OctetStream
from smserve.protocols.message import ProtocolTable
from smserve.protocols.simple import Json, Simple

# Order matters: the v2 forms are recognised by their headers before the model's hooks
# see a body; JSON is sniffed for a v2 document only when no hook takes it.
TABLE = ProtocolTable((SageMakerBinary(), V2OctetStream(), V2JsonBinary(), Hooks(), Json(), Simple()))

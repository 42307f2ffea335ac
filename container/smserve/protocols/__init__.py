"""Which wire protocol takes a message (the protocol table, dispatch: decode, infer,
encode), each protocol in its own module (kserve_v2, hooks, simple) over what they share
(message), content negotiation, and response streaming of an iterator a model returns.
They ask the served model what engine/worker/served.ServedModel states, no more.

May import: engine/, codecs/, core/ and the base modules; not routes/, streaming/ or http/.
"""

"""Which wire protocol takes a message (the protocol table: decode, infer, encode),
content negotiation, and response streaming of an iterator a model returns.

May import: engine/, codecs/, core/ and the base modules; not routes/, streaming/ or http/.
"""

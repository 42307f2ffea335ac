"""WebSocket sessions: what a session is to the code that answers it, which handler
takes one, the default session (each message through the protocol table) and a model's
own stream_fn sessions.

May import: protocols/, engine/, codecs/, core/ and the base modules; not routes/ or http/.
"""

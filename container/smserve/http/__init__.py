"""The gunicorn side: the master's config (the composition root that hands settings to
gunicorn), the worker and its accept loop, connections, request heads and bodies, sending,
the access log, and the WebSocket transport.

May import: every layer (it is the top one).
"""

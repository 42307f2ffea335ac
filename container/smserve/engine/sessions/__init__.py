"""One worker's stateful sessions: each session's state, its expiry, the bounds on
their count and size (store.py); how much memory a state holds, counted a slice at a
time (measure.py); and the model's open_session and close_session hooks, run on the
inference thread (hooks.py).

May import: engine/runtime/, engine/model/, engine/batching/, engine/hooks/ and the layers
below the engine.
"""

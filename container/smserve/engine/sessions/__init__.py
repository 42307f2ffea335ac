"""One worker's stateful sessions: each session's state, its expiry, the bounds on
their count and size, and the model's open_session and close_session hooks (store.py);
how much memory a state holds, counted a slice at a time (measure.py).

May import: engine/runtime/, engine/model/, engine/batching/, engine/hooks/ and the layers
below the engine.
"""

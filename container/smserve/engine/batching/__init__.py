"""Dynamic batching: what the batcher makes of a value (batchable: named leaves, or a
stream), the row arithmetic of passes (passes), whether requests share passes (plan), and
the runner that queues requests, cuts and joins passes and runs them inline or on the
inference thread (runner).

May import: engine/runtime/, engine/model/ and the layers below the engine.
"""

"""Dynamic batching: what the batcher makes of a value (batchable: named leaves, or a
stream), the row arithmetic of passes and the batcher's queue of them (passes), whether
requests share passes (plan), when a pass may run inline on the event loop's thread
(inline), and the runner that queues requests, cuts and joins passes and runs them
inline or on the inference thread (runner).

May import: engine/runtime/, engine/model/ and the layers below the engine.
"""

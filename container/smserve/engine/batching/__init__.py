"""Dynamic batching: what the batcher makes of a value (batchable: named leaves), the
row arithmetic of passes and the batcher's queue of them (passes), whether requests
share passes (plan), and the runner that queues requests, cuts and joins passes and
runs them inline on the loop's thread (where engine/runtime/main_lane.py admits it) or
on the inference thread (runner).

May import: engine/runtime/, engine/model/ and the layers below the engine.
"""

"""The worker's served model: the Protocols routes, protocols and streaming call it by
(served), the model server itself (its lifecycle, readiness and infer API: server), the
process-wide steps of its start and end (lifecycle), the loaded model with the user's
hooks around it (engine/model/ holds the torch model itself), the ready markers the
workers share, the hardware plan (cores, GPUs, workers) and what a worker sustains
(capacity: its threads, batch transform's parameters).

May import: every engine package above it in engine/'s list, and the layers below the engine.
"""

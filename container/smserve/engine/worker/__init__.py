"""The worker's served model: the model server routes, protocols and streaming call (its
lifecycle, readiness and infer API), the loaded model with the user's hooks around it
(engine/model/ holds the torch model itself), the ready markers the workers share, and
the hardware plan (cores, GPUs, workers).

May import: every engine package above it in engine/'s list, and the layers below the engine.
"""

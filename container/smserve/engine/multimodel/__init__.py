"""A multi-model endpoint: the registry of models every worker follows (a shared
folder: registry.py), one worker's side of it (loading, unloading, routing to each
model's server: server.py), whether a model may come in (its folder, the room its
memory takes: admission.py), and the start's rehearsal load (rehearsal.py).

May import: every other engine package, and the layers below the engine.
"""

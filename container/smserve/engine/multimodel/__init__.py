"""A multi-model endpoint: the registry of models every worker follows (a shared
folder), and one worker's side of it (loading, unloading, routing to each model's server).

May import: every other engine package, and the layers below the engine.
"""

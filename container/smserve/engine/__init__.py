"""Everything between a decoded request and the model, split by concept:

    runtime/     the inference thread, the loop's main greenlet, CPU priority, memory
    model/       the model file: which kind, its weights, its shapes, its values as numpy
    batching/    dynamic batching: what can be batched, passes cut and joined, the runner
    hooks/       the model script's contract, AWS's toolkit rules, the chain, hook processes
    sessions/    one worker's stateful sessions
    worker/      the worker's served model: its lifecycle and infer API, readiness, hardware
    multimodel/  a multi-model endpoint: the shared registry and one worker's side of it

Each package imports only from itself, the ones listed above it here and the layers
below the engine (core/, codecs/, the base modules): tests/unit/test_imports.py.
"""

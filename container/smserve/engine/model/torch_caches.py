"""What torch keeps of each model a multi-model worker ever loaded, let go of when the
model goes (engine/multimodel/server.py)."""

from __future__ import annotations


def generated_code(model) -> set[str]:
    """The names torch.fx gave the code it generated for this model's modules (an
    export program's GraphModules: `<eval_with_key>.N`, one per module)."""
    import torch

    names = set()
    if isinstance(model, torch.nn.Module):
        for module in model.modules():
            code = getattr(getattr(type(module), "forward", None), "__code__", None)
            if code is not None and code.co_filename.startswith("<eval_with_key>"):
                names.add(code.co_filename)
    return names


def clear_torch_caches(generated: set[str]) -> None:
    """What torch keeps of every model ever loaded, for good, let go of at its unload.
    Each is small, but a multi-model endpoint loads thousands of distinct models, and
    every later collection (an unload's, on the loop) would walk all of it, longer with
    each model the worker ever had.
    - torch.fx registers each generated module's source in `linecache` and its own
      cache (`generated`, this model's): source for tracebacks of a model now gone.
    - torch.export.load runs each program on fake tensors with symbolic shapes:
      FakeTensorMode's class-wide dispatch cache keeps the results, and ShapeEnv's
      lru_cache'd methods keep every ShapeEnv (one a load). The next load fills them
      again with what it needs.
    A torch without one of these pieces keeps that piece, as before."""
    import linecache

    try:
        from torch.fx.graph_module import _loader

        for name in generated:
            linecache.cache.pop(name, None)
            _loader.eval_cache.pop(name, None)
    except (ImportError, AttributeError):
        pass
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        FakeTensorMode.cache_clear()
        for attribute in list(vars(ShapeEnv).values()):
            if callable(getattr(attribute, "cache_clear", None)):
                attribute.cache_clear()
    except (ImportError, AttributeError):
        pass

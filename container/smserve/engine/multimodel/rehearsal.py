"""A multi-model worker's start: torch and what a model's load imports come in before
the first model, by a rehearsal load of two tiny models, so that they are frozen out of
the collector's passes with the rest of the start (the follower's gc.freeze) instead of
weighing on every later unload's collection.
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings

from smserve.engine.model.artifacts import EXPORTED, TORCHSCRIPT

log = logging.getLogger(__name__)


def rehearse() -> None:
    """Imports torch, then loads and warms a tiny TorchScript and a tiny torch.export
    model (Linear(2, 2)) the way a real model loads, and drops them: the export
    deserialiser's first call pulls in many more modules (torch._dynamo, torch._inductor,
    sympy, networkx), which the first real model would otherwise bring in after the
    freeze. Runs on a thread at the start; a rehearsal that fails only leaves those
    modules to the first load."""
    import torch

    from smserve.engine.model import derived
    from smserve.engine.worker import loaded_model

    quiet = [logging.getLogger(module.__name__) for module in (loaded_model, derived)]
    try:
        with tempfile.TemporaryDirectory(prefix="smserve-rehearsal-") as folder, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tiny, example = torch.nn.Linear(2, 2).eval(), (torch.zeros(1, 2),)
            for sub, save in (("script", lambda path: torch.jit.save(torch.jit.script(tiny), os.path.join(path, TORCHSCRIPT))),
                              ("export", lambda path: torch.export.save(torch.export.export(tiny, example),
                                                                        os.path.join(path, EXPORTED)))):
                path = os.path.join(folder, sub)
                os.mkdir(path)
                save(path)
                for logger in quiet:
                    logger.disabled = True
                try:
                    loaded_model.load_and_warm(path, torch.device("cpu"))
                finally:
                    for logger in quiet:
                        logger.disabled = False
    except Exception as e:  # noqa: BLE001 - an optimisation: the server serves without it
        log.warning("multi-model: the start's rehearsal load failed (%s: %s); the first model's load "
                    "brings in what it needs", type(e).__name__, e)

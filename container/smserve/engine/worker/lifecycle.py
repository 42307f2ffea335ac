"""The steps of a served model's start and end that are the worker process's, not the
model's: input_fn and output_fn moved to hook processes, the start's heap frozen, and
the whole server stopped when a model cannot be served."""

from __future__ import annotations

import gc
import logging
import os

from smserve import logs
from smserve.settings import Settings

log = logging.getLogger(__name__)

# gunicorn's arbiter halts, and exits with this status, when a worker exits with it.
WORKER_BOOT_ERROR = 3


def start_hook_processes(settings: Settings, hooks, model_dir: str, single: bool):
    """SMSERVE_HOOK_PROCESSES: input_fn and output_fn in processes of their own
    (engine/hooks/processes.py), where the model has them and keeps no sessions; None
    otherwise."""
    wanted = settings.hook_processes
    if not wanted or (hooks.input_fn is None and hooks.output_fn is None):
        return None
    if hooks.keeps_sessions:
        log.warning("SMSERVE_HOOK_PROCESSES=%d not used: this model keeps sessions, whose state its hooks read "
                    "in the worker; its input_fn and output_fn run on hook threads", wanted)
        return None
    from smserve.engine.hooks.processes import HookProcesses

    processes = HookProcesses(model_dir, wanted, settings.request_timeout, single=single)
    log.info("hook processes: %d run %s (SMSERVE_HOOK_PROCESSES; pids %s)", wanted,
             " and ".join(n for n in ("input_fn", "output_fn") if getattr(hooks, n) is not None),
             ", ".join(map(str, processes.pids)))
    return processes


def freeze_heap() -> None:
    """Keep what the start created (torch, the model, every module) out of the cyclic
    garbage collector's full passes: such a pass, set off by the many lists a big JSON
    body parses into, holds the GIL, and /ping with it."""
    gc.collect()
    gc.freeze()


def stop_the_server(model_dir: str) -> None:
    """SMSERVE_EXIT_ON_LOAD_ERROR: the whole server stops, not just this worker (a
    restarted one would fail the same way, forever)."""
    log.critical("stopping: the model in %s cannot be served (SMSERVE_EXIT_ON_LOAD_ERROR, which `make serve` "
                 "sets; under SageMaker the container stays up and /ping answers 500)", model_dir)
    logs.flush_access_lines()  # os._exit runs no atexit hook: the lines of the pings it answered
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(WORKER_BOOT_ERROR)

"""Every lock both real threads and the event loop (or several real threads) take is a
real thread lock in a worker, after gevent's monkey-patching: a gevent lock loses its
wake-ups between OS threads. Checked in a fresh process patched as the worker patches."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CONTAINER = Path(__file__).resolve().parents[2] / "container"

# As a worker: logging configured in the master, then the patch, then the worker's set-up.
AUDIT = textwrap.dedent('''
    import logging, logging.config, sys
    from smserve import logs
    logging.config.dictConfig(logs.config_dict("info", "text"))
    from gevent import monkey
    monkey.patch_all(subprocess=False, os=False, signal=False)
    logs.thread_safe_logging()
    from smserve.engine.model import weights
    from smserve.engine.hooks.processes import HookProcesses

    def gevents(lock):
        inner = getattr(lock, "_block", lock)  # (threading._RLock wraps a lock)
        return type(inner).__module__.startswith("gevent")

    locks = {"logging's module lock": logging._lock, "a handler made now": logging.StreamHandler().lock,
             "weights._swap": weights._swap, "HookProcesses._lock": HookProcesses("/nowhere", 0, timeout_s=60)._lock}
    locks.update((f"{handler!r} on {name}", handler.lock) for name in ["", "gunicorn.error"]
                 for handler in logging.getLogger(name).handlers)
    for target in getattr(logging.getLogger().handlers[0], "targets", ()):
        locks[f"{target!r} behind the hand-over"] = target.lock
    print("\\n".join(name for name, lock in locks.items() if gevents(lock)))
    # A process forked from the worker has its own writer for the records it logs.
    import os
    child = os.fork()
    if child == 0:
        logging.getLogger("child").warning("logged in the forked child")
        logging.shutdown()
        os._exit(0)
    os.waitpid(child, 0)
''')


def test_no_lock_threads_share_is_a_gevent_lock():
    done = subprocess.run([sys.executable, "-c", AUDIT], cwd=CONTAINER, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"gevent locks:\n{done.stdout}"
    assert "WARNING child: logged in the forked child" in done.stderr

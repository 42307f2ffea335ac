"""Ready markers shared by a server's workers (in the folder `serve` makes).

SageMaker sends traffic after the first 200 from /ping, so at the first start /ping is
200 only once every worker has loaded its model. After that first full start, any
worker that answers serves: a worker restarted after a crash takes no connection until
its model is loaded (worker.py), and the others keep serving meanwhile. The master
removes a worker's marker the moment it reaps it (gunicorn_conf.child_exit).
"""

from __future__ import annotations

import os

from smserve import files

STARTED = "started"


def marker(state_dir: str, index: int) -> str:
    return os.path.join(state_dir, f"worker-{index}.ready")


def mark_ready(state_dir: str, index: int, workers: int) -> None:
    open(marker(state_dir, index), "w").close()
    if not missing(state_dir, workers):
        open(os.path.join(state_dir, STARTED), "w").close()


def clear(state_dir: str, index: int) -> None:
    files.remove(marker(state_dir, index))


def missing(state_dir: str, workers: int) -> list[int]:
    """Worker indexes without a ready marker."""
    return [i for i in range(workers) if not os.path.exists(marker(state_dir, i))]


def starting(state_dir: str | None, workers: int) -> list[int]:
    """/ping's question at the first start: the workers not ready yet; none once every
    worker was ready at least once (or with no shared folder to ask)."""
    if not state_dir or not os.path.isdir(state_dir) or fully_started(state_dir):
        return []
    return missing(state_dir, workers)


def fully_started(state_dir: str | None) -> bool:
    """Every worker was ready at least once since the server started."""
    return bool(state_dir) and os.path.exists(os.path.join(state_dir, STARTED))

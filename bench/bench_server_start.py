"""A one-worker server's start: wall time until /ping answers 200, and the CPU its master
and its worker spent getting there, for a model of hooks (tests/helpers/hooks/echo.py)
and for the example's model.pt2; each as a new interpreter (`container/serve serve`, as
SageMaker starts it, less the container) and forked from the test suite's fork server
(tests/helpers/fork_server.py), in alternating rounds. The suite starts about 190
servers on two cores: this is what each costs it.

    .venv/bin/python bench/bench_server_start.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import requests

from _harness import EXAMPLE_MODEL, ServerProcess, cpu_seconds, worker_pids
from tests.helpers.fork_server import ForkServer  # (_harness put the checkout on sys.path)
from tests.helpers.models import ECHO_HOOKS, model_dir_with


def one_start(model: Path, forks: ForkServer | None, log: Path) -> tuple[float, float, float]:
    """(seconds until ready, master CPU-s, worker CPU-s), then the server stopped."""
    ServerProcess.forker = forks.start if forks else None
    began = time.monotonic()
    with ServerProcess(model, log_path=log) as server:
        ready = time.monotonic() - began
        (worker,) = worker_pids(server.proc.pid)
        assert requests.get(server.url + "/ping", timeout=10).status_code == 200
        return ready, cpu_seconds(server.proc.pid), cpu_seconds(worker)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the suite runs (tests/conftest.py)
    scratch = Path(tempfile.mkdtemp(prefix="bench-start-"))
    models = {"hooks": model_dir_with(scratch, ECHO_HOOKS, "echo"), "model.pt2": EXAMPLE_MODEL}
    forks = ForkServer(os.environ)
    forks.started()  # its own start (once a pytest process) is not a server's
    results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for round_ in range(args.rounds):
        for model_name, model in models.items():
            for how, server_forks in (("new interpreter", None), ("forked", forks)):
                log = scratch / f"{model_name}-{how}-{round_}.log"
                results.setdefault((model_name, how), []).append(one_start(model, server_forks, log))
    forks.close()
    print(f"{args.rounds} rounds, medians; host {os.cpu_count()} cores")
    print("| model | started as | ready s | master CPU-s | worker CPU-s | CPU-s in all |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (model_name, how), rows in results.items():
        ready, master, worker = (statistics.median(column) for column in zip(*rows))
        print(f"| {model_name} | {how} | {ready:.2f} | {master:.2f} | {worker:.2f} | {master + worker:.2f} |")


if __name__ == "__main__":
    main()

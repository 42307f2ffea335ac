"""/ping while an input_fn holds the GIL: hook threads against hook processes.

    .venv/bin/python bench/bench_hook_processes.py [--processes 2] [--seconds 8] [--rounds 3] [--concurrency 4]

A model whose input_fn json.loads a 5.2 MB JSON array of 400,000 floats (~90 ms holding
the GIL, here) and whose predict_fn sums it, behind one worker. `hey` posts the array
from --concurrency clients while /ping is polled every 20 ms on a kept-alive
connection, as SageMaker's health check does. Rounds alternate between two servers:
the hooks on threads (the default) and in --processes processes of their own
(SMSERVE_HOOK_PROCESSES), where the parse holds another interpreter's GIL.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np

from _harness import Pinger, ServerProcess, pct, run_hey

VALUES = 400_000
HOOKS = '''
import json

import numpy as np


def model_fn(model_dir):
    return "sum"


def input_fn(body, content_type):
    return np.asarray(json.loads(body), dtype=np.float32).reshape(1, -1)


def predict_fn(data, model):
    return data.sum(1, keepdims=True)
'''


def model(work: Path) -> Path:
    folder = work / "json-sum"
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "inference.py").write_text(HOOKS)
    (folder / "metadata.json").write_text(json.dumps({"max_batch_size": 8}))
    return folder


def measure(server, body: Path, args) -> dict:
    with Pinger(server.url + "/ping", period=0.02, timeout=10) as pinger:
        out = run_hey(server.url + "/invocations", body, {"Content-Type": "application/json"}, args.seconds,
                      args.concurrency)
    if set(out["statuses"]) != {200} or out["errors"]:
        raise SystemExit(f"answers other than 200: {out['statuses']}, connection errors {out['errors']}")
    return {"rps": out["rps"], "p50": pct(pinger.latencies, 50), "p90": pct(pinger.latencies, 90),
            "p99": pct(pinger.latencies, 99), "max": max(pinger.latencies), "failures": pinger.failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench_hook_processes_"))
    folder = model(work)
    body = work / "array.json"
    body.write_text(json.dumps(np.random.default_rng(0).random(VALUES).round(10).tolist()))  # ~13 characters a value
    env = {"SMSERVE_LOG_LEVEL": "warning"}
    servers = {"hook threads": ServerProcess(folder, env, log_path=work / "threads.log"),
               f"{args.processes} processes": ServerProcess(folder, {**env, "SMSERVE_HOOK_PROCESSES":
                                                                      str(args.processes)},
                                                            log_path=work / "processes.log")}
    rows: dict[str, list[dict]] = {label: [] for label in servers}
    try:
        for server in servers.values():
            server.start()
        for server in servers.values():  # warm: the first parses allocate
            run_hey(server.url + "/invocations", body, {"Content-Type": "application/json"}, 2, args.concurrency)
        for _ in range(args.rounds):
            for label, server in servers.items():
                rows[label].append(measure(server, body, args))
    finally:
        for server in servers.values():
            server.terminate()

    print(f"\ninput_fn json.loads of a {body.stat().st_size / 2**20:.1f} MB array of {VALUES:,} floats, one worker, "
          f"hey -c {args.concurrency}, {args.seconds:g} s x {args.rounds} alternating rounds (medians); "
          "/ping every 20 ms")
    print(f"{'hooks':<14} {'req/s':>7} {'/ping p50':>10} {'p90':>7} {'p99':>7} {'max':>7} {'failed':>7}")
    medians = {}
    for label, results in rows.items():
        m = medians[label] = {key: statistics.median(r[key] for r in results) for key in results[0]}
        print(f"{label:<14} {m['rps']:>7.1f} {m['p50']:>8.1f}ms {m['p90']:>5.1f}ms {m['p99']:>5.1f}ms "
              f"{m['max']:>5.0f}ms {m['failures']:>7.0f}")
    threads, processes = medians.values()
    print(f"processes / threads: req/s {processes['rps'] / threads['rps']:.2f}x, "
          f"/ping p90 {processes['p90']:.1f} ms against {threads['p90']:.1f} ms")


if __name__ == "__main__":
    main()

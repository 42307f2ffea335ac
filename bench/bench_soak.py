"""A bounded soak: every content type, 1 % malformed bodies, /ping polled throughout.

    .venv/bin/python bench/bench_soak.py [--seconds 60] [--concurrency 64] [--malformed 0.01]

Starts the real gunicorn on the example model (one worker) and drives it from Python
threads, each on its own kept-alive connection, choosing per request among simple JSON,
CSV, JSON Lines, .npy, KServe v2 binary (/v2, Inference-Header-Content-Length) and the
SageMaker binary type (/invocations), 1-8 records each; a share of the requests are
malformed (each must be a 4xx). A separate poller GETs /ping every 100 ms. Prints one
table: requests, statuses, 5xx, connection errors, wrong answers, latency, the worker's
RSS at start and end, /ping p99 and max. Exits 1 on any 5xx, connection error, wrong
answer, failed ping or changed worker PID: under a soak, each of those must be zero.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from _harness import (EXAMPLE_MODEL, Client, ServerProcess, csv_body, digits, json_body, jsonlines_body,
                      malformed_bodies, npy_body, pct, rss_mb, sagemaker_binary_body, v2_binary_body, worker_pids)

FORMS = {
    "json": json_body,
    "csv": csv_body,
    "jsonlines": jsonlines_body,
    "npy": lambda x: npy_body(x, accept="application/x-npy"),
    "v2-binary": v2_binary_body,
    "sagemaker-binary": sagemaker_binary_body,
}


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.statuses: Counter = Counter()
        self.by_form: Counter = Counter()
        self.latencies: list[float] = []
        self.conn_errors: list[str] = []
        self.wrong: list[str] = []  # a 2xx for a malformed body, or a 4xx for a valid one

    def add(self, form: str, status: int, seconds: float, malformed: bool) -> None:
        with self.lock:
            self.statuses[status] += 1
            self.by_form[form] += 1
            self.latencies.append(seconds)
            if malformed != (400 <= status < 500) and status < 500:
                self.wrong.append(f"{form} malformed={malformed}: {status}")


def client_loop(port: int, stop: threading.Event, tally: Tally, malformed_share: float, seed: int) -> None:
    rng = random.Random(seed)
    # Pre-built bodies: the client's own encoding must not be what the soak measures.
    bodies = {name: [make(digits(n, seed * 100 + n)) for n in (1, 2, 8)] for name, make in FORMS.items()}
    bad = malformed_bodies()
    client = Client(port)
    while not stop.is_set():
        if rng.random() < malformed_share:
            form, malformed = "malformed", True
            path, body, headers = rng.choice(bad)
        else:
            form, malformed = rng.choice(list(FORMS)), False
            path, body, headers = rng.choice(bodies[form])
        started = time.perf_counter()
        try:
            status, _ = client.request("POST", path, body, headers)
        except (OSError, ConnectionError) as e:
            with tally.lock:
                tally.conn_errors.append(f"{form}: {type(e).__name__}: {e}")
            continue
        tally.add(form, status, time.perf_counter() - started, malformed)
    client.close()


def ping_loop(port: int, stop: threading.Event, pings: list, failures: list, period: float = 0.1) -> None:
    client = Client(port, timeout=5)
    while not stop.is_set():
        started = time.perf_counter()
        try:
            status, _ = client.request("GET", "/ping")
            if status != 200:
                failures.append(f"status {status}")
        except (OSError, ConnectionError) as e:
            failures.append(f"{type(e).__name__}: {e}")
        elapsed = time.perf_counter() - started
        pings.append(elapsed)
        stop.wait(max(0.0, period - elapsed))
    client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=EXAMPLE_MODEL)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--malformed", type=float, default=0.01, help="share of malformed bodies")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()

    log = Path(tempfile.mkdtemp(prefix="bench_soak_")) / "server.log"
    env = {"SMSERVE_LOG_LEVEL": "warning", "SAGEMAKER_MODEL_SERVER_WORKERS": str(args.workers)}
    # `with` stops the server (its whole process group) whatever happens, Ctrl-C included.
    with ServerProcess(args.model_dir, env, log_path=log) as server:
        warm = Client(server.port)
        for form, make in FORMS.items():
            path, body, headers = make(digits(8))
            status, text = warm.request("POST", path, body, headers)
            assert status == 200, (form, status, text[:300])
        warm.close()
        pids = worker_pids(server.proc.pid)
        rss_start = {pid: rss_mb(pid) for pid in pids}

        stop = threading.Event()
        tally, pings, ping_failures = Tally(), [], []
        threads = [threading.Thread(target=client_loop, args=(server.port, stop, tally, args.malformed, i), daemon=True)
                   for i in range(args.concurrency)]
        threads.append(threading.Thread(target=ping_loop, args=(server.port, stop, pings, ping_failures), daemon=True))
        started = time.monotonic()
        for t in threads:
            t.start()
        try:
            time.sleep(args.seconds)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        elapsed = time.monotonic() - started
        pids_end = worker_pids(server.proc.pid)
        rss_end = {pid: rss_mb(pid) for pid in pids_end}

    requests_done = sum(tally.statuses.values())
    five_xx = sum(n for s, n in tally.statuses.items() if s >= 500)
    start_mb = sum(rss_start.values())
    end_mb = sum(rss_end.get(p, float("nan")) for p in pids)
    rows = [
        ("duration s / concurrency", f"{elapsed:.1f} / {args.concurrency}"),
        ("requests (req/s)", f"{requests_done} ({requests_done / elapsed:.0f}/s)"),
        ("by form", ", ".join(f"{k} {v}" for k, v in sorted(tally.by_form.items()))),
        ("statuses", ", ".join(f"{k}: {v}" for k, v in sorted(tally.statuses.items()))),
        ("5xx", str(five_xx)),
        ("connection errors", str(len(tally.conn_errors))),
        ("wrong answers (4xx valid / 2xx malformed)", str(len(tally.wrong))),
        ("latency p50 / p99 ms", f"{pct(tally.latencies, 50) * 1000:.1f} / {pct(tally.latencies, 99) * 1000:.1f}"),
        ("worker RSS start -> end MB (growth)",
         f"{start_mb:.0f} -> {end_mb:.0f} ({(end_mb / start_mb - 1) * 100:+.1f} %)"),
        ("worker PIDs unchanged", str(pids == pids_end)),
        ("/ping count / failures", f"{len(pings)} / {len(ping_failures)}"),
        ("/ping p99 / max ms", f"{pct(pings, 99) * 1000:.1f} / {max(pings, default=float('nan')) * 1000:.1f}"),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"soak: example model, 1 worker, {args.malformed:.0%} malformed, server log {log}")
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    for what, items in (("connection error", tally.conn_errors), ("wrong answer", tally.wrong),
                        ("ping failure", ping_failures)):
        for item in items[:5]:
            print(f"  {what}: {item}")
    ok = five_xx == 0 and not tally.conn_errors and not tally.wrong and not ping_failures and pids == pids_end
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

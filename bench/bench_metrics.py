"""What /metrics costs: throughput with metrics on against SMSERVE_METRICS=false, side
by side in interleaved rounds (req/s, and the worker's CPU per request); what recording
costs a request, timed alone, against that CPU per request; and a scrape's time (with
/ping's meanwhile) on a server of 2 workers. Needs `hey` (apt-get install hey).

On a busy host req/s moves by tens of percent from round to round, far more than
metrics cost; the recording's own time per request over the server's CPU per request
is the steadier figure.

    .venv/bin/python bench/bench_metrics.py [--seconds 8] [--rounds 5] [--pin]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

from _harness import EXAMPLE_MODEL, ServerProcess, csv_body, digits, npy_body, pct, run_hey, worker_pids, Pinger
from _harness import cpu_seconds as process_cpu_seconds

print = functools.partial(print, flush=True)  # a long run shows its rows as they come


def pin(server: ServerProcess, core: int) -> None:
    """The master and its workers, every thread of each, on one core."""
    for pid in [server.proc.pid, *worker_pids(server.proc.pid)]:
        subprocess.run(["taskset", "-a", "-p", "-c", str(core), str(pid)], check=True, capture_output=True)


def cpu_seconds(server: ServerProcess) -> float:
    """user + system CPU of the server's workers (every thread) so far."""
    return sum(process_cpu_seconds(pid) for pid in worker_pids(server.proc.pid))


def recording_us(n: int = 100_000) -> float:
    """What one batch-1 request records (its count and duration, its queue wait, its
    forward pass, its pending count), timed alone in multiprocess mode, in us."""
    with tempfile.TemporaryDirectory() as folder:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder  # read when prometheus_client is imported
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "container"))
        from smserve import metrics

        metrics.enable()
        model = metrics.model("digits")
        started = time.perf_counter()
        for _ in range(n):
            queued = time.monotonic()
            model.pending(1)
            model.waited(queued)
            model.ran(1)
            model.pending(-1)
            metrics.request("/invocations", 200, 0.001)
        took = (time.perf_counter() - started) / n * 1e6
        metrics.flush()
        del os.environ["PROMETHEUS_MULTIPROC_DIR"]
        return took


def throughput(args, work: Path) -> None:
    servers = {"on": ServerProcess(EXAMPLE_MODEL), "off": ServerProcess(EXAMPLE_MODEL, {"SMSERVE_METRICS": "false"})}
    for server in servers.values():
        server.start(wait=False)
    try:
        for server in servers.values():
            server.wait_ready()
            if args.pin:
                pin(server, 0)
        assert requests.get(servers["off"].url + "/metrics", timeout=5).status_code == 404
        x = digits(1)
        cases = {"npy batch 1": npy_body(x), "csv batch 1": csv_body(x)}
        print(f"throughput, req/s: hey -c {args.concurrency} -z {args.seconds}s, one worker each"
              f"{', servers on core 0, hey on core 1' if args.pin else ''}; {args.rounds} interleaved rounds")
        for label, (path, body, headers) in cases.items():
            body_file = work / "body"
            body_file.write_bytes(body)
            for server in servers.values():  # warm-up
                run_hey(server.url + path, body_file, headers, 2, args.concurrency, 1 if args.pin else None)
            rps = {name: [] for name in servers}
            cpu_us = {name: [] for name in servers}  # worker CPU per request: steadier than req/s on a busy host
            for _ in range(args.rounds):
                for name, server in servers.items():
                    cpu = cpu_seconds(server)
                    result = run_hey(server.url + path, body_file, headers, args.seconds, args.concurrency,
                                     1 if args.pin else None)
                    assert set(result["statuses"]) == {200} and not result["errors"], result
                    rps[name].append(result["rps"])
                    cpu_us[name].append((cpu_seconds(server) - cpu) / result["statuses"][200] * 1e6)
            ratios = [on / off for on, off in zip(rps["on"], rps["off"])]
            recording = recording_us()
            print(f"  {label:12}  req/s on {statistics.median(rps['on']):6.0f}  off {statistics.median(rps['off']):6.0f}"
                  f"  on/off median {statistics.median(ratios):.3f}  (rounds: "
                  + ", ".join(f"{r:.3f}" for r in ratios) + ")")
            cpu_ratios = [on / off for on, off in zip(cpu_us["on"], cpu_us["off"])]
            print(f"  {'':12}  CPU us/request on {statistics.median(cpu_us['on']):6.0f}  off "
                  f"{statistics.median(cpu_us['off']):6.0f}  on/off median {statistics.median(cpu_ratios):.3f}")
            print(f"  {'':12}  recording alone {recording:.1f} us/request: "
                  f"{recording / statistics.median(cpu_us['off']) * 100:.2f} % of the CPU per request")
    finally:
        for server in servers.values():
            server.terminate()


def scrape_time(args) -> None:
    server = ServerProcess(EXAMPLE_MODEL, {"SAGEMAKER_MODEL_SERVER_WORKERS": "2"}).start()
    try:
        path, body, headers = csv_body(digits(3))
        for _ in range(200):  # every series a real server has: both workers answer
            requests.post(server.url + path, data=body, headers={**headers, "Connection": "close"}, timeout=10)
        answer = requests.get(server.url + "/metrics", timeout=10)
        series = sum(1 for line in answer.text.splitlines() if line and not line.startswith("#"))
        files = len(os.listdir(_multiproc_dir(server)))
        with Pinger(server.url + "/ping", 0.01) as idle:
            time.sleep(3)
        took = []
        stop = threading.Event()

        def scrape_forever():
            with requests.Session() as session:
                while not stop.is_set():
                    started = time.perf_counter()
                    assert session.get(server.url + "/metrics", timeout=10).status_code == 200
                    took.append((time.perf_counter() - started) * 1000)

        with Pinger(server.url + "/ping", 0.01) as scraped:
            scraper = threading.Thread(target=scrape_forever)
            scraper.start()
            time.sleep(args.scrape_seconds)
            stop.set()
            scraper.join()
        print(f"scrape, 2 workers ({series} samples, {len(answer.content)} bytes, {files} files): "
              f"{len(took)} back to back in {args.scrape_seconds:.0f} s, p50 {pct(took, 50):.1f} ms, "
              f"p99 {pct(took, 99):.1f} ms, max {max(took):.1f} ms")
        print(f"/ping every 10 ms: idle p50 {pct(idle.latencies, 50):.1f} / p99 {pct(idle.latencies, 99):.1f} ms; "
              f"while scraping nonstop p50 {pct(scraped.latencies, 50):.1f} / p99 {pct(scraped.latencies, 99):.1f}"
              f" / max {max(scraped.latencies):.1f} ms; failed {idle.failures + scraped.failures}")
    finally:
        server.terminate()


def _multiproc_dir(server: ServerProcess) -> str:
    with open(f"/proc/{server.proc.pid}/environ", "rb") as f:
        env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    return env[b"PROMETHEUS_MULTIPROC_DIR"].decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8, help="hey's duration per server per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--pin", action="store_true", help="servers on core 0, hey on core 1 (taskset)")
    parser.add_argument("--scrape-seconds", type=float, default=10)
    parser.add_argument("--only", choices=("throughput", "scrape"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        if args.only != "scrape":
            throughput(args, Path(work))
        if args.only != "throughput":
            scrape_time(args)


if __name__ == "__main__":
    main()

"""Fair passes: how long a one-record request waits while a request of thousands of passes runs.

    .venv/bin/python bench/bench_fairness.py [--records 200000] [--rounds 3] [--baseline GIT-REF]

The example digits model, one worker, passes of 64 records (SMSERVE_MAX_BATCH_SIZE=64).
A big `.npy` request of --records rows (3,125 passes at 200,000) is sent; 0.2 s later
one-record requests follow, one at a time, until it is answered. The table gives the
small requests' latency and the big request's own time, with them and alone (its
throughput must not suffer for the turns it gives). --baseline REF serves REF's
container/ too, in alternating rounds on the same machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import requests

from _harness import EXAMPLE_MODEL, ServerProcess, checkout, digits, npy_body, pct

SMALL_AFTER_S = 0.2
ENV = {"SMSERVE_MAX_BATCH_SIZE": "64", "SMSERVE_LOG_LEVEL": "warning"}


def big_request(server, body, headers) -> float:
    started = time.monotonic()
    r = requests.post(server.url + "/invocations", data=body, headers=headers, timeout=600)
    assert r.status_code == 200, r.text[:200]
    return time.monotonic() - started


def one_round(server, big, small, with_small: bool) -> dict:
    _, big_data, big_headers = big
    _, small_data, small_headers = small
    took: list[float] = []
    thread = threading.Thread(target=lambda: took.append(big_request(server, big_data, big_headers)))
    thread.start()
    latencies = []
    if with_small:
        time.sleep(SMALL_AFTER_S)
        with requests.Session() as session:
            while thread.is_alive():
                started = time.monotonic()
                r = session.post(server.url + "/invocations", data=small_data, headers=small_headers, timeout=60)
                assert r.status_code == 200, r.text[:200]
                latencies.append(time.monotonic() - started)
                time.sleep(0.01)
    thread.join()
    return {"big_s": took[0], "small": latencies}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", metavar="GIT-REF", help="also serve container/ as it was at this commit")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench_fairness_"))
    servers = {"this tree": ServerProcess(EXAMPLE_MODEL, ENV)}
    if args.baseline:
        servers[args.baseline[:10]] = ServerProcess(EXAMPLE_MODEL, ENV, serve=checkout(args.baseline, work))
    big = npy_body(digits(args.records), accept="application/x-npy")
    small = npy_body(digits(1, seed=1), accept="application/x-npy")
    results = {label: {"alone": [], "with": [], "small": []} for label in servers}
    try:
        for server in servers.values():
            server.start()
        for _ in range(args.rounds):
            for label, server in servers.items():
                one_round(server, small, small, False)  # warm
                results[label]["alone"].append(one_round(server, big, small, False)["big_s"])
                shared = one_round(server, big, small, True)
                results[label]["with"].append(shared["big_s"])
                results[label]["small"].extend(shared["small"])
    finally:
        for server in servers.values():
            server.terminate()

    print(f"\none {args.records:,}-record .npy request ({-(-args.records // 64):,} passes of 64) and one-record "
          f"requests sent one at a time from {SMALL_AFTER_S} s after it; {args.rounds} rounds, alternating servers")
    print(f"{'server':<12} {'big alone s':>12} {'big with s':>11} {'small n':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'max ms':>8}")
    for label, r in results.items():
        small_ms = [s * 1000 for s in r["small"]]
        print(f"{label:<12} {statistics.median(r['alone']):>12.2f} {statistics.median(r['with']):>11.2f} "
              f"{len(small_ms):>8} {pct(small_ms, 50):>8.1f} {pct(small_ms, 99):>8.1f} {max(small_ms):>8.1f}")
    if args.baseline:
        mine, before = results["this tree"], results[args.baseline[:10]]
        print(f"big request alone, this tree / {args.baseline[:10]}: "
              f"{statistics.median(before['alone']) / statistics.median(mine['alone']):.2f}x the throughput")


if __name__ == "__main__":
    main()

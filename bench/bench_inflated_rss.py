"""Peak memory of one worker while many compressed bodies arrive at once (issue 25).

Each request is a gzip body of ~100 KB that inflates to just under the payload limit
(a valid JSON request padded with spaces). The worker's peak RSS (VmHWM) is read after
all of them are answered. Before inflated bodies were bounded, every one waiting for a
codec thread was held inflated: peak grew by one payload limit per request.

    .venv/bin/python bench/bench_inflated_rss.py --requests 100 --limit-mb 20 [--serve OTHER/container/serve]
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from local_test.server_process import EXAMPLE_MODEL, ServerProcess  # noqa: E402


def body(limit: int) -> bytes:
    head = b'{"instances": [[' + b",".join([b"1"] * 64) + b"]]"
    padding = limit - len(head) - 1 - 4096  # just under the limit
    return gzip.compress(head + b" " * padding + b"}", compresslevel=9)


def worker_pid(server: ServerProcess) -> int:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == server.proc.pid:
                return int(entry)
    raise RuntimeError("no worker")


def status_kb(pid: int, field: str) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--limit-mb", type=int, default=100)
    parser.add_argument("--serve", default=None, help="another checkout's container/serve (before/after)")
    args = parser.parse_args()
    payload = body(args.limit_mb << 20)
    env = {"SMSERVE_MAX_REQUEST_MB": str(args.limit_mb), "SMSERVE_MAX_BATCH_DELAY_MS": "0"}
    log = Path(tempfile.mkdtemp()) / "server.log"
    try:
        server = ServerProcess(EXAMPLE_MODEL, env=env, serve=args.serve, log_path=log).start()
    except RuntimeError:
        print(log.read_text()[-3000:])
        raise
    try:
        pid = worker_pid(server)
        before = status_kb(pid, "VmRSS")
        statuses: Counter = Counter()
        gate = threading.Barrier(args.requests)

        def send() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
            gate.wait()
            conn.request("POST", "/invocations", body=payload,
                         headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
            response = conn.getresponse()
            response.read()
            statuses[response.status] += 1
            conn.close()

        started = time.monotonic()
        threads = [threading.Thread(target=send) for _ in range(args.requests)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.monotonic() - started
        peak = status_kb(pid, "VmHWM")
        print(f"{args.requests} requests of {len(payload) / 1024:.0f} KB gzip, each inflating to "
              f"{args.limit_mb} MB less 4 KB: statuses {dict(statuses)} in {took:.1f} s; worker RSS before "
              f"{before / 1024:.0f} MB, peak {peak / 1024:.0f} MB (+{(peak - before) / 1024:.0f} MB)")
    finally:
        server.terminate(timeout=10)


if __name__ == "__main__":
    main()

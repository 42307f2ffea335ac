"""How long /ping waits while the server is under stress: big bodies, slow clients, a dying worker.

    .venv/bin/python bench/bench_ping_stall.py                  # big bodies (default)
    .venv/bin/python bench/bench_ping_stall.py --slowloris 1000 [--body-timeout 5]
    .venv/bin/python bench/bench_ping_stall.py --kill-worker [--seconds 30]

Big bodies: one request at a time (40 MB JSON, 40 MB CSV, ~40 MB JSON Lines, 50 MB .npy
with a JSON answer, 50 MB v2 binary with a JSON and with a binary answer, and a 50 MB
.npy message in a WebSocket session at /invocations-bidirectional-stream) while a second
connection GETs /ping every 10 ms until the big request has its answer; prints the
request's seconds and the ping p50/p99/max. SageMaker's health check times out at 2 s;
the target is p99 under 50 ms.

--slowloris N: N connections send their head and 10 bytes of a 1000-byte body, then
stall; /ping latency over 50 pings with them open, then how many of them the server
closed within the body deadline (+3 s).

--kill-worker: 2 workers, 8 client threads of constant load, kill -9 of one worker after
3 s; every non-200 and connection error the clients saw, and /ping every 100 ms,
printed as runs ("0.0-2.4 s: 200; ...").
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import socket
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

from _harness import (EXAMPLE_MODEL, Client, ServerProcess, csv_body, json_body, jsonlines_body, npy_body, pct,
                      raise_fd_limit, sagemaker_binary_body, worker_pids)

MB = 1_000_000


def _rows_for(make, target_bytes: int) -> int:
    """Rows whose encoded body is about target_bytes (measured on a sample)."""
    sample = 1000
    _, body, _ = make(_digits(sample))
    return max(1, int(target_bytes * sample / len(body)))


def _digits(rows: int) -> np.ndarray:
    # Random floats, so text encodings are as long as real inputs' (not "3.0").
    return np.random.default_rng(0).random((rows, 64), dtype=np.float32) * 16


BIG_BODIES = [
    ("JSON", lambda: json_body(_digits(_rows_for(json_body, 40 * MB)))),
    ("CSV", lambda: csv_body(_digits(_rows_for(csv_body, 40 * MB)))),
    ("JSON Lines", lambda: jsonlines_body(_digits(_rows_for(jsonlines_body, 40 * MB)))),
    ("npy, JSON answer", lambda: npy_body(_digits(50 * MB // 256))),
    ("v2 binary, JSON answer", lambda: sagemaker_binary_body(_digits(50 * MB // 256), binary_out=False)),
    ("v2 binary, binary answer", lambda: sagemaker_binary_body(_digits(50 * MB // 256), binary_out=True)),
    # One binary message (.npy, a session's default binary type) in a WebSocket session.
    ("WebSocket npy message", lambda: (WEBSOCKET_PATH, npy_body(_digits(50 * MB // 256))[1], {})),
]
WEBSOCKET_PATH = "/invocations-bidirectional-stream"


def _ping_until(port: int, done: threading.Event, period: float) -> tuple[list[float], list[str]]:
    client = Client(port, timeout=30)
    timings, failures = [], []
    while not done.is_set():
        started = time.perf_counter()
        try:
            status, _ = client.request("GET", "/ping")
            if status != 200:
                failures.append(str(status))
        except (OSError, ConnectionError) as e:
            failures.append(type(e).__name__)
        elapsed = time.perf_counter() - started
        timings.append(elapsed * 1000)
        done.wait(max(0.0, period - elapsed))
    client.close()
    return timings, failures


def _send_big(port: int, path: str, body: bytes, headers: dict, results, done) -> None:
    started = time.perf_counter()
    result = {"answer_bytes": 0}
    if path == WEBSOCKET_PATH:
        result.update(_send_websocket_message(port, body))
    else:
        client = Client(port, timeout=300)
        try:
            result["status"], answer = client.request("POST", path, body, headers)
            result["answer_bytes"] = len(answer)
        except (OSError, ConnectionError) as e:
            result["status"] = f"{type(e).__name__}"
        client.close()
    result["seconds"] = time.perf_counter() - started
    results.put(result)
    done.set()


def _send_websocket_message(port: int, message: bytes) -> dict:
    """One message, its one answer; status 200 for an answer that is not an error."""
    from websockets.sync.client import connect

    try:
        with connect(f"ws://127.0.0.1:{port}{WEBSOCKET_PATH}", max_size=None, open_timeout=30) as ws:
            ws.send(message)
            answer = ws.recv(timeout=300)
    except Exception as e:  # noqa: BLE001 - reported in the table
        return {"status": type(e).__name__}
    failed = isinstance(answer, str) and answer.startswith('{"error"')
    return {"status": "error" if failed else 200, "answer_bytes": len(answer)}


def big_bodies(args) -> int:
    env = {"SMSERVE_MAX_REQUEST_MB": "400", "SMSERVE_BODY_TIMEOUT": "120", "SAGEMAKER_MODEL_SERVER_TIMEOUT": "300",
           "SMSERVE_LOG_LEVEL": "warning"}
    rows, bad = [], 0
    with ServerProcess(args.model_dir, env, log_path=_log("ping_stall")) as server:
        for name, make in BIG_BODIES:
            if args.only and not any(o.lower() == name.lower() for o in args.only):
                continue
            path, body, headers = make()
            # The big request goes from a process of its own: building and reading
            # tens of MB holds a Python client's GIL, which would delay the pinger's
            # requests and be blamed on the server.
            context = multiprocessing.get_context("fork")
            done = context.Event()
            results = context.SimpleQueue()
            sender = context.Process(target=_send_big, args=(server.port, path, body, headers, results, done))
            sender.start()
            pings, failures = _ping_until(server.port, done, 0.010)
            result = results.get()
            sender.join()
            bad += result["status"] != 200 or bool(failures)
            rows.append((name, len(body) / MB, result["status"], result["answer_bytes"] / MB,
                         result["seconds"], pct(pings, 50), pct(pings, 99), max(pings), len(pings), len(failures)))
    print(f"/ping every 10 ms while one big body is handled (1 worker, {os.cpu_count()} CPUs)")
    print(f"{'body':26} {'MB':>6} {'status':>6} {'ans MB':>7} {'req s':>6} {'ping p50':>9} {'p99':>7} "
          f"{'max ms':>7} {'pings':>6} {'failed':>6}")
    for r in rows:
        print(f"{r[0]:26} {r[1]:6.1f} {r[2]!s:>6} {r[3]:7.1f} {r[4]:6.2f} {r[5]:9.1f} {r[6]:7.1f} {r[7]:7.1f} "
              f"{r[8]:6d} {r[9]:6d}")
    return 1 if bad else 0


def slowloris(args) -> int:
    raise_fd_limit()
    n, deadline = args.slowloris, args.body_timeout
    env = {"SMSERVE_BODY_TIMEOUT": str(deadline), "SMSERVE_LOG_LEVEL": "warning"}
    head = (b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n[[1,2,3,4,")
    socks: list[socket.socket] = []
    with ServerProcess(args.model_dir, env, log_path=_log("slowloris")) as server:
        try:
            opened_at = time.monotonic()
            refused = 0
            for _ in range(n):
                try:
                    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
                    s.sendall(head)
                    socks.append(s)
                except OSError:
                    refused += 1
            open_s = time.monotonic() - opened_at
            client = Client(server.port, timeout=10)
            pings, failures = [], 0
            for _ in range(50):
                started = time.perf_counter()
                try:
                    status, _ = client.request("GET", "/ping")
                    failures += status != 200
                except (OSError, ConnectionError):
                    failures += 1
                pings.append((time.perf_counter() - started) * 1000)
                time.sleep(0.02)
            client.close()
            # Every stalled connection should be answered 408 (or closed) by its deadline.
            wait_until = opened_at + deadline + 3
            answered = Counter()
            pending = list(socks)
            while pending and time.monotonic() < wait_until + open_s:
                still = []
                for s in pending:
                    s.setblocking(False)
                    try:
                        data = s.recv(4096)
                        answered[data.split(b"\r\n", 1)[0].decode("latin-1", "replace") if data else "closed"] += 1
                    except BlockingIOError:
                        still.append(s)
                    except OSError as e:
                        answered[type(e).__name__] += 1
                pending = still
                time.sleep(0.1)
            closed_after = time.monotonic() - opened_at
        finally:
            for s in socks:
                s.close()
    print(f"body slowloris: {n} connections, head + 10 of 1000 body bytes, SMSERVE_BODY_TIMEOUT={deadline}")
    print(f"{'opened (refused)':34} {len(socks)} ({refused}) in {open_s:.1f} s")
    print(f"{'/ping p50 / max ms (50 pings)':34} {pct(pings, 50):.1f} / {max(pings):.1f}  failures {failures}")
    print(f"{'closed by the server':34} {sum(answered.values())} of {len(socks)} within {closed_after:.1f} s"
          f" of the first opening")
    for what, count in answered.most_common():
        print(f"{'':34}   {count:5d}  {what}")
    return 0 if failures == 0 and max(pings) < 2000 and sum(answered.values()) == len(socks) else 1


def kill_worker(args) -> int:
    env = {"SAGEMAKER_MODEL_SERVER_WORKERS": "2", "SMSERVE_LOG_LEVEL": "warning"}
    stop = threading.Event()
    lock = threading.Lock()
    outcomes: Counter = Counter()
    non_200: list[tuple[float, str]] = []
    timeline: list[tuple[float, str]] = []
    with ServerProcess(args.model_dir, env, log_path=_log("kill_worker")) as server:
        path, body, headers = json_body(np.random.default_rng(1).random((2, 64), dtype=np.float32) * 16)
        t0 = time.monotonic()

        def load(seed: int) -> None:
            client = Client(server.port, timeout=30)
            while not stop.is_set():
                try:
                    status, answer = client.request("POST", path, body, headers)
                    what = str(status)
                except (OSError, ConnectionError) as e:
                    what = f"{type(e).__name__}"
                with lock:
                    outcomes[what] += 1
                    if what != "200":
                        non_200.append((time.monotonic() - t0, what))
            client.close()

        def poll() -> None:
            while not stop.is_set():
                at = time.monotonic() - t0
                client = Client(server.port, timeout=2)  # a fresh connection, as SageMaker's checker
                try:
                    status, _ = client.request("GET", "/ping")
                    what = str(status)
                except socket.timeout:
                    what = "timeout"
                except (OSError, ConnectionError) as e:
                    what = type(e).__name__
                client.close()
                timeline.append((at, what))
                stop.wait(max(0.0, at + 0.1 - (time.monotonic() - t0)))

        threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(8)]
        threads.append(threading.Thread(target=poll, daemon=True))
        for t in threads:
            t.start()
        time.sleep(3)
        before = worker_pids(server.proc.pid)
        victim = before[0]
        killed_at = time.monotonic() - t0
        os.kill(victim, signal.SIGKILL)
        time.sleep(max(0.0, args.seconds - 3))
        stop.set()
        for t in threads:
            t.join(35)
        after = worker_pids(server.proc.pid)
    print(f"kill -9 of worker {victim} (of {before}) at {killed_at:.1f} s; workers after: {after}")
    print("client outcomes:", ", ".join(f"{k}: {v}" for k, v in outcomes.most_common()))
    if non_200:
        print(f"non-200 seen by clients: {len(non_200)}, from {non_200[0][0]:.1f} s to {non_200[-1][0]:.1f} s:",
              ", ".join(f"{k}: {v}" for k, v in Counter(w for _, w in non_200).most_common()))
    print("/ping timeline (every 100 ms, fresh connection, 2 s timeout):")
    print("  " + "; ".join(_runs(timeline)))
    return 0 if not non_200 and all(w == "200" for _, w in timeline) else 1


def _runs(timeline: list[tuple[float, str]]) -> list[str]:
    runs: list[list] = []
    for at, what in timeline:
        if runs and runs[-1][2] == what:
            runs[-1][1] = at
        else:
            runs.append([at, at, what])
    return [f"{a:.1f}-{b:.1f} s: {w}" for a, b, w in runs]


def _log(name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"bench_{name}_")) / "server.log"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=EXAMPLE_MODEL)
    parser.add_argument("--slowloris", type=int, metavar="N", help="N body-stalling connections")
    parser.add_argument("--body-timeout", type=float, default=5, help="SMSERVE_BODY_TIMEOUT for --slowloris")
    parser.add_argument("--kill-worker", action="store_true", help="kill -9 one of 2 workers under load")
    parser.add_argument("--seconds", type=float, default=30, help="--kill-worker: how long to watch")
    parser.add_argument("--only", action="append", metavar="BODY",
                        help="big bodies: just this one (repeatable), e.g. --only CSV --only JSON")
    args = parser.parse_args()
    if args.slowloris:
        return slowloris(args)
    if args.kill_worker:
        return kill_worker(args)
    return big_bodies(args)


if __name__ == "__main__":
    raise SystemExit(main())

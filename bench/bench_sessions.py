"""Requests in stateful sessions against the same requests without, on the same model.

    .venv/bin/python bench/bench_sessions.py [--seconds 6] [--rounds 2] [--sessions 16] [--workers 2]

The example digits model with session hooks that count each session's requests (its
input_fn then hands the body to the built-in JSON codec, so the model's work and the
answer are the same with a session and without), behind --workers workers. --sessions
clients (asyncio, in one process of their own) send one digit a request, one request at
a time each, each in a session of its own, or in none:

- kept alive: each client's connection lands on either worker; one whose session is
  held by the other is handed there by its first request and stays;
- new connection each request: with two workers about half the requests of a session
  land on the other worker and are handed over, every time.

Prints req/s, p50/p99 over every request, connections handed
over per request, the mean batch (requests of different sessions share passes) and
/ping's p99 (polled every 50 ms meanwhile), the cases' rounds alternating on one server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from local_test.server_process import EXAMPLE_MODEL, ServerProcess, copy_model  # noqa: E402
from tests.helpers.server import passes_and_records  # noqa: E402

from _harness import Pinger, digits, pct  # noqa: E402

SESSION = "X-Amzn-SageMaker-Session-Id"
COUNTING_HOOKS = '''
def open_session(context):
    return {"requests": 0}


def close_session(state, context):
    pass


def input_fn(body, content_type, context):
    if context.session is not None:
        context.session["requests"] += 1
    return NotImplemented  # the built-in codecs decode: the same work with a session and without
'''


def drive(port: int, body: bytes, sids: list[str | None], seconds: float, keepalive: bool, out) -> None:
    """One process of asyncio clients, one a session (None: no session): each sends one
    request at a time for `seconds`, on one kept-alive connection or a new one each
    request; puts (latencies in ms, statuses) on out. (16 hey processes of one client
    each, one a session, were 16 Go runtimes spinning beside the server on two cores:
    they starved it and the pings.)"""

    async def client(sid):
        head = (f"POST /invocations HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n" + (f"{SESSION}: {sid}\r\n" if sid else "")
                + ("" if keepalive else "Connection: close\r\n") + "\r\n").encode() + body
        latencies, statuses = [], {}
        reader = writer = None
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.perf_counter()
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head)
            status = int((await reader.readline()).split()[1])
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            latencies.append((time.perf_counter() - started) * 1000)
            statuses[status] = statuses.get(status, 0) + 1
            if not keepalive:
                writer.close()
                reader = writer = None
        if writer is not None:
            writer.close()
        return latencies, statuses

    async def everyone():
        return await asyncio.gather(*(client(sid) for sid in sids))

    results = asyncio.run(everyone())
    latencies = [ms for lat, _ in results for ms in lat]
    statuses: dict[int, int] = {}
    for _, counts in results:
        for code, n in counts.items():
            statuses[code] = statuses.get(code, 0) + n
    out.put((latencies, statuses))


def _metric(server, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(server.url + "/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def _settled(server) -> tuple[int, int, float]:
    """(passes, records, hand-overs) once every worker has written its counts (they do
    once a second)."""
    time.sleep(1.2)
    return (*passes_and_records(server, "digits"), _metric(server, "smserve_session_handoffs_total"))


def measure(server, body: bytes, args, sessions: list[str] | None, keepalive: bool) -> dict:
    before = _settled(server)
    results = multiprocessing.Queue()
    load = multiprocessing.Process(target=drive, args=(server.port, body, sessions or [None] * args.sessions,
                                                       args.seconds, keepalive, results))
    with Pinger(server.url + "/ping", period=0.05, timeout=10) as pinger:
        load.start()
        latencies, statuses = results.get(timeout=args.seconds + 120)
        load.join()
    bad = {code: n for code, n in statuses.items() if code != 200}
    if bad:
        sys.exit(f"answers other than 200: {bad}")
    after = _settled(server)
    records = after[1] - before[1]
    return {"rps": len(latencies) / args.seconds, "p50": pct(latencies, 50), "p99": pct(latencies, 99),
            "handoffs": (after[2] - before[2]) / max(records, 1), "batch": records / max(after[0] - before[0], 1),
            "ping_p99": pct(pinger.latencies, 99)}


def _open(url: str, body: bytes) -> str:
    opened = requests.post(url + "/invocations", data=body, timeout=30,
                           headers={"Content-Type": "application/json", SESSION: "NEW_SESSION", "Connection": "close"})
    opened.raise_for_status()
    return opened.headers["X-Amzn-SageMaker-New-Session-Id"].split(";")[0]


def _close(url: str, sid: str) -> None:
    requests.post(url + "/invocations", json={"requestType": "CLOSE"}, headers={SESSION: sid}, timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_sessions_"))
    model = copy_model(EXAMPLE_MODEL, work / "model", COUNTING_HOOKS)
    body = json.dumps({"instances": digits(1).tolist()}).encode()
    env = {"SAGEMAKER_MODEL_SERVER_WORKERS": str(args.workers), "SMSERVE_LOG_LEVEL": "warning",
           "SMSERVE_MAX_SESSIONS": str(max(64, args.sessions))}
    cases = [("stateless", False, True), ("sessions", True, True),
             ("stateless, new connections", False, False), ("sessions, new connections", True, False)]
    rows: dict[str, list[dict]] = {name: [] for name, _, _ in cases}
    with ServerProcess(model, env, log_path=work / "server.log") as server:
        # As many sessions held by each worker: the kernel picks who accepts each opening,
        # so they are opened several at once, and a worker's extra ones closed again.
        held: dict[str, list[str]] = {str(w): [] for w in range(args.workers)}
        share = -(-args.sessions // args.workers)
        while sum(min(len(ids), share) for ids in held.values()) < args.sessions:
            with ThreadPoolExecutor(8) as pool:
                for sid in pool.map(lambda _: _open(server.url, body), range(8)):
                    ids = held[sid.split("-")[0]]
                    ids.append(sid) if len(ids) < share else _close(server.url, sid)
        sessions = [sid for ids in held.values() for sid in ids][: args.sessions]
        workers = [f"{len(ids)} on worker {w}" for w, ids in held.items()]
        measure(server, body, argparse.Namespace(seconds=2, sessions=args.sessions), None, True)  # warm up
        for _ in range(args.rounds):
            for name, in_session, keepalive in cases:
                rows[name].append(measure(server, body, args, sessions if in_session else None, keepalive))
    print(f"\ndigits model, {args.workers} workers, {args.sessions} clients of one digit a request, "
          f"{args.seconds:g} s x {args.rounds} alternating rounds (medians); sessions {', '.join(workers)}")
    print(f"{'case':<28} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'handed over':>12} {'mean batch':>11} "
          f"{'/ping p99':>10}")
    medians = {}
    for name, results in rows.items():
        m = medians[name] = {key: statistics.median(r[key] for r in results) for key in results[0]}
        print(f"{name:<28} {m['rps']:>8.0f} {m['p50']:>8.2f} {m['p99']:>8.2f} {m['handoffs']:>11.1%} "
              f"{m['batch']:>11.2f} {m['ping_p99']:>8.1f}ms")
    for kind in ("", ", new connections"):
        with_s, without = medians[f"sessions{kind}"], medians[f"stateless{kind}"]
        print(f"sessions / stateless{kind or ', kept alive'}: req/s {with_s['rps'] / without['rps']:.2f}x, "
              f"p50 {with_s['p50'] / without['p50']:.2f}x")


if __name__ == "__main__":
    main()

"""Requests in stateful sessions against the same requests without, on the same model.

    .venv/bin/python bench/bench_sessions.py [--seconds 6] [--rounds 2] [--sessions 16] [--workers 2]

The example digits model with session hooks that count each session's requests (its
input_fn then hands the body to the built-in JSON codec, so the model's work and the
answer are the same with a session and without), behind --workers workers. --sessions
`hey` clients of one connection each (hey -c 1; apt-get install hey) send one digit a
request, each in a session of its own, or in none:

- kept alive: each client's connection lands on either worker; one whose session is
  held by the other is handed there by its first request and stays;
- new connection each request (hey -disable-keepalive): with two workers about half the
  requests of a session land on the other worker and are handed over, every time.

Prints req/s (the clients' sum), p50/p99 (the clients' median), connections handed
over per request, and the mean batch (requests of different sessions share passes),
the cases' rounds alternating on one server.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from local_test.server_process import EXAMPLE_MODEL, ServerProcess, copy_model  # noqa: E402
from tests.helpers.servers import passes_and_records  # noqa: E402

from _harness import digits  # noqa: E402

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


def hey(url: str, body: Path, seconds: float, headers: dict, keepalive: bool) -> subprocess.Popen:
    cmd = ["hey", "-z", f"{seconds}s", "-c", "1", "-m", "POST", "-T", "application/json", "-D", str(body)]
    for name, value in headers.items():
        cmd += ["-H", f"{name}: {value}"]
    if not keepalive:
        cmd.append("-disable-keepalive")
    return subprocess.Popen(cmd + [url + "/invocations"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _parsed(out: str) -> dict:
    import re

    statuses = {int(c): int(n) for c, n in re.findall(r"\[(\d{3})\]\s+(\d+) responses", out)}
    latency = {p: float(v) * 1000 for p, v in re.findall(r"(\d+)% in ([\d.]+) secs", out)}
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)), "statuses": statuses,
            "p50": latency.get("50", float("nan")), "p99": latency.get("99", float("nan"))}


def _metric(server, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(server.url + "/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def measure(server, body: Path, args, sessions: list[str] | None, keepalive: bool) -> dict:
    before_passes, before_records = passes_and_records(server, "digits")
    handoffs = _metric(server, "smserve_session_handoffs_total")
    clients = [hey(server.url, body, args.seconds, {SESSION: sid} if sid else {}, keepalive)
               for sid in (sessions or [None] * args.sessions)]
    results = [_parsed(client.communicate()[0]) for client in clients]
    bad = {code: n for r in results for code, n in r["statuses"].items() if code != 200}
    if bad:
        sys.exit(f"answers other than 200: {bad}")
    after_passes, after_records = passes_and_records(server, "digits")
    records = after_records - before_records
    return {"rps": sum(r["rps"] for r in results), "p50": statistics.median(r["p50"] for r in results),
            "p99": statistics.median(r["p99"] for r in results),
            "handoffs": (_metric(server, "smserve_session_handoffs_total") - handoffs) / max(records, 1),
            "batch": records / max(after_passes - before_passes, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if shutil.which("hey") is None:
        sys.exit("bench_sessions needs hey: apt-get install -y hey")
    work = Path(tempfile.mkdtemp(prefix="bench_sessions_"))
    model = copy_model(EXAMPLE_MODEL, work / "model", COUNTING_HOOKS)
    body = work / "digit.json"
    body.write_text(json.dumps({"instances": digits(1).tolist()}))
    env = {"SAGEMAKER_MODEL_SERVER_WORKERS": str(args.workers), "SMSERVE_LOG_LEVEL": "warning",
           "SMSERVE_MAX_SESSIONS": str(max(64, args.sessions))}
    cases = [("stateless", False, True), ("sessions", True, True),
             ("stateless, new connections", False, False), ("sessions, new connections", True, False)]
    rows: dict[str, list[dict]] = {name: [] for name, _, _ in cases}
    with ServerProcess(model, env, log_path=work / "server.log") as server:
        sessions = []
        for _ in range(args.sessions):
            opened = requests.post(server.url + "/invocations", data=body.read_bytes(), timeout=30,
                                   headers={"Content-Type": "application/json", SESSION: "NEW_SESSION",
                                            "Connection": "close"})
            opened.raise_for_status()
            sessions.append(opened.headers["X-Amzn-SageMaker-New-Session-Id"].split(";")[0])
        workers = sorted({sid.split("-")[0] for sid in sessions})
        measure(server, body, argparse.Namespace(seconds=2, sessions=args.sessions), None, True)  # warm up
        for _ in range(args.rounds):
            for name, in_session, keepalive in cases:
                rows[name].append(measure(server, body, args, sessions if in_session else None, keepalive))
    print(f"\ndigits model, {args.workers} workers, {args.sessions} clients (hey -c 1 each) of one digit a request, "
          f"{args.seconds:g} s x {args.rounds} alternating rounds (medians); sessions held by workers "
          f"{', '.join(workers)}")
    print(f"{'case':<28} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'handed over':>12} {'mean batch':>11}")
    medians = {}
    for name, results in rows.items():
        m = medians[name] = {key: statistics.median(r[key] for r in results) for key in results[0]}
        print(f"{name:<28} {m['rps']:>8.0f} {m['p50']:>8.2f} {m['p99']:>8.2f} {m['handoffs']:>11.1%} "
              f"{m['batch']:>11.2f}")
    for kind in ("", ", new connections"):
        with_s, without = medians[f"sessions{kind}"], medians[f"stateless{kind}"]
        print(f"sessions / stateless{kind or ', kept alive'}: req/s {with_s['rps'] / without['rps']:.2f}x, "
              f"p50 {with_s['p50'] / without['p50']:.2f}x")


if __name__ == "__main__":
    main()

"""Real-time load: what dynamic batching buys, and /ping latency under saturation.

    .venv/bin/python bench/bench_load.py [--seconds 10] [--concurrency 16]

Starts the example model twice, with dynamic batching (the model's max batch size)
and without it (SMSERVE_MAX_BATCH_SIZE=1), drives each with `hey` (apt-get install
hey) sending one digit per request, and meanwhile pings /ping one at a time. Prints
requests/s, request latency, ping latency and the ratios between the two runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from sklearn.datasets import load_digits

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from local_test.server_process import ServerProcess  # noqa: E402

from _harness import Pinger, pct, run_hey  # noqa: E402


def hey(url: str, body: Path, seconds: int, concurrency: int) -> dict:
    out = run_hey(url + "/invocations", body, {"Content-Type": "application/json"}, seconds, concurrency)
    return {"rps": out["rps"], "p50": out["latency"].get("50"), "p99": out["latency"].get("99"),
            "statuses": out["statuses"]}


def run(model_dir: Path, env: dict, body: Path, args, log: Path) -> dict:
    # `with` starts it and stops it, whatever happens in between (or while it starts).
    with ServerProcess(model_dir, {"SMSERVE_LOG_LEVEL": "warning", "SMSERVE_TORCH_THREADS": "", **env},
                       log_path=log) as server:
        hey(server.url, body, 2, args.concurrency)  # warm up
        with Pinger(server.url + "/ping", period=0.02, timeout=10) as pinger:
            result = hey(server.url, body, args.seconds, args.concurrency)
    pings = pinger.latencies
    result["ping_p50"] = pct(pings, 50)
    result["ping_p99"] = pct(pings, 99)
    result["ping_max"] = max(pings, default=float("nan"))
    result["ping_failures"] = pinger.failures
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=ROOT / "build" / "model")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    if shutil.which("hey") is None:
        sys.exit("bench_load needs hey: apt-get install -y hey")

    work = Path(tempfile.mkdtemp(prefix="bench_load_"))
    body = work / "one-digit.json"
    body.write_text(json.dumps({"instances": load_digits().data[:1].tolist()}))
    runs = {
        "dynamic batching": run(args.model_dir, {}, body, args, work / "batched.log"),
        "no batching (max 1)": run(args.model_dir, {"SMSERVE_MAX_BATCH_SIZE": "1"}, body, args, work / "single.log"),
    }
    print(f"one digit per request, {args.concurrency} clients for {args.seconds}s, one worker")
    print(f"{'mode':22} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'ping p50':>9} {'ping p99':>9} {'ping max':>9}  statuses")
    for name, r in runs.items():
        print(f"{name:22} {r['rps']:8.0f} {r['p50']:8.1f} {r['p99']:8.1f} "
              f"{r['ping_p50']:9.1f} {r['ping_p99']:9.1f} {r['ping_max']:9.1f}  {r['statuses']}"
              + (f"; {r['ping_failures']} pings failed" if r["ping_failures"] else ""))
    batched, single = runs.values()
    print(f"dynamic batching / none: {batched['rps'] / single['rps']:.2f}x requests/s")


if __name__ == "__main__":
    main()

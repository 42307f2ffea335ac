"""MULTI_RECORD against SINGLE_RECORD: what packing records into mini-batches buys.

    .venv/bin/python bench/bench_batch.py                 # starts the server itself
    .venv/bin/python bench/bench_batch.py --url http://localhost:8080   # a running one

Sends the same CSV records (the digits data set, repeated to --records) through the
local batch-transform runner twice, with the same concurrency: as 6 MB MULTI_RECORD
mini-batches, then one record per request. Prints records/s for each and the ratio.
The server must run with SAGEMAKER_BATCH=true (the one started here does).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from local_test import batch_transform as bt  # noqa: E402
from local_test.server_process import ServerProcess  # noqa: E402


def start_server(model_dir: Path, payload_mb: int, log_path: Path) -> ServerProcess:
    env = {
        "SAGEMAKER_BATCH": "true",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": str(payload_mb),
        "SMSERVE_LOG_LEVEL": "warning",  # an access line per request would cost the single-record run
        "SMSERVE_TORCH_THREADS": "",  # the server's own default, not the tests' one thread
    }
    return ServerProcess(model_dir, env, log_path=log_path)


def write_records(path: Path, count: int) -> int:
    x = load_digits().data
    rows = [",".join("%g" % v for v in row) for row in x]
    lines = [rows[i % len(rows)] for i in range(count)]
    path.write_text("\n".join(lines) + "\n")
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server in batch mode (default: start one)")
    parser.add_argument("--model-dir", type=Path, default=ROOT / "build" / "model")
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, help="default: the server's MaxConcurrentTransforms")
    parser.add_argument("--payload-mb", type=int, default=6)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench_batch_"))
    process = None
    try:
        if args.url:
            url = args.url
        else:
            # Inside the try: a server that fails to start is stopped by ServerProcess
            # itself, one that started is stopped by the finally below.
            process = start_server(args.model_dir, args.payload_mb, work / "server.log")
            process.start()
            url = process.url
        params = bt.fetch_execution_parameters(url)
        concurrency = args.concurrency or int(params.get("MaxConcurrentTransforms", 1))
        source = work / "digits.csv"
        size = write_records(source, args.records)
        base = dict(url=url, content_type="text/csv", accept="text/csv", max_concurrent_transforms=concurrency)
        runs = [
            ("MULTI_RECORD", bt.JobConfig(batch_strategy="MULTI_RECORD", max_payload_mb=args.payload_mb, **base)),
            ("SINGLE_RECORD", bt.JobConfig(batch_strategy="SINGLE_RECORD", max_payload_mb=args.payload_mb, **base)),
        ]
        # Warm up both paths (connections, the model's first shapes) before timing.
        warm = work / "warm.csv"
        write_records(warm, 64)
        for name, config in runs:
            bt.run_job(warm, work / f"warm-{name}", config, progress=False)

        results = {}
        for name, config in runs:
            result = bt.run_job(source, work / name, config, progress=False)
            if result.failures:
                sys.exit(f"{name}: {len(result.failures)} mini-batches failed: {result.failures[0].message}")
            results[name] = result
        # Same input, same model: the two runs' outputs must agree before speed means anything.
        multi = np.loadtxt(work / "MULTI_RECORD" / "digits.csv.out", delimiter=",")
        single = np.loadtxt(work / "SINGLE_RECORD" / "digits.csv.out", delimiter=",")
        if multi.shape != (args.records, 10) or not np.allclose(multi, single, rtol=1e-4, atol=1e-6):
            sys.exit("MULTI_RECORD and SINGLE_RECORD outputs differ")
    finally:
        if process is not None:
            process.terminate()

    print(f"\n{args.records} digits records ({size / 1024:.0f} KiB of CSV), concurrency {concurrency}, {url}")
    print(f"{'strategy':<14} {'requests':>9} {'seconds':>8} {'records/s':>10}")
    for name, result in results.items():
        print(f"{name:<14} {result.requests:>9} {result.seconds:>8.2f} {result.records_per_second:>10.0f}")
    ratio = results["MULTI_RECORD"].records_per_second / results["SINGLE_RECORD"].records_per_second
    print(f"MULTI_RECORD / SINGLE_RECORD: {ratio:.1f}x")


if __name__ == "__main__":
    main()

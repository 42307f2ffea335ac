r"""Our server on a GPU: throughput and latency by batch size, with and without autocast.

    bash bench/gpu.sh                    (the same as .venv/bin/python bench/bench_gpu.py)
    .venv/bin/python bench/bench_gpu.py [--seconds 5] [--quick] [--models mlp,conv]
        [--batches 1,64,256] [--autocast off,fp16,bf16] [--compile MODE] [--concurrency 16]

Builds two models with torch.export (dynamic batch dimension, metadata.json with max
batch 256) into a temporary folder:
  - mlp:  64 -> 3072 -> 3072 -> 16 (ReLU), about 9.7 M multiply-adds a row: the matmul
          units and the host-to-device copy dominate;
  - conv: 3x32x32 images, conv 3->64 -> conv 64->128 (stride 2) -> conv 128->128
          (stride 2) -> mean -> linear 128->10: many small kernels, launch-bound at small batches.
For each model and autocast setting (SMSERVE_AUTOCAST), starts the real server
(container/serve: gunicorn, our gevent worker, one worker on cuda:0, or on the CPU
with its torch threads on every core) and, for each batch size, sends KServe v2 binary
requests of that many rows to /v2/models/NAME/infer with `hey` at --concurrency for
--seconds (without hey: a Python client of as many threads). Requests of one row are
batched by the server (up to 256 rows a pass); larger ones run one a pass.

Each case is first answered once and compared with the fp32 model run in this process
(max|err| column: autocast's error). Memory: on a GPU, the worker's largest
`nvidia-smi` reading during the case (the CUDA context and the caching allocator's
reserve included) and the worker's torch.cuda.max_memory_allocated after warm-up (from
its log); on the CPU, the worker's resident set size.

Without a GPU it runs the same cases on the CPU, says so, and shortens each case to
2 s (--quick does that anywhere). A GPU run of the defaults takes 3 to 4 minutes:
2 models x 3 precisions x 3 batch sizes x 5 s, plus 6 server starts.
Prints one table; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _harness import Client, pct, rss_mb, run_hey, worker_pids  # noqa: E402
from local_test.server_process import ServerProcess  # noqa: E402

MAX_BATCH = 256
IHCL = "Inference-Header-Content-Length"


# ---------------------------------------------------------------- models


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, 3072), torch.nn.ReLU(),
            torch.nn.Linear(3072, 3072), torch.nn.ReLU(),
            torch.nn.Linear(3072, 16),
        )

    def forward(self, x):
        return self.net(x)


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(64, 128, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(128, 128, 3, stride=2, padding=1), torch.nn.ReLU(),
        )
        self.head = torch.nn.Linear(128, 10)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


MODELS = {
    # name: (module class, one row's shape, output width)
    "mlp": (MLP, (64,), 16),
    "conv": (ConvNet, (3, 32, 32), 10),
}


def build(name: str, folder: Path) -> torch.nn.Module:
    """model.pt2 (dynamic batch) and metadata.json in folder/name; the fp32 module back."""
    cls, row, width = MODELS[name]
    torch.manual_seed(0)
    model = cls().eval()
    model_dir = folder / name
    model_dir.mkdir(parents=True)
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH * 64)
    program = torch.export.export(model, (torch.randn(2, *row),), dynamic_shapes=({0: batch},))
    torch.export.save(program, model_dir / "model.pt2")
    (model_dir / "metadata.json").write_text(json.dumps({
        "name": name, "platform": "pytorch_torchexport", "max_batch_size": MAX_BATCH,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": list(row)}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [width]}],
    }))
    return model


# ---------------------------------------------------------------- requests


def v2_body(x: np.ndarray) -> tuple[bytes, dict]:
    header = json.dumps({
        "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }).encode()
    return header + x.tobytes(), {"Content-Type": "application/octet-stream", IHCL: str(len(header))}


def v2_answer(body: bytes, header_length: int) -> np.ndarray:
    header = json.loads(body[:header_length])
    out = header["outputs"][0]
    assert out["datatype"] == "FP32", out
    return np.frombuffer(body[header_length:], np.float32).reshape(out["shape"])


def ask(url: str, body: bytes, headers: dict) -> np.ndarray:
    import requests

    response = requests.post(url, data=body, headers=headers, timeout=120)
    if response.status_code != 200:
        raise RuntimeError(f"{response.status_code}: {response.text[:300]}")
    return v2_answer(response.content, int(response.headers[IHCL]))


def drive_hey(url: str, body: bytes, headers: dict, seconds: float, concurrency: int, work: Path) -> dict:
    path = work / "body.bin"
    path.write_bytes(body)
    out = run_hey(url, path, headers, seconds, concurrency)
    # hey prints 0 for the percentiles its few samples cannot give: the average and the
    # slowest then.
    latency = {p: ms for p, ms in out["latency"].items() if ms > 0}
    ok = out["statuses"].get(200, 0)
    return {"ok": ok, "elapsed": out["elapsed"],
            "p50": latency.get("50", out["average"] * 1000 if out["average"] and ok else float("nan")),
            "p99": latency.get("99", out["slowest"] * 1000 if out["slowest"] and ok else float("nan")),
            "failed": sum(out["statuses"].values()) - ok + out["errors"]}


def drive_python(port: int, path: str, body: bytes, headers: dict, seconds: float, concurrency: int) -> dict:
    """hey's job in threads, one kept-alive connection each (slower than hey: it shares the GIL)."""
    latencies: list[float] = []
    failed = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client():
        conn = Client(port, timeout=120)
        mine, bad = [], 0
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                status, _ = conn.request("POST", path, body, headers)
            except OSError:
                status = 0
            if status == 200:
                mine.append(time.monotonic() - started)
            else:
                bad += 1
        conn.close()
        with lock:
            latencies.extend(mine)
            failed[0] += bad

    started = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ms = [s * 1000 for s in latencies]
    return {"ok": len(latencies), "elapsed": time.monotonic() - started,
            "p50": pct(ms, 50), "p99": pct(ms, 99), "failed": failed[0]}


# ---------------------------------------------------------------- memory


class MemoryWatch:
    """The worker's largest memory reading while a case runs: nvidia-smi's per-process
    use on a GPU host, else the resident set size."""

    def __init__(self, pids: list[int], gpu: bool):
        self.pids, self.gpu = pids, gpu and shutil.which("nvidia-smi") is not None
        self.peak = float("nan")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "MemoryWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _read(self) -> float:
        if self.gpu:
            out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True).stdout
            used = [float(m) for p, m in (line.split(",") for line in out.splitlines() if "," in line)
                    if int(p) in self.pids]
            if used:
                return sum(used)
            # In a container nvidia-smi may show host pids, or none: the whole GPU 0 then.
            out = subprocess.run(["nvidia-smi", "--id=0", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True).stdout.strip()
            return float(out) if out.replace(".", "", 1).isdigit() else float("nan")
        return sum(rss_mb(p) for p in self.pids)

    def _watch(self) -> None:
        while True:
            try:
                value = self._read()
            except (OSError, ValueError):  # "[N/A]" (MIG, some containers), or no reading this time
                value = float("nan")
            if value == value:
                self.peak = value if self.peak != self.peak else max(self.peak, value)
            if self._stop.wait(0.5):
                return


# ---------------------------------------------------------------- the run


def server_env(autocast: str, compile_mode: str, cuda: bool) -> dict:
    env = {"SMSERVE_AUTOCAST": autocast, "SMSERVE_COMPILE": compile_mode, "SMSERVE_LOG_LEVEL": "info",
           "SMSERVE_DEVICE": "cuda" if cuda else "cpu"}
    if not cuda:
        env["SMSERVE_TORCH_THREADS"] = str(os.cpu_count() or 1)
    return env


def run(args) -> list[dict]:
    cuda = torch.cuda.is_available()
    use_hey = args.client == "hey"
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_gpu-") as tmp:
        work = Path(tmp)
        for name in args.models:
            model = build(name, work / "models")
            _, row, _ = MODELS[name]
            rng = np.random.default_rng(0)
            inputs = {b: rng.standard_normal((b, *row)).astype(np.float32) for b in args.batches}
            with torch.no_grad():
                expected = {b: model(torch.from_numpy(x)).numpy() for b, x in inputs.items()}
            variants = [(a, "off") for a in args.autocast] + ([("off", args.compile)] if args.compile else [])
            for autocast, compile_mode in variants:
                log_path = work / f"{name}-{autocast}-{compile_mode}.log"
                server = ServerProcess(work / "models" / name, server_env(autocast, compile_mode, cuda), log_path=log_path)
                started = time.monotonic()
                server.start(timeout=600)
                start_s = time.monotonic() - started
                log = server.log()
                peak = re.search(r"peak GPU memory (\d+) MiB", log)
                compiled = re.search(r"compile ([\w-]+)\)", log)
                pids = worker_pids(server.proc.pid)
                try:
                    for b in args.batches:
                        body, headers = v2_body(inputs[b])
                        url = f"{server.url}/v2/models/{name}/infer"
                        error = float(np.abs(ask(url, body, headers) - expected[b]).max())
                        with MemoryWatch(pids, cuda) as memory:
                            if use_hey:
                                result = drive_hey(url, body, headers, args.seconds, args.concurrency, work)
                            else:
                                result = drive_python(server.port, f"/v2/models/{name}/infer", body, headers,
                                                      args.seconds, args.concurrency)
                        rps = result["ok"] / result["elapsed"] if result["elapsed"] else float("nan")
                        rows.append({
                            "n": result["ok"], "model": name, "precision": autocast if compile_mode == "off" else f"compile {compile_mode}",
                            "batch": b, "req/s": rps, "rows/s": rps * b, "p50": result["p50"], "p99": result["p99"],
                            "failed": result["failed"], "err": error, "mem": memory.peak,
                            "alloc": float(peak.group(1)) if peak else float("nan"), "start": start_s,
                            "compiled": compiled.group(1) if compiled else "?",
                        })
                        print(f"  {name:5} {rows[-1]['precision']:>8} batch {b:4}: {rps:8.1f} req/s, "
                              f"p50 {result['p50']:.1f} ms", file=sys.stderr, flush=True)
                finally:
                    server.terminate()
    return rows


def report(rows: list[dict], args, cuda: bool, use_hey: bool) -> None:
    if cuda:
        device = f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}"
        memory = "mem MiB: the worker's peak nvidia-smi use; alloc MiB: its max_memory_allocated after warm-up"
    else:
        device = (f"no CUDA device: a CPU run ({os.cpu_count()} cores, torch {torch.__version__}); "
                  "the numbers say nothing about a GPU")
        memory = "mem MiB: the worker's peak resident set size"
    client = "hey" if use_hey else "a Python client"
    print()
    print(f"bench_gpu: {device}")
    print(f"one worker; v2 binary requests of `batch` rows; {client} at concurrency {args.concurrency}, "
          f"{args.seconds:g} s a case (answers: 200s in it; failed: other answers, and client timeouts{' (hey: 20 s)' if use_hey else ''}); {memory}")
    header = (f"{'model':6} {'precision':>16} {'batch':>5} {'answers':>7} {'req/s':>9} {'rows/s':>10} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'failed':>6} {'max|err|':>9} {'mem MiB':>8} {'alloc MiB':>9} {'start s':>7}")
    print(header)
    print("-" * len(header))
    for r in rows:
        alloc = f"{r['alloc']:9.0f}" if r["alloc"] == r["alloc"] else f"{'-':>9}"
        mem = f"{r['mem']:8.0f}" if r["mem"] == r["mem"] else f"{'-':>8}"
        precision = r["precision"] + ("" if r["compiled"] in ("off", r["precision"].split()[-1]) else f" ({r['compiled']})")
        print(f"{r['model']:6} {precision:>16} {r['batch']:5d} {r['n']:7d} {r['req/s']:9.2f} {r['rows/s']:10.0f} {r['p50']:8.1f} "
              f"{r['p99']:8.1f} {r['failed']:6d} {r['err']:9.1e} {mem} {alloc} {r['start']:7.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=None, help="load per case (default 5; 2 with --quick or no GPU)")
    parser.add_argument("--quick", action="store_true", help="2 s a case (the default without a GPU)")
    parser.add_argument("--models", default="mlp,conv", help="of: " + ",".join(MODELS))
    parser.add_argument("--batches", default="1,64,256", help="rows per request, each at most 256")
    parser.add_argument("--autocast", default="off,fp16,bf16", help="SMSERVE_AUTOCAST values to run")
    parser.add_argument("--compile", default="", help="also run SMSERVE_COMPILE=MODE (autocast off), e.g. default")
    parser.add_argument("--client", choices=("hey", "python"), default=None,
                        help="what sends the load (default: hey where it is installed)")
    parser.add_argument("--concurrency", type=int, default=None, help="requests in flight (default 16; 4 on the CPU)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if args.seconds is None:
        args.seconds = 2.0 if args.quick or not cuda else 5.0
    if args.client is None:
        args.client = "hey" if shutil.which("hey") else "python"
    if args.concurrency is None:
        # On a CPU a half-precision pass can take seconds: 16 in flight would only queue.
        args.concurrency = 16 if cuda else 4
    args.models = [m for m in args.models.split(",") if m]
    args.batches = [int(b) for b in args.batches.split(",") if b]
    args.autocast = [a for a in args.autocast.split(",") if a]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown or any(not 1 <= b <= MAX_BATCH for b in args.batches):
        parser.error(f"models are {', '.join(MODELS)}; batches 1..{MAX_BATCH}")
    if not cuda:
        print(f"bench_gpu: torch sees no CUDA device: running on the CPU, {args.seconds:g} s a case", file=sys.stderr)
    rows = run(args)
    report(rows, args, cuda, args.client == "hey")


if __name__ == "__main__":
    main()

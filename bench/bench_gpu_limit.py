r"""Served against the model's own limit: a ResNet-50-sized model through /invocations
against the same model in a loop of torch alone, on the same device.

    .venv/bin/python bench/bench_gpu_limit.py [--batches 8,16,32,64] [--seconds 8] [--concurrency 64]
        [--size 224] [--autocast fp16] [--quick]

The model: a ResNet-50 (bottleneck blocks 3-4-6-3, 25.6 M parameters, ~4.1 G
multiply-adds an image at 224 x 224) in plain torch, random weights, exported with a
dynamic batch dimension (torch.export) into a temporary folder.

- offline: the exported module in this process, on the device, under torch.autocast
  (--autocast, fp16 by default), fed one batch after another of random images already
  on the device: images/s at each batch size, the model's own limit there;
- served: the real server (container/serve, one worker) with SMSERVE_AUTOCAST and
  SMSERVE_MAX_BATCH_SIZE set to the batch size, --concurrency `hey` clients each
  sending one image a request as .npy (float32, [1, 3, size, size]); the server
  gathers them into passes. images/s = requests/s.

served / offline at each batch size is the figure (issue 39 asks >= 0.8 at the best);
the table names the device, torch and CUDA. Without a GPU it runs on the CPU at 64 x
64 pixels, batches 4 and 8, 3 s a case, and says so (--quick does that anywhere): a
check that the script works, not a figure. Needs `hey` (apt-get install hey).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _harness import run_hey  # noqa: E402
from local_test.server_process import ServerProcess  # noqa: E402
from tests.helpers.server import passes_and_records  # noqa: E402

BLOCKS = (3, 4, 6, 3)  # ResNet-50's bottleneck blocks per stage
WIDTHS = (64, 128, 256, 512)
EXPANSION = 4


class Bottleneck(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int):
        super().__init__()
        out = planes * EXPANSION
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.down = None
        if stride != 1 or inplanes != out:
            self.down = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet50(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, inplanes = [], 64
        for i, (blocks, planes) in enumerate(zip(BLOCKS, WIDTHS)):
            for b in range(blocks):
                layers.append(Bottleneck(inplanes, planes, 2 if b == 0 and i > 0 else 1))
                inplanes = planes * EXPANSION
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(inplanes, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.layers(self.stem(x)).mean((2, 3)))


def build(folder: Path, size: int, max_batch: int) -> Path:
    torch.manual_seed(0)
    model = ResNet50().eval()
    batch = torch.export.Dim("batch", min=1, max=4096)
    program = torch.export.export(model, (torch.zeros(2, 3, size, size),), dynamic_shapes=({0: batch},))
    folder.mkdir(parents=True)
    torch.export.save(program, str(folder / "model.pt2"))
    (folder / "metadata.json").write_text(json.dumps({
        "name": "resnet50", "max_batch_size": max_batch,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [3, size, size]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [1000]}]}))
    return folder


def offline(folder: Path, device: torch.device, size: int, batch: int, seconds: float, autocast: str) -> float:
    """Images/s of the model alone at this batch size: inputs already on the device."""
    module = torch.export.load(str(folder / "model.pt2")).module().to(device)
    x = torch.randn(batch, 3, size, size, device=device)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(autocast)

    def run():
        with torch.inference_mode(), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            return module(x)

    for _ in range(3):
        run()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        run()
        done += batch
    sync()
    return done / (time.perf_counter() - started)


def served(folder: Path, body: Path, size: int, batch: int, args) -> dict:
    env = {"SMSERVE_AUTOCAST": args.autocast, "SMSERVE_MAX_BATCH_SIZE": str(batch), "SMSERVE_LOG_LEVEL": "warning",
           "SMSERVE_TORCH_THREADS": ""}
    with ServerProcess(folder, env) as server:
        url = server.url + "/invocations"
        headers = {"Content-Type": "application/x-npy"}
        run_hey(url, body, headers, 2, args.concurrency)  # warm: the first passes allocate
        before = passes_and_records(server, "resnet50")
        out = run_hey(url, body, headers, args.seconds, args.concurrency)
        after = passes_and_records(server, "resnet50")
    if set(out["statuses"]) != {200} or out["errors"]:
        raise SystemExit(f"answers other than 200: {out['statuses']}, connection errors {out['errors']}")
    passes, records = after[0] - before[0], after[1] - before[1]
    return {"rps": out["rps"], "batch": records / max(passes, 1), "p50": out["latency"].get("50", float("nan")),
            "p99": out["latency"].get("99", float("nan"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="8,16,32,64")
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--autocast", default="fp16", choices=("off", "fp16", "bf16"))
    parser.add_argument("--quick", action="store_true", help="CPU-sized: 64 x 64, batches 4 and 8, 3 s a case")
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    if args.quick or not gpu:
        args.size, args.batches, args.seconds, args.concurrency = 64, "4,8", 3.0, 16
        if not gpu:
            args.autocast = "off"  # CPU autocast is bf16 only, and slow on most CPUs: a check, not a figure
            print("no GPU: running on the CPU at 64 x 64 to check the script; its figures say nothing of a GPU",
                  file=sys.stderr)
    batches = [int(b) for b in args.batches.split(",")]
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    work = Path(tempfile.mkdtemp(prefix="bench_gpu_limit_"))
    folder = build(work / "resnet50", args.size, max(batches))
    body = work / "image.npy"
    buffer = io.BytesIO()
    np.save(buffer, np.random.default_rng(0).standard_normal((1, 3, args.size, args.size), dtype=np.float32))
    body.write_bytes(buffer.getvalue())

    rows = []
    for batch in batches:
        alone = statistics.median(offline(folder, device, args.size, batch, args.seconds / 2, args.autocast)
                                  for _ in range(2))
        if gpu:
            torch.cuda.empty_cache()
        through = served(folder, body, args.size, batch, args)
        rows.append((batch, alone, through))

    name = torch.cuda.get_device_name(0) if gpu else "CPU"
    print(f"\nResNet-50 ({args.size} x {args.size}, random weights), autocast {args.autocast}, on {name}; torch "
          f"{torch.__version__}, CUDA {torch.version.cuda or '-'}; served: one worker, hey -c {args.concurrency}, one "
          f"image a request (.npy), {args.seconds:g} s a case")
    print(f"{'batch':>6} {'offline img/s':>14} {'served img/s':>13} {'served/offline':>15} {'mean pass':>10} "
          f"{'p50 ms':>8} {'p99 ms':>8}")
    for batch, alone, through in rows:
        print(f"{batch:>6} {alone:>14.0f} {through['rps']:>13.0f} {through['rps'] / alone:>15.2f} "
              f"{through['batch']:>10.1f} {through['p50']:>8.1f} {through['p99']:>8.1f}")
    best = max(rows, key=lambda r: r[2]["rps"] / r[1])
    print(f"best: batch {best[0]}, served / offline {best[2]['rps'] / best[1]:.2f}")


if __name__ == "__main__":
    main()

"""An image model fed JPEG through its input_fn, against the same model fed prepared pixels.

    .venv/bin/python bench/bench_image.py [--size 224] [--seconds 8] [--rounds 2] [--concurrency 16]
                                          [--torch-threads 1] [--baseline GIT-REF] [--model-dir build/image]
                                          [--hook-processes N]

The image example (model/image: ResNet-18, random weights) behind one worker, driven by
`hey` (apt-get install hey) with --concurrency clients each sending one image a request.
One torch thread by default: on a two-core host that shares its cores with hey (and,
here, other work), a pass on two OpenMP threads waits on a preempted partner, and the
rates swing 3x between runs.

- jpeg: a 640 x 480 photo-like JPEG (~40 KB), read by the example's input_fn (Pillow,
  resized to --size) and answered by its output_fn (top-3 labels);
- npy:  the same image already prepared, [1, 3, size, size] float32 as .npy, through
  the built-in codec (the input_fn hands .npy back) and the same output_fn.

Each case's passes and records come from /metrics before and after: their ratio is the
mean batch size, the figure issue 32 is about (input_fn used to turn batching off).
Rounds alternate the cases on one server, so the machine's drift falls on both alike.
/ping is polled every 50 ms meanwhile. --baseline REF serves REF's container/ too (its
`serve`, same model, the JPEG case: before issue 32 an input_fn could not hand .npy to
the built-in codecs), for a before/after in one run. --hook-processes N adds the JPEG
case on a server whose input_fn and output_fn run in N processes of their own
(SMSERVE_HOOK_PROCESSES), against the hook threads.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from local_test.server_process import ServerProcess  # noqa: E402
from tests.helpers.server import passes_and_records  # noqa: E402

from _harness import Pinger, checkout, pct, run_hey  # noqa: E402

PING_PERIOD_S = 0.05


def photo_jpeg(width: int = 640, height: int = 480, seed: int = 0) -> bytes:
    """Smooth gradients and a little noise: compresses like a photo (tens of KB), not
    like pure noise (hundreds)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    channels = [np.sin(x / (37 + 11 * c)) * 80 + np.cos(y / (23 + 7 * c)) * 80 + 128 for c in range(3)]
    pixels = np.stack(channels, axis=-1) + rng.normal(0, 6, (height, width, 3))
    out = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def prepared_npy(model_dir: Path, jpeg: bytes) -> bytes:
    """The JPEG as the example's input_fn makes it, saved as .npy: what a client that
    prepares its pixels itself would send."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_image_hooks", model_dir / "code" / "inference.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    out = io.BytesIO()
    np.save(out, hooks.input_fn(jpeg, "image/jpeg").numpy())
    return out.getvalue()


def measure(server: ServerProcess, body: Path, content_type: str, args) -> dict:
    before = passes_and_records(server, "image")
    with Pinger(server.url + "/ping", period=PING_PERIOD_S, timeout=10) as pinger:
        out = run_hey(server.url + "/invocations", body, {"Content-Type": content_type}, args.seconds,
                      args.concurrency)
    after = passes_and_records(server, "image")
    passes, records = after[0] - before[0], after[1] - before[1]
    bad = {code: n for code, n in out["statuses"].items() if code != 200}
    if bad or out["errors"]:
        sys.exit(f"{content_type}: answers other than 200: {bad}, connection errors {out['errors']}")
    return {"rps": out["rps"], "batch": records / max(passes, 1), "p50": out["latency"].get("50", float("nan")),
            "p99": out["latency"].get("99", float("nan")), "ping_p99": pct(pinger.latencies, 99),
            "ping_failures": pinger.failures}


def run_server(label: str, model_dir: Path, serve: Path | None, bodies: dict, args, work: Path,
               extra_env: dict | None = None) -> dict:
    env = {"SMSERVE_LOG_LEVEL": "warning", "SMSERVE_TORCH_THREADS": str(args.torch_threads or ""), **(extra_env or {})}
    rows: dict[str, list[dict]] = {case: [] for case in bodies}
    with ServerProcess(model_dir, env, log_path=work / f"{label}.log", serve=serve) as server:
        for path, content_type in bodies.values():  # warm up: the first passes allocate
            run_hey(server.url + "/invocations", path, {"Content-Type": content_type}, 2, args.concurrency)
        for _ in range(args.rounds):
            for case, (path, content_type) in bodies.items():
                rows[case].append(measure(server, path, content_type, args))
    return {case: {key: statistics.median(r[key] for r in results) for key in results[0]}
            for case, results in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=224, help="the model's image side (default 224)")
    parser.add_argument("--model-dir", type=Path, help="an image example already built (default: build one)")
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="SMSERVE_TORCH_THREADS (default 1; 0: the server's own choice, the cores)")
    parser.add_argument("--baseline", metavar="GIT-REF", help="also serve container/ as it was at this commit")
    parser.add_argument("--hook-processes", type=int, default=0, metavar="N",
                        help="also serve JPEG with SMSERVE_HOOK_PROCESSES=N")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench_image_"))
    model_dir = args.model_dir
    if model_dir is None:
        from model.image.build import build

        model_dir = Path(build(str(work), size=args.size))
    size = int(np.load(io.BytesIO(prepared_npy(model_dir, photo_jpeg()))).shape[-1])
    jpeg = photo_jpeg()
    (work / "photo.jpg").write_bytes(jpeg)
    (work / "pixels.npy").write_bytes(prepared_npy(model_dir, jpeg))
    bodies = {"jpeg": (work / "photo.jpg", "image/jpeg"), "npy": (work / "pixels.npy", "application/x-npy")}

    results = {"this tree": run_server("this-tree", model_dir, None, bodies, args, work)}
    if args.baseline:
        # Only JPEG: before issue 32 an input_fn could not hand .npy back to the built-in codecs.
        label = args.baseline[:10]
        results[label] = run_server(label, model_dir, checkout(args.baseline, work), {"jpeg": bodies["jpeg"]}, args,
                                    work)
    if args.hook_processes:
        label = f"processes {args.hook_processes}"
        results[label] = run_server("processes", model_dir, None, {"jpeg": bodies["jpeg"]}, args, work,
                                    {"SMSERVE_HOOK_PROCESSES": str(args.hook_processes)})

    print(f"\nimage example (ResNet-18, {size}x{size}), one worker, hey -c {args.concurrency}, "
          f"{args.seconds:g} s x {args.rounds} alternating rounds (medians); JPEG {len(jpeg) / 1024:.0f} KB, "
          f".npy {(work / 'pixels.npy').stat().st_size / 1024:.0f} KB")
    print(f"{'server':<13} {'case':<5} {'req/s':>8} {'mean batch':>11} {'p50 ms':>8} {'p99 ms':>8} {'/ping p99':>10}")
    for label, cases in results.items():
        for case, r in cases.items():
            print(f"{label:<13} {case:<5} {r['rps']:>8.1f} {r['batch']:>11.2f} {r['p50']:>8.1f} {r['p99']:>8.1f} "
                  f"{r['ping_p99']:>8.1f}ms" + (f"  ({r['ping_failures']:.0f} pings failed)" if r['ping_failures']
                                                else ""))
    mine = results["this tree"]
    print(f"this tree: jpeg/npy mean batch {mine['jpeg']['batch'] / mine['npy']['batch']:.2f}x, "
          f"req/s {mine['jpeg']['rps'] / mine['npy']['rps']:.2f}x")
    if args.hook_processes:
        processes = results[f"processes {args.hook_processes}"]["jpeg"]
        print(f"jpeg, hook processes / hook threads: req/s {processes['rps'] / mine['jpeg']['rps']:.2f}x, "
              f"mean batch {processes['batch'] / mine['jpeg']['batch']:.2f}x")
    if args.baseline:
        before = results[args.baseline[:10]]["jpeg"]
        print(f"jpeg, this tree / {args.baseline[:10]}: mean batch {mine['jpeg']['batch'] / before['batch']:.2f}x, "
              f"req/s {mine['jpeg']['rps'] / before['rps']:.2f}x")


if __name__ == "__main__":
    main()

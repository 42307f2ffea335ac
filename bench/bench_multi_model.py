"""Multi-model endpoints (SAGEMAKER_MULTI_MODEL=true): cold loads, invoke throughput with
many models loaded, an LRU rotation through a small room, /ping while models load.

    .venv/bin/python bench/bench_multi_model.py [--seconds 5] [--concurrency 16] [--rotation 1000]
    .venv/bin/python bench/bench_multi_model.py --only ping [--cold 10] [--cold-big 4] [--room 20]

One server of WORKERS workers (2) in multi-model mode, and for the comparison one
single-model server of the same workers serving the same model, driven by the same
client (`hey`, apt-get install hey: one digit a request):

- cold load to first answer: POST /models until the first invoke's 200 (the 200 of the
  load comes once every worker has loaded it), then DELETE; for the example digits
  model and a ~100 MB model (Linear(5120, 5120)) saved each way, TorchScript and
  torch.export (their loaders differ in how long they hold the GIL). The server's very first
  load (torch's own start-up in each worker) is shown apart;
- invoke throughput on one model with 1, 10 and 100 models loaded (copies of the digits
  model under other names) against the single-model server's /invocations, the two
  servers up side by side and measured in alternating rounds (median of --rounds);
- a rotation through ROTATION archives (hard links to build/model.tar.gz, so the folder
  costs nothing; each is unpacked once, ~130 kB) with the local driver
  (local_test/multi_model.py) holding at most ROOM loaded, least recently used out:
  every step unpacks, unloads one, loads one and invokes it; models/s;
- /ping p50/p99 (every 20 ms, kept-alive) during the cold loads, during loads alone and
  unloads alone, and during the rotation.

--only ping: the /ping rows alone, in well under a minute: the cold loads (load, invoke,
unload; digits, then the big model in each form), then ROOM loads one after another and their unloads one after another, each
with its /ping p50/p99/max (no single-model server, no hey, no rotation).

Prints one table; the figures for this machine are in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from local_test.multi_model import LocalMultiModel  # noqa: E402
from local_test.server_process import ServerProcess  # noqa: E402

from _harness import Pinger, digits, pct, run_hey  # noqa: E402

EXAMPLE = ROOT / "build" / "model"
EXAMPLE_ARCHIVE = ROOT / "build" / "model.tar.gz"
JSON = {"Content-Type": "application/json"}


def server(model_dir: Path, workers: int, multi: bool, log: Path) -> ServerProcess:
    env = {"SAGEMAKER_MODEL_SERVER_WORKERS": str(workers), "SMSERVE_LOG_LEVEL": "warning",
           "SMSERVE_TORCH_THREADS": ""}
    if multi:
        # Models come from build/ and temporary folders, not SageMaker's /opt/ml/models.
        env.update(SAGEMAKER_MULTI_MODEL="true", SMSERVE_MODELS_ROOT="/")
    return ServerProcess(model_dir, env, log_path=log)


def load(url: str, name: str, folder: Path, timeout: float = 300) -> None:
    r = requests.post(url + "/models", json={"model_name": name, "url": str(folder)}, timeout=timeout)
    assert r.status_code == 200, (name, r.status_code, r.text)


def unload(url: str, name: str, timeout: float = 300) -> None:
    r = requests.delete(f"{url}/models/{name}", timeout=timeout)
    assert r.status_code == 200, (name, r.status_code, r.text)


def cold_loads(url: str, folder: Path, body: bytes, times: int, prefix: str) -> list[float]:
    """ms from POST /models to the first invoke's 200, each time under a new name."""
    took = []
    for i in range(times):
        name = f"{prefix}-{i}"
        started = time.perf_counter()
        load(url, name, folder)
        r = requests.post(f"{url}/models/{name}/invoke", data=body, headers=JSON, timeout=60)
        took.append((time.perf_counter() - started) * 1000)
        assert r.status_code == 200, r.text
        unload(url, name)
    return took


def hey(url: str, body_file: Path, seconds: int, concurrency: int) -> dict:
    out = run_hey(url, body_file, JSON, seconds, concurrency)
    bad = {code: n for code, n in out["statuses"].items() if code != 200}
    return {"rps": out["rps"], "p99": out["latency"].get("99"), "bad": bad, "errors": out["errors"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=5, help="each throughput run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating throughput rounds, MME and single")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--cold", type=int, default=20, help="cold loads of the digits model")
    parser.add_argument("--cold-big", type=int, default=8, help="cold loads of the ~100 MB model")
    parser.add_argument("--rotation", type=int, default=1000, help="models in the LRU rotation")
    parser.add_argument("--room", type=int, default=20, help="models the rotation's LRU keeps loaded")
    parser.add_argument("--only", choices=("ping",), help="ping: only /ping while models load and unload")
    parser.add_argument("--log", type=Path, help="--only ping: keep the server's log here")
    args = parser.parse_args()
    if args.only == "ping":
        return ping_only(args)
    if shutil.which("hey") is None:
        sys.exit("bench_multi_model needs hey: apt-get install -y hey")
    if not EXAMPLE_ARCHIVE.exists():
        sys.exit("bench_multi_model needs the example model: make model")

    work = Path(tempfile.mkdtemp(prefix="bench_mme_"))
    try:
        body_file = work / "one-digit.json"
        body = json.dumps({"instances": digits(1).tolist()}).encode()
        body_file.write_bytes(body)
        bigs = big_models(work)
        big_body = json.dumps({"instances": [[0.5] * 5120]}).encode()
        rows: list[tuple[str, str]] = []

        with server(work / "none", args.workers, True, work / "mme.log") as mme:
            started = time.perf_counter()
            load(mme.url, "first", EXAMPLE)
            first_ms = (time.perf_counter() - started) * 1000
            unload(mme.url, "first")
            rows.append(("first load in a fresh server (each worker's torch start-up)", f"{first_ms:.0f} ms"))
            with Pinger(mme.url + "/ping", period=0.02, timeout=10) as ping_cold:
                cold_digits = cold_loads(mme.url, EXAMPLE, body, args.cold, "digits")
            rows.append((f"cold load to first answer, digits model, x{args.cold}",
                         f"p50 {pct(cold_digits, 50):.0f} ms, p99 {pct(cold_digits, 99):.0f} ms"))
            rows.append(("/ping while those load", _pings(ping_cold)))
            for form, (folder, mb) in bigs.items():
                with Pinger(mme.url + "/ping", period=0.02, timeout=10) as ping_big:
                    cold_big = cold_loads(mme.url, folder, big_body, args.cold_big, "big")
                rows.append((f"cold load to first answer, {mb:.0f} MB {form} model, x{args.cold_big}",
                             f"p50 {pct(cold_big, 50):.0f} ms, p99 {pct(cold_big, 99):.0f} ms"))
                rows.append(("/ping while those load", _pings(ping_big)))

            loaded = 0
            pings_loading: list[float] = []
            # The single-model server beside it (idle while the other is measured), and
            # the two measured in alternating rounds: the host's load moves more between
            # minutes than between the servers.
            with server(EXAMPLE, args.workers, False, work / "single.log") as single:
                urls = {"single": single.url + "/invocations", "mme": mme.url + "/models/m000/invoke"}
                for count in (1, 10, 100):
                    with Pinger(mme.url + "/ping", period=0.02, timeout=10) as pinger:
                        while loaded < count:
                            load(mme.url, f"m{loaded:03d}", EXAMPLE)
                            loaded += 1
                    pings_loading += pinger.latencies
                    for url in urls.values():
                        hey(url, body_file, 2, args.concurrency)  # warm up
                    runs: dict[str, list[dict]] = {"single": [], "mme": []}
                    for _ in range(args.rounds):
                        for kind, url in urls.items():
                            runs[kind].append(hey(url, body_file, args.seconds, args.concurrency))
                    mme_rps, single_rps = (statistics.median(r["rps"] for r in runs[k]) for k in ("mme", "single"))
                    rows.append((f"MME, {count} model{'s' * (count > 1)} loaded, invoking one; single-model "
                                 f"/invocations (median of {args.rounds} alternating rounds)",
                                 f"{mme_rps:.0f} vs {single_rps:.0f} req/s: {mme_rps / single_rps:.2f}x single "
                                 f"(MME p99 {max(r['p99'] or 0 for r in runs['mme']):.1f} ms)"
                                 + "".join(_bad(r) for r in runs["mme"] + runs["single"])))

            # The rotation: every model through the driver's LRU of `room`.
            archives = work / "archives"
            archives.mkdir()
            for i in range(args.rotation):
                os.link(EXAMPLE_ARCHIVE, archives / f"r{i:04d}.tar.gz")
            driver = LocalMultiModel(archives, mme.url, work / "cache", max_models=args.room, remember=False)
            with Pinger(mme.url + "/ping", period=0.02, timeout=10) as ping_unloading:
                driver.unload_all()
            rows.append(("/ping while 100 models load one after another (no unloads)",
                         f"p50 {pct(pings_loading, 50):.1f} ms, p99 {pct(pings_loading, 99):.1f} ms"))
            rows.append(("/ping while they are unloaded one after another",
                         f"p50 {pct(ping_unloading.latencies, 50):.1f} ms, "
                         f"p99 {pct(ping_unloading.latencies, 99):.1f} ms"))
            steps = {"unpack": [], "load": [], "invoke": []}
            statuses: dict[int, int] = {}
            with Pinger(mme.url + "/ping", period=0.02, timeout=10) as ping_rotation:
                started = time.perf_counter()
                for target in driver.targets():
                    answer, t = driver.invoke(target, body)
                    statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
                    steps["unpack"].append(t.unpack_s * 1000)
                    steps["load"].append(t.load_s * 1000)
                    steps["invoke"].append(t.invoke_s * 1000)
                elapsed = time.perf_counter() - started
            rows.append((f"rotation: {args.rotation} models through an LRU of {args.room} (local driver)",
                         f"{args.rotation / elapsed:.1f} models/s ({elapsed:.0f} s); per model p50: unpack "
                         f"{pct(steps['unpack'], 50):.0f} ms, unload + load {pct(steps['load'], 50):.0f} ms, "
                         f"invoke {pct(steps['invoke'], 50):.1f} ms; answers {statuses}"))
            rows.append(("/ping during the rotation", f"p50 {pct(ping_rotation.latencies, 50):.1f} ms, "
                         f"p99 {pct(ping_rotation.latencies, 99):.1f} ms, max {max(ping_rotation.latencies):.0f} ms, "
                         f"{ping_rotation.failures} failed"))

        print(f"multi-model endpoint, {args.workers} workers, {os.cpu_count()} cores; hey: one digit a request, "
              f"{args.concurrency} clients, {args.seconds} s a run")
        width = max(len(name) for name, _ in rows)
        print(f"{'what':{width}}  result")
        for name, value in rows:
            print(f"{name:{width}}  {value}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ping_only(args) -> None:
    """--only ping: /ping while models load and unload, and nothing else."""
    if not EXAMPLE.exists():
        sys.exit("bench_multi_model needs the example model: make model")

    work = Path(tempfile.mkdtemp(prefix="bench_mme_"))
    try:
        body = json.dumps({"instances": digits(1).tolist()}).encode()
        bigs = big_models(work)
        big_body = json.dumps({"instances": [[0.5] * 5120]}).encode()
        rows: list[tuple[str, str]] = []
        with server(work / "none", args.workers, True, work / "mme.log") as mme:
            load(mme.url, "first", EXAMPLE)
            unload(mme.url, "first")
            with Pinger(mme.url + "/ping", period=0.02, timeout=10) as cold:
                cold_loads(mme.url, EXAMPLE, body, args.cold, "digits")
            rows.append((f"/ping while {args.cold} digits models load, answer, unload", _pings(cold)))
            for form, (folder, mb) in bigs.items():
                with Pinger(mme.url + "/ping", period=0.02, timeout=10) as cold:
                    cold_loads(mme.url, folder, big_body, args.cold_big, "big")
                rows.append((f"/ping while {args.cold_big} {mb:.0f} MB {form} models load, answer, unload",
                             _pings(cold)))
            with Pinger(mme.url + "/ping", period=0.02, timeout=10) as loading:
                for i in range(args.room):
                    load(mme.url, f"m{i:03d}", EXAMPLE)
            rows.append((f"/ping while {args.room} models load one after another", _pings(loading)))
            with Pinger(mme.url + "/ping", period=0.02, timeout=10) as unloading:
                for i in range(args.room):
                    unload(mme.url, f"m{i:03d}")
            rows.append(("/ping while they unload one after another", _pings(unloading)))
        if args.log:
            shutil.copy(work / "mme.log", args.log)
        print(f"multi-model endpoint, {args.workers} workers, {os.cpu_count()} cores, /ping every 20 ms")
        width = max(len(name) for name, _ in rows)
        for name, value in rows:
            print(f"{name:{width}}  {value}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def big_models(work: Path) -> dict[str, tuple[Path, float]]:
    """One ~100 MB model (Linear(5120, 5120)) in each saved form: TorchScript's loader
    holds the GIL while it reads the weights, torch.export's is read with it released
    (engine/model/weights.py)."""
    import warnings

    import torch

    layer = torch.nn.Linear(5120, 5120).eval()
    forms = {}
    for form, name in (("TorchScript", "model.pt"), ("torch.export", "model.pt2")):
        folder = work / f"big-{name.replace('.', '-')}"
        folder.mkdir()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if name == "model.pt":
                torch.jit.save(torch.jit.script(layer), str(folder / name))
            else:
                batch = torch.export.Dim("batch", min=1, max=1024)
                program = torch.export.export(layer, (torch.zeros(2, 5120),), dynamic_shapes=({0: batch},))
                torch.export.save(program, str(folder / name))
        forms[form] = (folder, (folder / name).stat().st_size / 2**20)
    return forms


def _pings(pinger: Pinger) -> str:
    lat = pinger.latencies
    return (f"p50 {pct(lat, 50):.1f} ms, p99 {pct(lat, 99):.1f} ms, max {max(lat, default=0):.0f} ms, "
            f"{len(lat)} pings, {pinger.failures} failed")


def _bad(result: dict) -> str:
    return (f"; non-200: {result['bad']}" if result["bad"] else "") + \
        (f"; {result['errors']} connection errors" if result["errors"] else "")


if __name__ == "__main__":
    main()

r"""TorchServe (PyTorch's model server, the one SageMaker's PyTorch inference containers run)
on bench_multi_model.py's workload, beside our multi-model server in the same run.

    .venv/bin/python bench/bench_torchserve_mme.py [--workers 2] [--seconds 5] [--concurrency 16]
        [--rounds 2] [--cold 20] [--cold-big 8] [--counts 1,10,100] [--rotation 100] [--room 20]
        [--mem-margin-gb 6] [--ts-python /tmp/ts_venv/bin/python] [--no-ours] [--keep-logs DIR]

Setup (once). TorchServe 0.12.0 needs Java 17 and its own venv, so that the project's
locked .venv stays as it is; the venv needs torch, and `torch==2.13.0` (the project's
version, pinned: any other spec may fetch a multi-GB CUDA build) takes the local CPU wheel:
    apt-get install -y openjdk-17-jre-headless hey     # java -version: 17
    python3.11 -m venv /tmp/ts_venv                    # the interpreter .venv was made from
                                                       # (.venv/pyvenv.cfg: home)
    /tmp/ts_venv/bin/pip install torch==2.13.0 torchserve==0.12.0 torch-model-archiver==0.12.0 \
        pyyaml numpy==2.4.6     # its workers import both; its wheel requires neither
then --ts-python /tmp/ts_venv/bin/python (the default; or TS_PYTHON). This script runs with
the project's .venv: it builds the models with the project's torch and drives both servers.

The models, as TorchServe takes them (its base handler loads TorchScript; a torch.export
model.pt2 only as an AOT-compiled .so), archived with torch-model-archiver into .mar files:
  - digits: the example model (build/model/model.pt2) as TorchScript: model.digits's
    DigitsClassifier with the exported program's weights, torch.jit.trace; its answer is
    checked against the .pt2's own forward before anything is measured (and the big
    model's against the Linear's own);
  - big: Linear(5120, 5120) in TorchScript (~100 MB), as bench_multi_model.py's.
The handler (written next to them) takes our server's JSON, {"instances": [[64 floats]]},
and answers {"predictions": [[10 floats]]} (compact JSON), so that both servers are driven
with the very same body: BaseHandler with preprocess/postprocess for that format;
TorchServe's own inference (torch.inference_mode, one request a batch: batch_size=1, its
default). decode_input_request=false, as SageMaker's TorchServe config sets it: the handler
decodes the JSON itself, as ours does.

TorchServe's setup, and why:
  - --workers (2) TorchServe workers per model (initial_workers at registration): ours
    runs 2 gunicorn workers that each hold every model, so one model is served by 2
    processes in both. In TorchServe each worker is a Python process of its own per model
    (a model's 2 workers are 2 processes that each import torch and load it), so 100
    models loaded are 200 processes; the "memory" rows give what that costs;
  - OMP_NUM_THREADS=1 in every worker: ours runs cores // workers = 1 torch thread a
    worker here;
  - logs at WARN (a log4j2 file written here; no access log, no per-request model or
    metrics lines) and async_logging=true: ours runs at SMSERVE_LOG_LEVEL=warning;
    disable_system_metrics=true (else a Python process is spawned each minute to read
    them); no config snapshots (--ncs); token auth off, the model API on (0.12 needs both
    for the management API to register models);
  - registration: POST /models?url=<name>.mar&model_name=<name>&initial_workers=W&
    synchronous=true (the 200 comes once the workers are up) on the management port;
    unregistration DELETE /models/<name>; predictions POST /predictions/<name> on the
    inference port, which also answers GET /ping.
Ours: the same as bench_multi_model.py (container/serve, SAGEMAKER_MULTI_MODEL=true, 2
workers, its default torch threads, log level warning), loading the unpacked folders.

What is measured, as bench_multi_model.py does, for TorchServe and (unless --no-ours) ours:
  - the first load in a fresh server, then cold load to first answer (register/POST
    /models until the first prediction's 200, then unregister) for digits x--cold and big
    x--cold-big, each with /ping p50/p99 (GET every 20 ms, kept-alive) during them;
  - invoke throughput on one model with 1, 10 and 100 models loaded (--counts; copies of
    digits under other names): `hey -z Ns -c 16 -m POST -T application/json -D body`, one
    digit a request, after a 2 s warm-up, in --rounds rounds alternating TorchServe and
    ours (the host is shared: interleaving spreads its noise over both); the memory of
    each server's processes (PSS summed over its process group) at each count; /ping
    while the models load one after another, and while they unload one after another.
    A count whose TorchServe workers would leave less than --mem-margin-gb (6) of
    MemAvailable, projected from the PSS a model measured at the count before, is not
    loaded: its row says what it would need (each digits worker is a Python process of
    ~150 MB here, so 100 models at 2 workers need ~35 GB);
  - a rotation through --rotation models (hard links of one archive: .mar files in
    TorchServe's model store; .tar.gz for ours, through local_test/multi_model.py's
    driver) with at most --room loaded, least recently used out: every step unloads one,
    loads one, invokes it; models/s, /ping during it. Shorter than bench_multi_model's
    1,000 by default: a TorchServe load starts new Python processes (seconds each here).
/ping failures are counted by kind: a status other than 200, no answer within the
pinger's 10 s (a ping that hangs also delays the pings after it, and its 10 s is in the
latencies), a connection error.
Prints one table, TorchServe's column beside ours. It asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import OrderedDict
from pathlib import Path

import numpy as np
import requests
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from local_test.multi_model import LocalMultiModel  # noqa: E402
from local_test.server_process import HTTPProcess, ServerProcess, free_port  # noqa: E402
from model.digits import DigitsClassifier  # noqa: E402

import bench_multi_model  # noqa: E402
from _harness import Pinger, digits, pct, run_hey  # noqa: E402

EXAMPLE = ROOT / "build" / "model"
EXAMPLE_ARCHIVE = ROOT / "build" / "model.tar.gz"
JSON = {"Content-Type": "application/json"}
BIG = 5120

HANDLER = '''\
"""{"instances": [[...], ...]} in, {"predictions": [[...], ...]} out (compact JSON), as our
server's JSON; TorchServe's BaseHandler loads the TorchScript and runs it."""
import json

import torch
from ts.torch_handler.base_handler import BaseHandler


class InstancesHandler(BaseHandler):
    def preprocess(self, data):
        self._counts, rows = [], []
        for request in data:
            body = request.get("body")
            if body is None:
                body = request.get("data")
            if isinstance(body, (bytes, bytearray)):
                body = json.loads(body)
            self._counts.append(len(body["instances"]))
            rows.extend(body["instances"])
        return torch.tensor(rows, dtype=torch.float32)

    def postprocess(self, data):
        rows, out, start = data.tolist(), [], 0
        for i, n in enumerate(self._counts):
            out.append(json.dumps({"predictions": rows[start:start + n]}, separators=(",", ":")))
            self.context.set_response_content_type(i, "application/json")
            start += n
        return out
'''

LOG4J2 = '''<?xml version="1.0" encoding="UTF-8"?>
<Configuration>
  <Appenders>
    <File name="ts_log" fileName="${env:LOG_LOCATION:-logs}/ts_log.log">
      <PatternLayout pattern="%d{ISO8601} [%-5p] %t %c - %m%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Logger name="ACCESS_LOG" level="off"/>
    <Logger name="io.netty" level="error"/>
    <Logger name="MODEL_LOG" level="warn" additivity="false"><AppenderRef ref="ts_log"/></Logger>
    <Logger name="MODEL_METRICS" level="off"/>
    <Logger name="TS_METRICS" level="off"/>
    <Logger name="org.apache" level="off"/>
    <Root level="warn"><AppenderRef ref="ts_log"/></Root>
  </Loggers>
</Configuration>
'''


# ---------------------------------------------------------------- the models


def build_models(work: Path, ts_python: Path) -> dict:
    """TorchScript digits and big models, their .mar files in a model store, the unpacked
    folders ours loads; the reference answers to check both servers against."""
    program = torch.export.load(str(EXAMPLE / "model.pt2"))
    net = DigitsClassifier().eval()
    net.load_state_dict(program.state_dict)
    x = torch.from_numpy(digits(3))
    with torch.no_grad():
        want = program.module()(x)
        scripted = torch.jit.trace(net, torch.zeros(4, 64))  # script trips on a module-level constant
        for rows in (x, x[:1]):
            assert torch.allclose(scripted(rows), program.module()(rows), atol=1e-6), \
                "the TorchScript digits differ from model.pt2"
    layer = torch.nn.Linear(BIG, BIG).eval()
    with torch.no_grad():
        big_want = layer(torch.full((1, BIG), 0.5))

    src = work / "src"
    src.mkdir()
    store = work / "store"
    store.mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(scripted, str(src / "digits.pt"))
        torch.jit.save(torch.jit.script(layer), str(src / "big.pt"))
    (src / "handler.py").write_text(HANDLER)
    archiver = ts_python.parent / "torch-model-archiver"
    for name in ("digits", "big"):
        subprocess.run([str(archiver), "--model-name", name, "--version", "1.0",
                        "--serialized-file", str(src / f"{name}.pt"), "--handler", str(src / "handler.py"),
                        "--export-path", str(store)], check=True)
    big_dir = work / "ours-big"  # ours: the same TorchScript in a model folder
    big_dir.mkdir()
    shutil.copy(src / "big.pt", big_dir / "model.pt")
    return {"store": store, "x": x.numpy(), "want": want.numpy(), "big_want": big_want.numpy(),
            "big_dir": big_dir,
            "mb": {"digits": (store / "digits.mar").stat().st_size / 2**20,
                   "big": (store / "big.mar").stat().st_size / 2**20}}


# ---------------------------------------------------------------- the servers


class TorchServe(HTTPProcess):
    """torchserve --foreground on free ports, in its own session (the JVM and its Python
    workers stop with the group); its pid file, logs and temporary files in `work`."""

    def __init__(self, work: Path, store: Path, ts_python: Path, workers: int):
        self.inference_port, self.management_port, metrics_port = free_port(), free_port(), free_port()
        self.management = f"http://127.0.0.1:{self.management_port}"
        self.workers = workers
        home = work / "ts"
        (home / "logs").mkdir(parents=True)
        config = home / "config.properties"
        config.write_text("\n".join([
            f"inference_address=http://127.0.0.1:{self.inference_port}",
            f"management_address={self.management}",
            f"metrics_address=http://127.0.0.1:{metrics_port}",
            f"model_store={store}",
            f"default_workers_per_model={workers}",
            "disable_system_metrics=true",
            "async_logging=true",
            "decode_input_request=false",
            "install_py_dep_per_model=false",
            "default_response_timeout=300",
            "unregister_model_timeout=300",
            "",
        ]))
        (home / "log4j2.xml").write_text(LOG4J2)
        env = {**os.environ, "TMPDIR": str(home), "TEMP": str(home), "LOG_LOCATION": str(home / "logs"),
               "METRICS_LOCATION": str(home / "logs"), "OMP_NUM_THREADS": "1"}
        cmd = [str(ts_python.parent / "torchserve"), "--start", "--foreground", "--ncs", "--disable-token-auth",
               "--enable-model-api", "--model-store", str(store), "--ts-config", str(config),
               "--log-config", str(home / "log4j2.xml")]
        super().__init__(cmd, env, f"http://127.0.0.1:{self.inference_port}", "/ping", home / "stdout.log", cwd=home)

    def load(self, name: str, archive: str) -> None:
        r = requests.post(self.management + "/models", params={
            "url": archive, "model_name": name, "initial_workers": self.workers, "synchronous": "true",
            "batch_size": 1}, timeout=600)
        assert r.status_code == 200, (name, r.status_code, r.text)

    def unload(self, name: str) -> None:
        r = requests.delete(f"{self.management}/models/{name}", timeout=600)
        assert r.status_code == 200, (name, r.status_code, r.text)

    def invoke_url(self, name: str) -> str:
        return f"{self.url}/predictions/{name}"

    @property
    def pgid(self) -> int:
        return self.proc.pid  # the session's leader: the torchserve launcher


class Ours:
    """Our server in multi-model mode (bench_multi_model.py's settings)."""

    def __init__(self, work: Path, workers: int):
        self.proc = ServerProcess(work / "none", {"SAGEMAKER_MODEL_SERVER_WORKERS": str(workers),
                                                  "SMSERVE_LOG_LEVEL": "warning", "SMSERVE_TORCH_THREADS": "",
                                                  "SAGEMAKER_MULTI_MODEL": "true", "SMSERVE_MODELS_ROOT": "/"},
                                    log_path=work / "ours.log")
        self.url = self.proc.url

    def start(self) -> "Ours":
        self.proc.start()
        return self

    def terminate(self) -> None:
        self.proc.terminate()

    def load(self, name: str, folder) -> None:
        bench_multi_model.load(self.url, name, folder, timeout=600)

    def unload(self, name: str) -> None:
        bench_multi_model.unload(self.url, name, timeout=600)

    def invoke_url(self, name: str) -> str:
        return f"{self.url}/models/{name}/invoke"

    @property
    def pgid(self) -> int:
        return self.proc.proc.pid  # gunicorn's master leads the session


class Pings(Pinger):
    """_harness's Pinger (GET every `period` on a kept-alive connection), which also
    counts each kind of failure: a status other than 200, no answer within `timeout`,
    a connection error."""

    def __init__(self, url: str | None, period: float = 0.02, timeout: float = 10):
        super().__init__(url, period, timeout)
        self.kinds: dict[str, int] = {}

    def _run(self) -> None:
        with requests.Session() as session:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    status = session.get(self.url, timeout=self.timeout).status_code
                    kind = None if status == 200 else str(status)
                except requests.Timeout:
                    kind = f"no answer in {self.timeout:g} s"
                except requests.RequestException as e:
                    kind = type(e).__name__
                elapsed = time.perf_counter() - started
                self.latencies.append(elapsed * 1000)
                if kind:
                    self.failures += 1
                    self.kinds[kind] = self.kinds.get(kind, 0) + 1
                self._stop.wait(max(0.0, self.period - elapsed))

    def add(self, other: "Pings") -> None:
        self.latencies += other.latencies
        self.failures += other.failures
        for kind, n in other.kinds.items():
            self.kinds[kind] = self.kinds.get(kind, 0) + n


def available_mb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def group_pss_mb(pgid: int) -> tuple[float, int]:
    """(PSS in MB summed over the processes of a process group, how many processes)."""
    total, count = 0, 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[2]) != pgid:
                    continue
            with open(f"/proc/{entry}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
                        count += 1
                        break
        except (OSError, ValueError, IndexError):
            pass
    return total / 1024, count


# ---------------------------------------------------------------- the measurements


def check_answer(server, name: str, source, x: np.ndarray, want: np.ndarray) -> float:
    """Loads `source`, asks it for x, compares with the model's own answer; unloads.
    The largest difference."""
    server.load(name, source)
    try:
        r = requests.post(server.invoke_url(name), data=json.dumps({"instances": x.tolist()}), headers=JSON,
                          timeout=60)
        assert r.status_code == 200, (r.status_code, r.text)
        got = np.asarray(r.json()["predictions"], dtype=np.float32)
        assert got.shape == want.shape, (got.shape, want.shape)
        diff = float(np.abs(got - want).max())
        assert diff < 1e-4, f"{type(server).__name__}: answers differ from the model's own by {diff}"
        return diff
    finally:
        server.unload(name)


def cold_loads(server, source, body: bytes, times: int, prefix: str) -> list[float]:
    """ms from the load request to the first prediction's 200, each under a new name."""
    took = []
    for i in range(times):
        name = f"{prefix}-{i}"
        started = time.perf_counter()
        server.load(name, source)
        r = requests.post(server.invoke_url(name), data=body, headers=JSON, timeout=120)
        took.append((time.perf_counter() - started) * 1000)
        assert r.status_code == 200, r.text
        server.unload(name)
    return took


def hey(url: str, body_file: Path, seconds: int, concurrency: int) -> dict:
    out = run_hey(url, body_file, JSON, seconds, concurrency)
    bad = {code: n for code, n in out["statuses"].items() if code != 200}
    return {"rps": out["rps"], "p99": out["latency"].get("99"), "bad": bad, "errors": out["errors"]}


def ts_rotation(ts: TorchServe, store: Path, count: int, room: int, body: bytes):
    """`count` .mar hard links registered in turn, at most `room` held, least recently
    used unregistered first; each invoked once."""
    for i in range(count):
        os.link(store / "digits.mar", store / f"r{i:04d}.mar")
    held: OrderedDict[str, None] = OrderedDict()
    steps = {"load": [], "invoke": []}
    statuses: dict[int, int] = {}
    started = time.perf_counter()
    for i in range(count):
        name = f"r{i:04d}"
        t0 = time.perf_counter()
        while len(held) >= room:
            ts.unload(held.popitem(last=False)[0])
        ts.load(name, f"{name}.mar")
        held[name] = None
        t1 = time.perf_counter()
        r = requests.post(ts.invoke_url(name), data=body, headers=JSON, timeout=120)
        t2 = time.perf_counter()
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        steps["load"].append((t1 - t0) * 1000)
        steps["invoke"].append((t2 - t1) * 1000)
    elapsed = time.perf_counter() - started
    for name in list(held):
        ts.unload(name)
    return elapsed, steps, statuses


def ours_rotation(ours: Ours, work: Path, count: int, room: int, body: bytes):
    archives = work / "archives"
    archives.mkdir()
    for i in range(count):
        os.link(EXAMPLE_ARCHIVE, archives / f"r{i:04d}.tar.gz")
    driver = LocalMultiModel(archives, ours.url, work / "cache", max_models=room, remember=False)
    steps = {"load": [], "invoke": []}
    statuses: dict[int, int] = {}
    started = time.perf_counter()
    for target in driver.targets():
        answer, t = driver.invoke(target, body)
        statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
        steps["load"].append((t.unpack_s + t.load_s) * 1000)
        steps["invoke"].append(t.invoke_s * 1000)
    elapsed = time.perf_counter() - started
    driver.unload_all()
    return elapsed, steps, statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="TorchServe workers a model; ours: gunicorn workers")
    parser.add_argument("--seconds", type=int, default=5, help="each throughput run")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="throughput rounds, servers alternating")
    parser.add_argument("--cold", type=int, default=20, help="cold loads of the digits model")
    parser.add_argument("--cold-big", type=int, default=8, help="cold loads of the ~100 MB model")
    parser.add_argument("--counts", default="1,10,100", help="models loaded for the throughput runs")
    parser.add_argument("--rotation", type=int, default=100, help="models in the LRU rotation (0: none)")
    parser.add_argument("--room", type=int, default=20, help="models the rotation keeps loaded")
    parser.add_argument("--mem-margin-gb", type=float, default=6,
                        help="skip a model count whose TorchServe workers would leave less memory available")
    parser.add_argument("--ts-python", type=Path,
                        default=Path(os.environ.get("TS_PYTHON", "/tmp/ts_venv/bin/python")))
    parser.add_argument("--no-ours", action="store_true", help="TorchServe alone")
    parser.add_argument("--keep-logs", type=Path, help="copy the servers' logs here")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",") if c]
    if shutil.which("hey") is None:
        sys.exit("needs hey: apt-get install -y hey")
    if shutil.which("java") is None:
        sys.exit("TorchServe needs Java 17: apt-get install -y openjdk-17-jre-headless")
    if not (args.ts_python.parent / "torchserve").exists():
        sys.exit(f"no torchserve beside {args.ts_python}: see the setup in this script's docstring")
    if not EXAMPLE_ARCHIVE.exists():
        sys.exit("needs the example model: make model")

    work = Path(tempfile.mkdtemp(prefix="bench_ts_mme_"))
    ts = ours = None
    rows: list[tuple[str, str, str]] = []  # what, TorchServe, ours

    def row(what: str, ts_value: str, ours_value: str = "") -> None:
        rows.append((what, ts_value, ours_value if ours else "-"))
        print(f"  {what}: TorchServe {ts_value}" + (f" | ours {ours_value}" if ours else ""), file=sys.stderr,
              flush=True)

    try:
        models = build_models(work, args.ts_python)
        store = models["store"]
        body = json.dumps({"instances": digits(1).tolist()}).encode()
        body_file = work / "one-digit.json"
        body_file.write_bytes(body)
        big_body = json.dumps({"instances": [[0.5] * BIG]}).encode()

        started = time.perf_counter()
        ts = TorchServe(work, store, args.ts_python, args.workers).start(timeout=300)
        ts_start = (time.perf_counter() - started) * 1000
        servers: list = [ts]
        if not args.no_ours:
            started = time.perf_counter()
            ours = Ours(work, args.workers).start()
            ours_start = (time.perf_counter() - started) * 1000
            servers.append(ours)
        row("server start until /ping answers 200 (no model)", f"{ts_start:.0f} ms",
            f"{ours_start:.0f} ms" if ours else "")

        sources = {ts: {"digits": "digits.mar", "big": "big.mar"}}
        if ours:
            sources[ours] = {"digits": EXAMPLE, "big": models["big_dir"]}

        firsts = {}
        for server in servers:
            started = time.perf_counter()
            server.load("first", sources[server]["digits"])
            firsts[server] = (time.perf_counter() - started) * 1000
            server.unload("first")
        row("first load in a fresh server", f"{firsts[ts]:.0f} ms", f"{firsts.get(ours, 0):.0f} ms")

        diffs = {s: (check_answer(s, "check", sources[s]["digits"], models["x"], models["want"]),
                     check_answer(s, "check-big", sources[s]["big"], np.full((1, BIG), 0.5, np.float32),
                                  models["big_want"])) for s in servers}
        row("answers vs the model's own forward (max abs diff: digits x3, big)",
            "{:.1e}, {:.1e}".format(*diffs[ts]), "{:.1e}, {:.1e}".format(*diffs[ours]) if ours else "")

        for kind, times, req in (("digits", args.cold, body), ("big", args.cold_big, big_body)):
            took, pings = {}, {}
            for server in servers:
                with Pings(server.url + "/ping") as pinger:
                    took[server] = cold_loads(server, sources[server][kind], req, times, kind)
                pings[server] = pinger
            label = "digits model" if kind == "digits" else f"{models['mb']['big']:.0f} MB TorchScript model"
            row(f"cold load to first answer, {label}, x{times}",
                *(f"p50 {pct(took[s], 50):.0f} ms, p99 {pct(took[s], 99):.0f} ms" for s in (ts, ours) if s))
            row("/ping while those load, answer, unload", *(_pings(pings[s]) for s in (ts, ours) if s))

        loaded = 0
        load_pings = {s: Pings(None) for s in servers}
        base_mb = group_pss_mb(ts.pgid)[0]
        per_model_mb = None  # TorchServe's PSS a loaded digits model (its workers), once measured
        for count in counts:
            if per_model_mb is not None:
                need, free = (count - loaded) * per_model_mb, available_mb()
                if free - need < args.mem_margin_gb * 1024:
                    row(f"{count} models loaded, invoking one",
                        f"not measured: TorchServe would need ~{need / 1024:.1f} GB more ({per_model_mb:.0f} MB a "
                        f"model, measured at {loaded}), {free / 1024:.1f} GB available, keeping "
                        f"{args.mem_margin_gb:g} GB free", "not measured (TorchServe's row)")
                    break
            for server in servers:
                with Pings(server.url + "/ping") as pinger:
                    for i in range(loaded, count):
                        server.load(f"m{i:03d}", sources[server]["digits"])
                load_pings[server].add(pinger)
            loaded = count
            memory = {s: group_pss_mb(s.pgid) for s in servers}
            per_model_mb = (memory[ts][0] - base_mb) / loaded
            results = {s: [] for s in servers}
            for server in servers:
                hey(server.invoke_url("m000"), body_file, 2, args.concurrency)  # warm up
            for _ in range(args.rounds):
                for server in servers:
                    results[server].append(hey(server.invoke_url("m000"), body_file, args.seconds, args.concurrency))
            row(f"{count} model{'s' * (count > 1)} loaded, invoking one: req/s median of {args.rounds} rounds",
                *(_throughput(results[s]) for s in (ts, ours) if s))
            row(f"memory with {count} model{'s' * (count > 1)} loaded (PSS of the server's processes)",
                *(f"{memory[s][0]:,.0f} MB in {memory[s][1]} processes" for s in (ts, ours) if s))
        row(f"/ping while {loaded} models load one after another", *(_pings(load_pings[s]) for s in (ts, ours) if s))
        unload_pings = {}
        for server in servers:
            with Pings(server.url + "/ping") as pinger:
                for i in range(loaded):
                    server.unload(f"m{i:03d}")
            unload_pings[server] = pinger
        row("/ping while they unload one after another", *(_pings(unload_pings[s]) for s in (ts, ours) if s))

        if args.rotation and per_model_mb and available_mb() - args.room * per_model_mb < args.mem_margin_gb * 1024:
            row(f"rotation through an LRU of {args.room}", "not measured: not enough memory for the room", "-")
        elif args.rotation:
            rotated, rot_pings = {}, {}
            for server in servers:
                with Pings(server.url + "/ping") as pinger:
                    if server is ts:
                        rotated[server] = ts_rotation(ts, store, args.rotation, args.room, body)
                    else:
                        rotated[server] = ours_rotation(ours, work, args.rotation, args.room, body)
                rot_pings[server] = pinger

            def rotation(s):
                elapsed, steps, statuses = rotated[s]
                return (f"{args.rotation / elapsed:.2f} models/s ({elapsed:.0f} s); per model p50: "
                        f"{'unload + load' if s is ts else 'unpack + unload + load'} {pct(steps['load'], 50):.0f} ms, "
                        f"invoke {pct(steps['invoke'], 50):.1f} ms; answers {statuses}")
            row(f"rotation: {args.rotation} models through an LRU of {args.room}",
                *(rotation(s) for s in (ts, ours) if s))
            row("/ping during the rotation", *(_pings(rot_pings[s]) for s in (ts, ours) if s))
    finally:
        for server in (ours, ts):
            if server is not None:
                server.terminate()
        if args.keep_logs:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for log in [*work.glob("ts/logs/*.log"), work / "ts" / "stdout.log", work / "ours.log"]:
                if log.exists():
                    shutil.copy(log, args.keep_logs / log.name)
        shutil.rmtree(work, ignore_errors=True)

    print(f"TorchServe 0.12.0 and ours, multi-model, {args.workers} workers a model (TorchServe) / "
          f"{args.workers} workers holding every model (ours), {os.cpu_count()} cores; hey: one digit a request, "
          f"{args.concurrency} clients, {args.seconds} s a run")
    widths = [max(len(r[i]) for r in rows + [("what", "TorchServe", "ours")]) for i in range(3)]
    for r in [("what", "TorchServe", "ours"), *rows]:
        print("  ".join(f"{cell:{w}}" for cell, w in zip(r, widths)).rstrip())


def _pings(pinger: Pings) -> str:
    lat = pinger.latencies
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(pinger.kinds.items()))
    return (f"p50 {pct(lat, 50):.1f} ms, p99 {pct(lat, 99):.1f} ms, max {max(lat, default=0):.0f} ms, "
            f"{len(lat)} pings, {pinger.failures} failed" + (f" ({kinds})" if kinds else ""))


def _throughput(results: list[dict]) -> str:
    rps = [r["rps"] for r in results]
    bad: dict[int, int] = {}
    for r in results:
        for code, n in r["bad"].items():
            bad[code] = bad.get(code, 0) + n
    errors = sum(r["errors"] for r in results)
    return (f"{statistics.median(rps):.0f} req/s ({' / '.join(f'{v:.0f}' for v in rps)}; "
            f"p99 {statistics.median(r['p99'] or 0 for r in results):.1f} ms)"
            + (f"; non-200: {bad}" if bad else "") + (f"; {errors} connection errors" if errors else ""))


if __name__ == "__main__":
    main()

r"""Throughput side by side: our server against a raw handler (the ceiling), a bare Flask
handler and PyTriton.

    .venv/bin/python bench/bench_peers.py [--scenario protocols|compute|cores] [--seconds 8]
        [--rounds 2] [--pin] [--tuned] [--protocols npy,json,v2] [--no-flask] [--no-triton]
        [--pytriton-python /tmp/pytriton_venv/bin/python] [--baseline GIT-REF] [--log-format text|json]

Scenarios (each prints one table):
  protocols (default)  the rows below, at batch 1 and 256, concurrency 16;
  compute              a compute-bound MLP 64->3072->3072->16 at batch 1, concurrency 64: ours
                       with dynamic batching, ours without (SMSERVE_MAX_BATCH_SIZE=1), the
                       ceiling, the bare handler, PyTriton's dynamic batcher;
  cores                batch 1 at concurrency 32: ours with 1 worker pinned to core 0 (hey on
                       core 1) against ours with 2 workers on both cores, the bare handler with
                       2 workers and PyTriton, unpinned. The "req/cpu-s" column (requests per
                       CPU-second of the server's processes) says whether the work per request
                       stays the same with more workers, which a 2-core machine that also runs
                       hey cannot show in req/s alone.

Builds one TorchScript MLP (64->256->16, torch.jit.trace) into a temporary model dir
and serves it, all at once, from (the peers are the files in bench/peers/)
  - our server (container/serve: gunicorn, our gevent worker, one worker, one torch
    thread), asked in three protocols: application/x-npy in and out, application/json
    ({"instances": [...]}), and KServe v2 binary (/v2/models/mlp/infer with
    Inference-Header-Content-Length);
  - the ceiling (raw_asyncio.py): an asyncio.Protocol that reads the Content-Length and
    the body, np.load -> model under torch.no_grad -> np.save, one write; no checks, no
    batching: the least a Python server does per request. "vs ceiling" is ours / it;
  - a bare peer (flask_app.py): a Flask app under gunicorn's stock gevent worker
    (`-k gevent`, one worker), the same np.load -> model -> np.save: a Python WSGI stack;
  - PyTriton (Triton's C++ HTTP front end, Python model, default dynamic batcher), v2
    binary, when nvidia-pytriton is importable and starts (--no-triton skips it). It
    pins numpy<2 (the lock has numpy 2), so keep it out of the project's venv: a venv of
    its own that sees the project's packages (torch) after its own (numpy 1.x):
        python3.11 -m venv /tmp/pytriton_venv    # the interpreter .venv was made from
        /tmp/pytriton_venv/bin/pip install nvidia-pytriton
        echo $PWD/.venv/lib/python3.11/site-packages \
            > /tmp/pytriton_venv/lib/python3.11/site-packages/zz_project.pth
    then --pytriton-python /tmp/pytriton_venv/bin/python (or PYTRITON_PYTHON). (A
    `pip install --target` folder on PYTHONPATH does not work: Triton's Python backend
    stub ignores PYTHONPATH.)
Our server runs at its defaults, as a user starts it (no SMSERVE_LOG_LEVEL: info, an access
line per request); --tuned also serves it at the tuned settings (TUNED: SMSERVE_LOG_LEVEL=
warning, no access line), interleaved with the rest, and adds a "vs tuned" column, so the
table prints both and what the access line costs (--log-format json: every one of ours
writes JSON lines, so it is what the JSON line costs). Each server runs one worker with one
torch thread. Every case is answered once before
the load and its answer compared with the model's own (a wrong answer is printed, not
hidden). Then `hey` (apt-get install hey) drives each case at concurrency 16 for
--seconds, interleaved round by round (A, B, C, ..., A, B, C, ...) so that noise on a
shared machine hits all of them alike; each round's req/s is kept to show the spread.
--pin pins every server to core 0 and hey to core 1, so that the load generator does not
take the server's core.
--protocols (protocols scenario) picks our rows' protocols (npy, json, v2); --no-flask
leaves the bare Flask peer out.
--baseline REF (protocols scenario) also serves our server as it was at git commit REF
(`git archive REF container`, run with this venv), in the same three protocols and
interleaved with the rest, and adds a "vs REF" column: before/after ratios measured in one
run on one machine.

Prints one table: req/s, p50/p99 latency, non-200 answers (and connection errors), our
server's /ping p99 under that load (a GET every 50 ms on a kept-alive connection, as
SageMaker's health check), and the ratio to the ceiling, the bare Flask peer and PyTriton.
It asserts nothing about speed; the current figures are in docs/performance.md (Figures), dated ones in
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import requests
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from local_test.server_process import ServerProcess  # noqa: E402

from _harness import Pinger, checkout, run_hey  # noqa: E402
from _peers_report import report  # noqa: E402
from _peer_servers import pinned, pytriton_importable, start_ceiling, start_peer, start_triton, triton_env  # noqa: E402

MODEL_NAME, IN_NAME, OUT_NAME = "mlp", "x", "y"
IN_DIM, HIDDEN, OUT_DIM, MAX_BATCH = 64, 256, 16, 256
IHCL = "Inference-Header-Content-Length"
PING_PERIOD_S = 0.05
NPY = "application/x-npy"
# --tuned: our server as an operator tunes it for throughput (no access line).
TUNED = {"SMSERVE_LOG_LEVEL": "warning"}
PROTOCOLS = {"npy": "npy", "json": "json", "v2": "v2 binary"}

# ---------------------------------------------------------------- the model


def build_model(model_dir: Path, hidden: tuple[int, ...] = (HIDDEN,)) -> torch.jit.ScriptModule:
    torch.manual_seed(0)
    layers: list = []
    width = IN_DIM
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    net = torch.nn.Sequential(*layers, torch.nn.Linear(width, OUT_DIM)).eval()
    traced = torch.jit.trace(net, torch.zeros(2, IN_DIM))
    model_dir.mkdir(parents=True)
    torch.jit.save(traced, str(model_dir / "model.pt"))
    (model_dir / "metadata.json").write_text(json.dumps({
        "name": MODEL_NAME, "version": "1", "max_batch_size": MAX_BATCH,
        "inputs": [{"name": IN_NAME, "datatype": "FP32", "shape": [IN_DIM]}],
        "outputs": [{"name": OUT_NAME, "datatype": "FP32", "shape": [OUT_DIM]}],
    }, indent=2))
    return traced


# ---------------------------------------------------------------- request bodies and answers


def npy_bytes(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x)
    return buf.getvalue()


def v2_request(x: np.ndarray) -> tuple[bytes, int]:
    """A KServe v2 binary body and its JSON header's length, as tritonclient builds it."""
    import tritonclient.http as httpclient

    inp = httpclient.InferInput(IN_NAME, list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    out = httpclient.InferRequestedOutput(OUT_NAME, binary_data=True)
    body, header_length = httpclient.InferenceServerClient.generate_request_body([inp], outputs=[out])
    return body, header_length


def v2_answer(body: bytes, headers) -> np.ndarray:
    import tritonclient.http as httpclient

    length = headers.get(IHCL)
    result = httpclient.InferenceServerClient.parse_response_body(body, header_length=int(length) if length else None)
    return result.as_numpy(OUT_NAME)


class Case:
    """One server x protocol x batch: where hey sends what, and how to read the answer."""

    def __init__(self, server: str, protocol: str, batch: int, url: str, body: bytes, headers: dict, decode):
        self.server, self.protocol, self.batch = server, protocol, batch
        self.url, self.body, self.headers, self.decode = url, body, headers, decode
        self.rounds: list[dict] = []
        self.correct: str = "?"
        self.session: int | None = None  # the server's session id: its CPU time is summed
        self.hey_core: int | None = None  # taskset hey to this core
        self.ping_url: str | None = None  # our servers' /ping, sampled during the load

    @property
    def label(self) -> str:
        return f"{self.server}, {self.protocol}"


def cases_for(server: str, base: str, protocols: list[str], x: dict[int, np.ndarray]) -> list[Case]:
    cases = []
    for batch, data in x.items():
        for protocol in protocols:
            if protocol == "npy":
                cases.append(Case(server, "npy", batch, base + "/invocations", npy_bytes(data),
                                  {"Content-Type": NPY, "Accept": NPY},
                                  lambda body, headers: np.load(io.BytesIO(body), allow_pickle=False)))
            elif protocol == "json":
                cases.append(Case(server, "json", batch, base + "/invocations",
                                  json.dumps({"instances": data.tolist()}).encode(),
                                  {"Content-Type": "application/json", "Accept": "application/json"},
                                  lambda body, headers: np.asarray(json.loads(body)["predictions"], np.float32)))
            elif protocol == "v2 binary":
                body, header_length = v2_request(data)
                cases.append(Case(server, "v2 binary", batch, f"{base}/v2/models/{MODEL_NAME}/infer", body,
                                  {"Content-Type": "application/octet-stream", IHCL: str(header_length)},
                                  v2_answer))
    return cases


def check(case: Case, expected: np.ndarray) -> None:
    """One request outside the load: the status and the numbers must be the model's."""
    try:
        r = requests.post(case.url, data=case.body, headers=case.headers, timeout=30)
        if r.status_code != 200:
            case.correct = f"HTTP {r.status_code}: {r.text[:200]!r}"
            return
        got = case.decode(r.content, r.headers)
        if got.shape != expected.shape:
            case.correct = f"shape {got.shape} != {expected.shape}"
        elif not np.allclose(got, expected, rtol=1e-5, atol=1e-5):
            case.correct = f"max |diff| {float(np.abs(got - expected).max()):.3g}"
        else:
            case.correct = "ok"
    except Exception as e:  # noqa: BLE001 - reported in the table, never hidden
        case.correct = f"{type(e).__name__}: {e}"[:200]


# ---------------------------------------------------------------- load


def session_cpu_seconds(session: int | None) -> float:
    """User + system CPU seconds of every live process in a session (a server's tree)."""
    if session is None:
        return float("nan")
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session:  # fields after "(comm)": state ppid pgrp session ...
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def hey(case: Case, seconds: float, concurrency: int, workdir: Path, pin: bool) -> dict:
    body = workdir / "body.bin"
    body.write_bytes(case.body)
    cpu_before = session_cpu_seconds(case.session)
    with Pinger(case.ping_url, PING_PERIOD_S) as pinger:
        out = run_hey(case.url, body, case.headers, seconds, concurrency, core=1 if pin else case.hey_core)
    cpu = session_cpu_seconds(case.session) - cpu_before
    statuses = out["statuses"]
    return {"n": sum(statuses.values()), "elapsed": out["elapsed"],
            "p50": out["latency"].get("50", float("nan")), "p99": out["latency"].get("99", float("nan")),
            "non200": sum(n for code, n in statuses.items() if code != 200), "errors": out["errors"], "cpu": cpu,
            "pings": pinger.latencies, "ping_failures": pinger.failures}


# ---------------------------------------------------------------- servers of a scenario


class Bench:
    """Starts servers, collects cases, runs them interleaved, stops the servers."""

    def __init__(self, args, work: Path, model_dir: Path):
        self.args, self.work, self.model_dir = args, work, model_dir
        self.started: list = []
        self.cases: list[Case] = []
        self.notes: list[str] = []

    def ours(self, label: str, protocols: list[str], x: dict, *, workers: int = 1, core: int | None = None,
             hey_core: int | None = None, env: dict | None = None, serve: Path | None = None) -> None:
        with pinned(core):
            server = ServerProcess(self.model_dir, {
                "SMSERVE_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1",
                "SAGEMAKER_MODEL_SERVER_WORKERS": str(workers), **(env or {})}, log_path=self.work / f"{label}.log",
                serve=serve)
            self.started.append(server)
            server.start()
        cases = cases_for(label, server.url, protocols, x)
        for c in cases:
            c.ping_url = server.url + "/ping"
        self._add(cases, server.proc.pid, hey_core)

    def flask(self, label: str, x: dict, *, workers: int = 1, core: int | None = None,
              hey_core: int | None = None) -> None:
        if self.args.no_flask:
            self.notes.append("flask: skipped (--no-flask)")
            return
        with pinned(core):
            peer = start_peer(self.model_dir, self.work, workers, label)
        self.started.append(peer)
        self._add(cases_for(label, peer.url, ["npy"], x), peer.proc.pid, hey_core)

    def ceiling(self, label: str, x: dict, *, core: int | None = None, hey_core: int | None = None) -> None:
        with pinned(core):
            peer = start_ceiling(self.model_dir, self.work, label)
        self.started.append(peer)
        self._add(cases_for(label, peer.url, ["npy"], x), peer.proc.pid, hey_core)

    def triton(self, label: str, x: dict, *, core: int | None = None, hey_core: int | None = None) -> None:
        if self.args.no_triton:
            self.notes.append("PyTriton: skipped (--no-triton)")
            return
        env = triton_env()
        if not pytriton_importable(self.args.pytriton_python, env):
            self.notes.append(f"PyTriton: not importable by {self.args.pytriton_python}, skipped; "
                              "see --pytriton-python")
            return
        try:
            with pinned(core):
                peer = start_triton(self.args.pytriton_python, self.model_dir, self.work, env, label)
        except Exception as e:  # noqa: BLE001 - the rest of the table still stands
            self.notes.append(f"PyTriton: did not start, skipped ({type(e).__name__}: {str(e)[-300:]!r})")
            return
        self.started.append(peer)
        self._add(cases_for(label, peer.url, ["v2 binary"], x), peer.proc.pid, hey_core)

    def _add(self, cases: list[Case], session: int, hey_core: int | None) -> None:
        for c in cases:
            c.session, c.hey_core = session, hey_core
        self.cases += cases

    def run(self, expected: dict, concurrency: int) -> None:
        """Check every case's answer, warm up, then the interleaved rounds."""
        args = self.args
        self.cases.sort(key=lambda c: c.batch)  # stable: batch 1 cases of every server, then the next batch
        for c in self.cases:
            check(c, expected[c.batch])
            print(f"check {c.label:28} batch {c.batch:3}: {c.correct}", flush=True)
        if args.warmup > 0:
            for c in self.cases:
                hey(c, args.warmup, concurrency, self.work, args.pin)
        for r in range(args.rounds):
            for c in self.cases:
                c.rounds.append(hey(c, args.seconds, concurrency, self.work, args.pin))
                s = c.rounds[-1]
                print(f"round {r + 1} {c.label:28} batch {c.batch:3}: {s['n'] / s['elapsed']:7.0f} req/s", flush=True)

    def __enter__(self) -> "Bench":
        return self

    def __exit__(self, *exc) -> None:
        for server in reversed(self.started):
            server.terminate()


def inputs_and_answers(model, batches: tuple[int, ...]) -> tuple[dict, dict]:
    rng = np.random.default_rng(0)
    x = {b: rng.standard_normal((b, IN_DIM)).astype(np.float32) for b in batches}
    with torch.no_grad():
        expected = {b: model(torch.from_numpy(v)).numpy() for b, v in x.items()}
    return x, expected


# ---------------------------------------------------------------- scenarios


def protocols_scenario(args, work: Path) -> None:
    """Every protocol at batch 1 and 256 against the bare handler and PyTriton."""
    model_dir = work / "model"
    x, expected = inputs_and_answers(build_model(model_dir), (1, MAX_BATCH))
    core = 0 if args.pin else None
    concurrency = args.concurrency or 16
    protocols = [PROTOCOLS[p] for p in args.protocols.split(",")]
    baselines = {"ceiling": ("ceiling", "npy"), "flask": ("flask", "npy"), "triton": ("pytriton", "v2 binary")}
    log_format = {"SMSERVE_LOG_FORMAT": args.log_format}
    with Bench(args, work, model_dir) as bench:
        bench.ours("ours", protocols, x, core=core, env=log_format)
        if args.tuned:
            bench.ours("ours, tuned", protocols, x, core=core, env={**TUNED, **log_format})
            baselines = {"tuned": ("ours, tuned", None), **baselines}
        if args.baseline:
            label = f"ours@{args.baseline}"
            bench.ours(label, protocols, x, core=core, env=log_format, serve=checkout(args.baseline, work))
            baselines = {args.baseline[:10]: (label, None), **baselines}
        bench.ceiling("ceiling", x, core=core)
        bench.flask("flask", x, core=core)
        bench.triton("pytriton", x, core=core)
        bench.run(expected, concurrency)
    report(bench.cases,
           f"MLP {IN_DIM}->{HIDDEN}->{OUT_DIM} TorchScript, one worker and one torch thread per server; hey -c "
           f"{concurrency}, {args.seconds:g}s x {args.rounds} interleaved rounds per case; "
           f"{'servers pinned to core 0, hey to core 1' if args.pin else 'unpinned'}; ours at its defaults"
           + (f" but SMSERVE_LOG_FORMAT={args.log_format}" if args.log_format != "text" else "")
           + (f", 'tuned' with {TUNED}" if args.tuned else ""),
           bench.notes, baselines, PING_PERIOD_S)


def compute_scenario(args, work: Path) -> None:
    """A compute-bound model at batch 1 and high concurrency: what dynamic batching buys."""
    model_dir = work / "model"
    hidden = (3072, 3072)
    x, expected = inputs_and_answers(build_model(model_dir, hidden), (1,))
    core = 0 if args.pin else None
    concurrency = args.concurrency or 64
    with Bench(args, work, model_dir) as bench:
        bench.ours("ours, batching", ["v2 binary"], x, core=core)
        bench.ours("ours, no batching", ["v2 binary"], x, core=core, env={"SMSERVE_MAX_BATCH_SIZE": "1"})
        bench.ceiling("ceiling", x, core=core)
        bench.flask("flask", x, core=core)
        bench.triton("pytriton", x, core=core)
        bench.run(expected, concurrency)
    report(bench.cases,
           f"MLP {IN_DIM}->{'->'.join(map(str, hidden))}->{OUT_DIM} TorchScript (compute-bound), one worker and one "
           f"torch thread per server; hey -c {concurrency}, {args.seconds:g}s x {args.rounds} rounds; "
           f"{'servers pinned to core 0, hey to core 1' if args.pin else 'unpinned'}",
           bench.notes + ["ours, batching: max batch 256, no added delay (a pass takes what queued while the last "
                          "one ran); PyTriton: default DynamicBatcher, max_batch_size 256"],
           {"no batch": ("ours, no batching", "v2 binary"), "ceiling": ("ceiling", "npy"),
            "triton": ("pytriton", "v2 binary")}, PING_PERIOD_S)


def cores_scenario(args, work: Path) -> None:
    """Batch 1 on one core and on both: how the front end scales with the cores."""
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("--scenario cores needs two usable cores")
    model_dir = work / "model"
    x, expected = inputs_and_answers(build_model(model_dir), (1,))
    concurrency = args.concurrency or 32
    with Bench(args, work, model_dir) as bench:
        bench.ours("ours, 1 worker, core 0", ["v2 binary", "npy"], x, core=0, hey_core=1)
        bench.ours("ours, 2 workers, 2 cores", ["v2 binary", "npy"], x, workers=2)
        bench.flask("flask, 2 workers, 2 cores", x, workers=2)
        bench.triton("pytriton, 2 cores", x)
        bench.run(expected, concurrency)
    report(bench.cases,
           f"MLP {IN_DIM}->{HIDDEN}->{OUT_DIM}, batch 1, one torch thread per worker; hey -c {concurrency}, "
           f"{args.seconds:g}s x {args.rounds} rounds. '1 worker, core 0': server pinned to core 0, hey to core 1; "
           "the rest unpinned (hey shares the two cores with the server)",
           bench.notes, {"1 core": ("ours, 1 worker, core 0", "v2 binary"),
                         "triton": ("pytriton, 2 cores", "v2 binary")}, PING_PERIOD_S)


# ---------------------------------------------------------------- main


SCENARIOS = {"protocols": protocols_scenario, "compute": compute_scenario, "cores": cores_scenario}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=SCENARIOS, default="protocols",
                        help="protocols (default): every protocol at batch 1 and 256; compute: a compute-bound "
                             "model at -c 64, what dynamic batching buys; cores: batch 1 on one core and on two")
    parser.add_argument("--seconds", type=float, default=8, help="hey's duration per case per round")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (A, B, C, A, B, C, ...)")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="hey -c (default 16; 64 for compute, 32 for cores)")
    parser.add_argument("--warmup", type=float, default=1, help="seconds of hey per case before the rounds")
    parser.add_argument("--pin", action="store_true", help="servers on core 0, hey on core 1 (taskset); "
                        "not for --scenario cores, which pins its one-core case itself")
    parser.add_argument("--no-triton", action="store_true", help="skip PyTriton even when it is installed")
    parser.add_argument("--pytriton-python", default=os.environ.get("PYTRITON_PYTHON", sys.executable),
                        help="an interpreter that imports pytriton and torch (default $PYTRITON_PYTHON, else "
                             "this one); the module docstring says how to make one")
    parser.add_argument("--baseline", metavar="GIT-REF",
                        help="protocols scenario: also serve our server as it was at this commit, and add a "
                             "'vs REF' column")
    parser.add_argument("--tuned", action="store_true",
                        help=f"protocols scenario: also serve ours with {TUNED} (no access line) beside its "
                             "defaults, and add a 'vs tuned' column")
    parser.add_argument("--log-format", choices=("text", "json"), default="text",
                        help="protocols scenario: our servers' SMSERVE_LOG_FORMAT (every one of them: with --tuned, "
                             "'vs tuned' is then what the JSON access line costs)")
    parser.add_argument("--protocols", default="npy,json,v2",
                        help="protocols scenario: our rows' protocols, comma-separated from npy, json, v2")
    parser.add_argument("--no-flask", action="store_true", help="skip the bare Flask peer")
    args = parser.parse_args()
    if shutil.which("hey") is None:
        sys.exit("bench_peers needs hey: apt-get install -y hey")
    if (args.pin or args.scenario == "cores") and (shutil.which("taskset") is None
                                                   or len(os.sched_getaffinity(0)) < 2):
        sys.exit("pinning needs taskset and two usable cores")
    if (args.baseline or args.tuned or args.log_format != "text") and args.scenario != "protocols":
        sys.exit("--baseline, --tuned and --log-format are for --scenario protocols")
    if not set(args.protocols.split(",")) <= set(PROTOCOLS):
        sys.exit(f"--protocols: a comma-separated list of {', '.join(PROTOCOLS)}")
    if args.pin and args.scenario == "cores":
        sys.exit("--scenario cores pins its one-core case itself; drop --pin")
    work = Path(tempfile.mkdtemp(prefix="bench_peers_"))
    try:
        SCENARIOS[args.scenario](args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

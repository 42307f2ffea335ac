"""`make compat-check`: will my model answer here as it does in AWS's PyTorch containers?

    python -m local_test.compat_check MODEL REQUESTS [--concurrency N] [--repeat K] [--env K=V ...]

MODEL is a model.tar.gz or a model folder (its code/ holding the script); REQUESTS a
folder of request bodies. The model is served twice, each side loading the script once:
by the AWS toolkit's own handler as TorchServe drives it (local_test/
compat_check_reference.py: the reference), and by this server (a real gunicorn,
local_test/server_process.py). Every request file is sent to both, and a table shows
status, Content-Type and answer side by side with the first difference. Exit 0 when
every answer matches, 1 when one differs.

A file's Content-Type comes from its extension (.json, .csv, .npy, .txt, .png, .jpg,
...), and no Accept header is sent; `manifest.json` in the folder overrides either:
`{"file.csv": {"content_type": "text/csv", "accept": "application/json"}}`.

Equal means: the same status; for answers both sides refused (4xx/5xx) nothing more,
since each server words its errors its own way (docs/migrating.md); else the same
media type (parameters such as charset aside) and the same answer as that type reads:
JSON as its parsed value, CSV field by field, .npy as its array, numbers within
--rtol/--atol; any other type byte for byte.

The environment this runs in reaches both sides (SAGEMAKER_PROGRAM, say); --env only
this server (its settings: SAGEMAKER_TS_BATCH_SIZE=8, SMSERVE_MAX_BATCH_SIZE=...). The
reference serves one request at a time, as the containers' default batch size of 1 does.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import requests

from local_test.server_process import HTTPProcess, ServerProcess, free_port, passes_and_records

REFERENCE = Path(__file__).with_name("compat_check_reference.py")
MANIFEST = "manifest.json"
TYPES = {".json": "application/json", ".csv": "text/csv", ".npy": "application/x-npy", ".txt": "text/plain",
         ".jsonl": "application/jsonlines", ".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
         ".bin": "application/octet-stream"}
CELL = 32  # characters of an answer the table shows
# float32 answers from two processes (thread counts, batch shapes) differ in their last bits
RTOL, ATOL = 1e-4, 1e-5


@dataclass
class Request:
    name: str
    body: bytes
    content_type: str
    accept: str | None


@dataclass
class Answer:
    status: int
    content_type: str
    body: bytes


@dataclass
class Trial:
    """One way to run this server against the reference: its settings (env: this server
    only) and how the requests go to both sides. Written as the CLI's options: str()."""
    env: dict[str, str] = field(default_factory=dict)
    concurrency: int = 1
    repeat: int = 1

    def __str__(self) -> str:
        options = [f"--env {k}={v}" for k, v in self.env.items()]
        options += [f"--{name} {n}" for name, n in (("concurrency", self.concurrency), ("repeat", self.repeat)) if n != 1]
        return " ".join(options) or "as is"


@dataclass
class Outcome:
    """A trial's answers: table rows, and what this server said of batching (our_batching)."""
    trial: Trial
    rows: list[tuple[str, Answer, Answer, str | None]]
    batching: str

    @property
    def equal(self) -> bool:
        return all(diff is None for *_, diff in self.rows)

    def report(self) -> str:
        """What the CLI prints: the table, the batching line and the count of equal answers."""
        differing = sum(diff is not None for *_, diff in self.rows)
        return (f"{table(self.rows)}\n\n{self.batching}\n\n{len(self.rows) - differing} of {len(self.rows)} answers equal"
                + ("" if self.equal else f"; {differing} differ"))


def load_requests(folder: Path) -> list[Request]:
    manifest = json.loads((folder / MANIFEST).read_text()) if (folder / MANIFEST).exists() else {}
    found = []
    for path in sorted(p for p in folder.iterdir() if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")):
        entry = manifest.get(path.name, {})
        content_type = entry.get("content_type") or TYPES.get(path.suffix.lower())
        if not content_type:
            raise SystemExit(f"{path.name}: no Content-Type for {path.suffix!r}; name it in {MANIFEST}")
        found.append(Request(path.name, path.read_bytes(), content_type, entry.get("accept")))
    if not found:
        raise SystemExit(f"no request files in {folder}")
    return found


def model_folder(model: Path, scratch: Path) -> Path:
    """The model as a folder: a model.tar.gz is unpacked, as SageMaker does, into scratch."""
    if model.is_dir():
        return model
    out = scratch / "model"
    with tarfile.open(model) as archive:
        archive.extractall(out, filter="data")
    return out


def send(url: str, request: Request) -> Answer:
    headers = {"Content-Type": request.content_type, "Accept": request.accept}  # None: not sent
    try:
        response = requests.post(url + "/invocations", data=request.body, headers=headers, timeout=120)
    except requests.RequestException as e:  # a side that died or hung is a row of the table too
        return Answer(0, "", f"no answer: {e}".encode())
    return Answer(response.status_code, response.headers.get("Content-Type", ""), response.content)


def media_type(content_type: str) -> str:
    return content_type.split(";")[0].strip().lower()


def first_difference(ref: Answer, ours: Answer, rtol: float, atol: float) -> str | None:
    """None when the answers are equal (module docstring), else the first difference."""
    if ref.status != ours.status:
        return f"status {ref.status} vs {ours.status}"
    if ref.status >= 400:
        return None
    if media_type(ref.content_type) != media_type(ours.content_type):
        return f"Content-Type {ref.content_type!r} vs {ours.content_type!r}"
    kind = media_type(ref.content_type)
    if kind == "application/x-npy":
        return _differ_npy(ref.body, ours.body, rtol, atol)
    if kind == "text/csv":
        return _differ_csv(ref.body, ours.body, rtol, atol)
    try:
        return _differ_values(json.loads(ref.body), json.loads(ours.body), "$", rtol, atol)
    except ValueError:
        pass
    if ref.body == ours.body:
        return None
    at = next((i for i, (a, b) in enumerate(zip(ref.body, ours.body)) if a != b), min(len(ref.body), len(ours.body)))
    return f"byte {at}: {ref.body[at:at + 12]!r} vs {ours.body[at:at + 12]!r}"


def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    return math.isclose(a, b, rel_tol=rtol, abs_tol=atol) or (math.isnan(a) and math.isnan(b))


def _differ_values(a, b, where: str, rtol: float, atol: float) -> str | None:
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return None if _close(a, b, rtol, atol) else f"{where}: {a!r} vs {b!r}"
    if type(a) is not type(b):
        return f"{where}: {_short(json.dumps(a))} vs {_short(json.dumps(b))}"
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} items vs {len(b)}"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := _differ_values(x, y, f"{where}[{i}]", rtol, atol))), None)
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return f"{where}: keys {sorted(a)} vs {sorted(b)}"
        return next((d for k in a if (d := _differ_values(a[k], b[k], f"{where}.{k}", rtol, atol))), None)
    return None if a == b else f"{where}: {a!r} vs {b!r}"


def _differ_csv(a: bytes, b: bytes, rtol: float, atol: float) -> str | None:
    rows_a, rows_b = a.decode(errors="replace").splitlines(), b.decode(errors="replace").splitlines()
    if len(rows_a) != len(rows_b):
        return f"{len(rows_a)} CSV lines vs {len(rows_b)}"
    for line, (row_a, row_b) in enumerate(zip(rows_a, rows_b), 1):
        fields_a, fields_b = row_a.split(","), row_b.split(",")
        if len(fields_a) != len(fields_b):
            return f"line {line}: {len(fields_a)} fields vs {len(fields_b)}"
        for column, (x, y) in enumerate(zip(fields_a, fields_b), 1):
            try:
                same = _close(float(x), float(y), rtol, atol)
            except ValueError:
                same = x.strip() == y.strip()
            if not same:
                return f"line {line} field {column}: {x!r} vs {y!r}"
    return None


def _differ_npy(a: bytes, b: bytes, rtol: float, atol: float) -> str | None:
    try:
        x, y = np.load(io.BytesIO(a), allow_pickle=False), np.load(io.BytesIO(b), allow_pickle=False)
    except ValueError as e:
        return f"not .npy: {e}"
    if x.shape != y.shape:
        return f"shape {x.shape} vs {y.shape}"
    if x.dtype.kind in "fc" or y.dtype.kind in "fc":
        bad = ~np.isclose(x, y, rtol=rtol, atol=atol, equal_nan=True)
    else:
        bad = x != y
    if not bad.any():
        return None
    at = tuple(int(i) for i in np.argwhere(bad)[0])
    return f"{list(at)}: {x[at]!r} vs {y[at]!r}"


def _short(text: str, width: int = CELL) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[:width - 3] + "..."


def _shown(answer: Answer) -> str:
    if media_type(answer.content_type) == "application/x-npy":
        try:
            array = np.load(io.BytesIO(answer.body), allow_pickle=False)
            return _short(f"npy {array.dtype}{list(array.shape)} {array.ravel()[:4].tolist()}")
        except ValueError:
            pass
    return _short(answer.body.decode(errors="replace"))


def table(rows: list[tuple[str, Answer, Answer, str | None]]) -> str:
    head = ("request", "toolkit", "here", "toolkit answer", "here answer", "result")
    lines = []
    for name, ref, ours, diff in rows:
        lines.append((name, f"{ref.status} {media_type(ref.content_type)}", f"{ours.status} {media_type(ours.content_type)}",
                      _shown(ref), _shown(ours), "equal" if diff is None else f"DIFFERS: {diff}"))
    widths = [max(len(str(r[i])) for r in [head, *lines]) for i in range(len(head) - 1)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in [head, *lines])


def run(model: Path, requests_dir: Path, trials: Sequence[Trial] = (Trial(),), rtol: float = RTOL, atol: float = ATOL,
        logs: Path | None = None) -> list[Outcome]:
    """An Outcome per trial, in their order. The reference is started once and answers
    every trial in turn (its settings are the same in each); this server once per trial,
    with that trial's env, so no two trials share one. All of them start together, and
    all are stopped before it returns. Logs: toolkit.log, and here.log (one trial) or
    here-1.log, here-2.log, ... (several)."""
    todo = load_requests(requests_dir)
    with tempfile.TemporaryDirectory(prefix="compat-check-") as scratch:
        scratch = Path(scratch)
        logs = logs or scratch
        folder = model_folder(model, scratch).resolve()
        port = free_port()
        # -P: nothing of this checkout's on the script's import path, only what the DLC's
        # start script puts first there, the script's folder (torchserve._set_python_path).
        reference = HTTPProcess([sys.executable, "-P", str(REFERENCE), str(folder), str(port)], {
            **os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder / "code"), os.environ.get("PYTHONPATH")])),
        }, f"http://127.0.0.1:{port}", "/ping", logs / "toolkit.log", cwd=folder)
        ours = [ServerProcess(folder, env=trial.env, log_path=logs / ("here.log" if len(trials) == 1 else f"here-{i}.log"))
                for i, trial in enumerate(trials, 1)]
        started = []
        try:
            for side in (reference, *ours):
                started.append(side.start(wait=False))
            for side in started:
                side.wait_ready(timeout=300)
            outcomes = [run_trial(reference, server, trial, todo, rtol, atol) for server, trial in zip(ours, trials)]
        finally:
            for side in started:
                side.terminate(timeout=20)
    return outcomes


def run_trial(reference: HTTPProcess, ours: ServerProcess, trial: Trial, todo: list[Request], rtol: float,
              atol: float) -> Outcome:
    """Every request, trial.repeat times, trial.concurrency at a time: all to the
    reference, then all to this server."""
    work = [r for r in todo for _ in range(trial.repeat)]
    with ThreadPoolExecutor(trial.concurrency) as pool:
        ref_answers = list(pool.map(lambda r: send(reference.url, r), work))
        our_answers = list(pool.map(lambda r: send(ours.url, r), work))
    batching = our_batching(ours.url, ours.log_path, len(work))
    rows = [(r.name, a, b, first_difference(a, b, rtol, atol)) for r, a, b in zip(work, ref_answers, our_answers)]
    return Outcome(trial, rows, batching)


def our_batching(url: str, log: Path, sent: int) -> str:
    """What this server said of batching at start (and later, if a trial turned it off),
    and how many forward passes its answers took: fewer passes than requests is batching."""
    said = [line.split("batching", 1)[1].strip(" :") for line in log.read_text(errors="replace").splitlines()
            if "batching: " in line or "batching off: " in line]
    deadline = time.monotonic() + 5
    passes, records = passes_and_records(url)
    while passes == 0 and time.monotonic() < deadline:  # other workers write their counts each second
        time.sleep(0.2)
        passes, records = passes_and_records(url)
    return (f"this server: {sent} requests in {int(passes)} forward passes ({int(records)} records); "
            f"batching {' / '.join(said) or 'not said'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="compat-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="model.tar.gz or model folder")
    parser.add_argument("requests", type=Path, help="folder of request files (and an optional manifest.json)")
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight at once, on each side")
    parser.add_argument("--repeat", type=int, default=1, help="send each request this many times")
    parser.add_argument("--env", action="append", default=[], metavar="K=V", help="a setting for this server only")
    parser.add_argument("--rtol", type=float, default=RTOL, help="relative tolerance for numbers (%(default)s)")
    parser.add_argument("--atol", type=float, default=ATOL, help="absolute tolerance for numbers (%(default)s)")
    parser.add_argument("--logs", type=Path, help="folder to keep both sides' logs in (toolkit.log, here.log)")
    args = parser.parse_args(argv)
    if any("=" not in e for e in args.env):
        parser.error("--env takes K=V")
    if args.concurrency < 1 or args.repeat < 1:
        parser.error("--concurrency and --repeat are at least 1")
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
    trial = Trial(dict(e.split("=", 1) for e in args.env), args.concurrency, args.repeat)
    [outcome] = run(args.model, args.requests, [trial], args.rtol, args.atol, args.logs)
    print(outcome.report())
    return 0 if outcome.equal else 1


if __name__ == "__main__":
    sys.exit(main())

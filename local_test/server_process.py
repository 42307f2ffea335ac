"""The real server as a subprocess (`container/serve serve` on a free port), for tests and
benchmarks; HTTPProcess, which it is, also runs the benchmarks' peer servers."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import requests

ROOT = Path(__file__).resolve().parent.parent
SERVE = ROOT / "container" / "serve"
EXAMPLE_MODEL = ROOT / "build" / "model"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HTTPProcess:
    """A command serving HTTP on a port, as a subprocess; ready once `ready_path` answers
    200. Its own session, so the whole tree (gunicorn and its workers, tritonserver
    under PyTriton) is stopped as one group."""

    def __init__(self, cmd: list[str], env: dict[str, str], url: str, ready_path: str = "/ping",
                 log_path: Path | None = None, cwd: Path | None = None):
        self.cmd, self.env, self.cwd = cmd, env, cwd
        self.url, self.ready_path, self.log_path = url, ready_path, log_path
        self.proc: subprocess.Popen | None = None
        self._group_killed = False

    def start(self, wait: bool = True, timeout: float = 120) -> "HTTPProcess":
        """Starts the command and, with wait, returns once it is ready. If it never
        gets there (it exits, hangs, or anything raises, Ctrl-C included), it is
        stopped before the error propagates: a caller never owns a half-started one."""
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = self._spawn(log)
        finally:
            if log is not subprocess.DEVNULL:
                log.close()  # the child holds its own copy
        if wait:
            try:
                self.wait_ready(timeout)
            except BaseException:
                self.terminate(timeout=10)
                raise
        return self

    def _spawn(self, log) -> subprocess.Popen:
        return subprocess.Popen(self.cmd, env=self.env, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if requests.get(self.url + self.ready_path, timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                # Not listening yet, or too busy loading to answer within 2 s: both
                # mean "not ready", not "broken"; the deadline decides.
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready in {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def terminate(self, timeout: float = 40) -> int | None:
        """SIGTERM, then SIGKILL to the whole process group after timeout; idempotent."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        if not self._group_killed:
            # Workers can outlive a master that was killed or crashed; the group takes them too.
            self._group_killed = True
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return code if code is not None else self.proc.wait()

    def __enter__(self) -> "HTTPProcess":
        return self if self.proc else self.start()

    def __exit__(self, *exc) -> None:
        self.terminate()


class ServerProcess(HTTPProcess):
    """`container/serve serve` as a subprocess: the real gunicorn, on a free port."""

    # The test suite's fork server (tests/helpers/fork_server.py), where set: it starts
    # a server without importing torch again, or declines (None) and Popen starts it.
    forker: Callable[..., Any] | None = None

    def __init__(self, model_dir: Path | str, env: dict[str, str] | None = None, log_path: Path | None = None,
                 serve: Path | None = None):
        """serve: another checkout's container/serve (a benchmark's earlier version)."""
        self.serve = serve or SERVE
        self.port = free_port()
        super().__init__([sys.executable, str(self.serve), "serve"], {
            **os.environ,
            "SM_MODEL_DIR": str(model_dir),
            "SAGEMAKER_BIND_TO_PORT": str(self.port),
            "SAGEMAKER_MODEL_SERVER_WORKERS": "1",
            "SMSERVE_TORCH_THREADS": "1",
            **(env or {}),
        }, f"http://127.0.0.1:{self.port}", "/ping", log_path)

    def _spawn(self, log):
        forked = self.forker(self.cmd, self.env, self.cwd, log) if self.forker and self.serve == SERVE else None
        return forked or super()._spawn(log)


def copy_model(src: Path, dst: Path, inference_py: str | None = None) -> Path:
    """A copy of a model dir, optionally with a code/inference.py of hooks."""
    shutil.copytree(src, dst)
    if inference_py is not None:
        (dst / "code").mkdir(exist_ok=True)
        (dst / "code" / "inference.py").write_text(inference_py)
    return dst


def passes_and_records(url: str, model: str | None = None) -> tuple[int, int]:
    """(forward passes, records inferred) so far, of one model or of all, over every
    worker (its /metrics): their ratio is the mean batch size. A scrape has the answering
    worker's counts exact and the others' at most a second old."""
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(url + "/metrics", timeout=10).text
    totals = {"smserve_batches_total": 0.0, "smserve_inferences_total": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals and model in (None, sample.labels.get("model")):
                totals[sample.name] += sample.value
    return int(totals["smserve_batches_total"]), int(totals["smserve_inferences_total"])

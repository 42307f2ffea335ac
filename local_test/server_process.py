"""The real server as a subprocess (`container/serve serve` on a free port), for tests and benchmarks."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
SERVE = ROOT / "container" / "serve"
EXAMPLE_MODEL = ROOT / "build" / "model"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`container/serve serve` as a subprocess: the real gunicorn, on a free port."""

    def __init__(self, model_dir: Path | str, env: dict[str, str] | None = None, log_path: Path | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "SM_MODEL_DIR": str(model_dir),
            "SAGEMAKER_BIND_TO_PORT": str(self.port),
            "SAGEMAKER_MODEL_SERVER_WORKERS": "1",
            "SMSERVE_TORCH_THREADS": "1",
            **(env or {}),
        }
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self, wait: bool = True, timeout: float = 120) -> "ServerProcess":
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen([sys.executable, str(SERVE), "serve"], env=self.env, stdout=log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if requests.get(self.url + "/ping", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready in {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def terminate(self, timeout: float = 40) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def __enter__(self) -> "ServerProcess":
        return self if self.proc else self.start()

    def __exit__(self, *exc) -> None:
        self.terminate()


def copy_model(src: Path, dst: Path, inference_py: str | None = None) -> Path:
    """A copy of a model dir, optionally with a code/inference.py of hooks."""
    shutil.copytree(src, dst)
    if inference_py is not None:
        (dst / "code").mkdir(exist_ok=True)
        (dst / "code" / "inference.py").write_text(inference_py)
    return dst

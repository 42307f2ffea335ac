"""Helpers for the image tests: podman commands, the torch wheel, one running container.

podman rather than docker because the build mounts the local torch wheel with
`podman build -v`, which docker build cannot do, and because it needs no daemon.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import os
import re
import socket
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
ENGINE = "podman"
BASE_IMAGE = "localhost/bookworm-python:3.11"
# Tagged IMAGE:test-<key>, the key a hash of everything the build reads (image_key).
IMAGE = "localhost/sagemaker-pytorch-byoc"
CONTAINER_PORT = 8080
BUILD_TIMEOUT_S = 1800


def run(args, timeout=120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def podman_problem() -> str | None:
    if shutil.which(ENGINE) is None:
        return "podman is not installed (scripts/setup_podman.sh installs it)"
    info = run([ENGINE, "info"], timeout=60)
    if info.returncode != 0:
        return f"podman cannot run here: {last_line(info.stderr)}"
    return None


def torch_version() -> str:
    """The torch the project pins, so the image runs what the tests run."""
    text = (REPO / "requirements-dev.txt").read_text()
    return re.search(r"^torch==(\S+)", text, re.MULTILINE).group(1)


def local_torch_wheel_dir(version: str) -> str | None:
    candidates = [os.environ.get("TORCH_WHEEL_DIR", "")] + os.environ.get("PIP_FIND_LINKS", "").split()
    for directory in filter(None, candidates):
        if glob.glob(os.path.join(directory, f"torch-{version}+cpu-cp311-*.whl")):
            return os.path.abspath(directory)
    return None


def image_key(build_args: list[str], base_image_id: str) -> str | None:
    """A hash of what `podman build` reads: the build arguments, the base image's ID, the
    Dockerfile, every file .dockerignore lets into the context (path, mode, bytes) and
    the names and sizes of the wheels a --volume mounts. The same key means podman's own
    cache would give the same image, so the tests use the one tagged with it instead of
    asking podman: podman checks `COPY --from=builder /opt/venv` by hashing the whole
    venv (torch included), about 20 CPU-seconds even when every layer is cached.
    None when .dockerignore is not the allowlist this reads (`*`, then `!path` lines and
    `**/name` exclusions): then the tests always build."""
    rules = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.strip().startswith("#")]
    if not rules or rules[0] != "*":
        return None
    included = [rule[1:].rstrip("/") for rule in rules[1:] if rule.startswith("!")]
    excluded = [rule[3:] for rule in rules[1:] if rule.startswith("**/")]
    if len(included) + len(excluded) != len(rules) - 1 or any("*" in path for path in included):
        return None

    digest = hashlib.sha256()

    def add(*parts: str | bytes) -> None:
        for part in parts:
            digest.update(part if isinstance(part, bytes) else part.encode())
            digest.update(b"\0")

    add(*build_args, base_image_id, (REPO / "Dockerfile").read_bytes(), (REPO / ".dockerignore").read_bytes())
    files = []
    for path in map(REPO.joinpath, included):
        if path.is_dir():
            for root, dirs, names in os.walk(path):
                dirs[:] = [d for d in dirs if not any(fnmatch.fnmatch(d, pattern) for pattern in excluded)]
                files += [Path(root, n) for n in names if not any(fnmatch.fnmatch(n, pattern) for pattern in excluded)]
        else:
            files.append(path)
    for path in sorted(files):
        add(str(path.relative_to(REPO)), oct(path.lstat().st_mode))
        add(os.readlink(path) if path.is_symlink() else path.read_bytes())
    for i, arg in enumerate(build_args):
        if i and build_args[i - 1] == "--volume":
            mounted = arg.split(":")[0]
            for wheel in sorted(glob.glob(os.path.join(mounted, "*.whl"))):
                add(os.path.basename(wheel), str(os.path.getsize(wheel)))
    return digest.hexdigest()[:16]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Container:
    """One `IMAGE serve` container with a model directory mounted read-only at `mount`
    (/opt/ml/model; a multi-model endpoint's models are under /opt/ml/models), as
    SageMaker runs it. Not started with --rm, so that its exit code and log outlive it;
    close() removes it."""

    def __init__(self, engine: str, image: str, model_dir: Path, env: dict[str, str] | None = None,
                 mount: str = "/opt/ml/model"):
        self.engine = engine
        self.image = image
        self.model_dir = model_dir
        self.mount = mount
        self.env = dict(env or {})
        self.name = f"smserve-test-{uuid.uuid4().hex[:12]}"
        self.port = free_port()

    def start(self) -> "Container":
        common = ["--detach", "--name", self.name, "--volume", f"{self.model_dir}:{self.mount}:ro"]
        env = [arg for key, value in self.env.items() for arg in ("--env", f"{key}={value}")]
        published = run([self.engine, "run", *common, *env,
                          "--publish", f"127.0.0.1:{self.port}:{CONTAINER_PORT}", self.image, "serve"])
        if published.returncode != 0:
            # Sandboxes without a usable container network still allow the host's;
            # the server then binds the free port itself.
            run([self.engine, "rm", "--force", self.name])
            env += ["--env", f"SAGEMAKER_BIND_TO_PORT={self.port}"]
            hosted = run([self.engine, "run", *common, *env, "--network", "host", self.image, "serve"])
            if hosted.returncode != 0:
                pytest.fail(f"cannot start the container:\n{published.stderr}\n{hosted.stderr}")
        return self

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def state(self) -> dict[str, str]:
        out = run([self.engine, "inspect", "--format",
                    "{{.State.Status}} {{.State.ExitCode}}", self.name]).stdout.split()
        return {"status": out[0], "exit_code": out[1]} if len(out) == 2 else {"status": "gone", "exit_code": ""}

    def logs(self) -> str:
        out = run([self.engine, "logs", self.name])
        return out.stdout + out.stderr

    def wait_ready(self, timeout_s: float = 180) -> None:
        """Until /ping answers 200: the worker has loaded and warmed the model."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                status = requests.get(self.url("/ping"), timeout=2).status_code
            except (requests.ConnectionError, requests.Timeout):
                # Not listening yet, or listening but taking no connection yet (a
                # multi-model server while its workers start): not ready either way.
                status = None
            if status == 200:
                return
            if status == 500:
                pytest.fail(f"the model failed to load:\n{self.logs()[-6000:]}")
            if self.state()["status"] not in ("running", "created", "configured"):
                pytest.fail(f"the container stopped before it was ready: {self.state()}\n{self.logs()[-4000:]}")
            time.sleep(0.5)
        pytest.fail(f"/ping did not answer 200 within {timeout_s}s:\n{self.logs()[-4000:]}")

    def stop(self, timeout_s: int = 30) -> subprocess.CompletedProcess:
        """SIGTERM, then SIGKILL after timeout_s, as SageMaker does (30 s)."""
        return run([self.engine, "stop", "--time", str(timeout_s), self.name], timeout=timeout_s + 60)

    def close(self) -> None:
        run([self.engine, "rm", "--force", self.name], timeout=120)



"""Starting bench_peers' servers other than ours: the peers in bench/peers/, each one
worker with one torch thread, optionally pinned to a core."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from local_test.server_process import HTTPProcess, free_port  # noqa: E402

PEERS = Path(__file__).resolve().parent / "peers"


@contextlib.contextmanager
def pinned(core: int | None):
    """Processes started inside inherit this CPU set (and pass it to their children)."""
    if core is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def one_thread_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def start_peer(model_dir: Path, work: Path, workers: int = 1, label: str = "flask") -> HTTPProcess:
    port = free_port()
    gunicorn = str(Path(sys.executable).with_name("gunicorn"))
    return HTTPProcess([gunicorn, "-k", "gevent", "-w", str(workers), "-b", f"127.0.0.1:{port}", "--chdir", str(PEERS),
                        "flask_app:app"], {**one_thread_env(), "PEER_MODEL_DIR": str(model_dir)},
                       f"http://127.0.0.1:{port}", "/ping", work / f"{label}.log").start(timeout=120)


def start_ceiling(model_dir: Path, work: Path, label: str = "ceiling") -> HTTPProcess:
    port = free_port()
    return HTTPProcess([sys.executable, str(PEERS / "raw_asyncio.py"), str(port)],
                       {**one_thread_env(), "PEER_MODEL_DIR": str(model_dir)}, f"http://127.0.0.1:{port}", "/ping",
                       work / f"{label}.log").start(timeout=120)


def triton_env() -> dict:
    """PyTriton's Triton binary links libpython: the interpreter's LIBDIR goes on the path."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    return {**one_thread_env(),
            "LD_LIBRARY_PATH": os.pathsep.join(p for p in (libdir, os.environ.get("LD_LIBRARY_PATH", "")) if p)}


def pytriton_importable(python: str, env: dict) -> bool:
    return subprocess.run([python, "-c", "import pytriton.triton, torch"], env=env, capture_output=True).returncode == 0


def start_triton(python: str, model_dir: Path, work: Path, env: dict, label: str = "pytriton",
                 model_name: str = "mlp") -> HTTPProcess:
    """bench/peers/pytriton_app.py; it serves the model as `mlp`."""
    ports = [free_port() for _ in range(3)]
    env = {**env, "PEER_MODEL_DIR": str(model_dir)}
    return HTTPProcess([python, str(PEERS / "pytriton_app.py"), *map(str, ports)], env, f"http://127.0.0.1:{ports[0]}",
                       f"/v2/models/{model_name}/ready", work / f"{label}.log").start(timeout=180)

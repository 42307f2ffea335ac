"""The suite's fork server: one process per pytest process that imports what every
server's processes import (torch and the torch.export loader, numpy, flask, gevent,
gunicorn) once, then forks each test server from itself instead of starting a new
interpreter. A server's start then costs its own work, not seconds of CPU importing torch
again, and the suite starts about 180 of them on two cores.

What runs in the fork is `container/serve serve` itself: its checks, then gunicorn,
in-process where `serve` would exec it (the same argv, sys.path as the new interpreter's),
ending as an interpreter ends.
The differences from a new interpreter: torch is imported before the worker's gevent
patching (the master imports gevent and numpy before its fork in any case), and what a
library reads from the environment when it is imported was read from the environment
the fork server started with. So only a server whose environment differs from that one
in the server's own settings (SM_*, SAGEMAKER_*, SMSERVE_*) and the tests' (TEST_*) is
forked; any other starts as a new interpreter, as does every server where
TEST_FORK_SERVER=0, and `serve`'s exec itself is tested in the image's tests
(tests/container).

Protocol, on a Unix socket: the client sends one JSON line (argv, env, cwd) with three
file descriptors (stdin, stdout, stderr) attached; the server answers the child's pid,
then, when it has ended, its wait status, each on a line.
"""

from __future__ import annotations

import array
import atexit
import functools
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVE = ROOT / "container" / "serve"
# The environment keys a forked server's may differ in from the fork server's: the
# server's settings, which it reads after the fork (settings.py), and the tests' own
# (TEST_*), which their hook scripts read when a worker loads them.
OWN_PREFIXES = ("SM_", "SAGEMAKER_", "SMSERVE_", "TEST_")
# And these, which nothing the fork server imported reads at import: pytest's name of the
# running test; torch's compile cache folder, read when it compiles (importing
# torch.export's loader sets it to its default); Intel OpenMP's, which scikit-learn sets
# when a test imports it (torch's CPU build uses GNU OpenMP, numpy's OpenBLAS its own threads).
NEUTRAL = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR", "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"}
DISABLE = "TEST_FORK_SERVER"


# ------------------------------------------------------------------ the server process

def preload() -> None:
    """What a worker imports before it serves (torch.export's loader pulls in a thousand
    modules more than torch), minus what reads the environment it is imported in
    (prometheus_client) and this project's own modules (each server imports them as they
    are on disk, as a new interpreter would)."""
    import flask  # noqa: F401
    import gevent  # noqa: F401
    import gunicorn.app.wsgiapp  # noqa: F401
    import gunicorn.arbiter  # noqa: F401
    import numpy  # noqa: F401
    import torch.export.pt2_archive._package  # noqa: F401


def main(path: str) -> None:
    preload()
    # sys.path as a new interpreter starts with it, less its first entry and PYTHONPATH's.
    own = set(filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    default_path = [p for p in sys.path[1:] if p not in own]
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    children: dict[int, socket.socket] = {}
    with selectors.DefaultSelector() as selector:
        selector.register(listener, selectors.EVENT_READ, "accept")
        selector.register(wake_r, selectors.EVENT_READ, "reap")
        selector.register(sys.stdin, selectors.EVENT_READ, "parent")  # EOF: the pytest process is gone
        print("ready", flush=True)
        while True:
            for key, _ in selector.select():
                if key.data == "accept":
                    conn, _ = listener.accept()
                    try:
                        request, fds = _receive(conn)
                    except (OSError, ValueError):
                        conn.close()
                        continue
                    pid = os.fork()
                    if pid == 0:
                        # Nothing of the fork server's own survives into the server.
                        signal.set_wakeup_fd(-1)
                        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                        selector.close()
                        for sock in (listener, conn, *children.values()):
                            sock.close()
                        os.close(wake_r)
                        os.close(wake_w)
                        raise SystemExit(_child(request, fds, default_path))
                    for fd in fds:
                        os.close(fd)
                    children[pid] = conn
                    conn.sendall(f"{pid}\n".encode())
                elif key.data == "reap":
                    try:
                        while os.read(wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                    _reap(children)
                else:
                    for pid in children:
                        _kill_group(pid)
                    return


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    conn.settimeout(10)
    fds = array.array("i")
    data = b""
    while not data.endswith(b"\n"):
        chunk, ancillary, _, _ = conn.recvmsg(1 << 16, socket.CMSG_LEN(3 * fds.itemsize))
        if not chunk:
            raise ConnectionError("the client went away mid-request")
        data += chunk
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    conn.settimeout(None)
    return json.loads(data), list(fds)


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(f"{status}\n".encode())
            except OSError:
                pass
            conn.close()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _child(request: dict, fds: list[int], default_path: list[str]) -> int:
    """In the fork: becomes `serve serve` with the request's environment, as a new session
    (start_new_session), and returns its exit code."""
    os.setsid()
    for target, fd in enumerate(fds):  # stdin, stdout, stderr
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # found again from this environment's TMPDIR
    # The worker's gevent patching looks at every live object, torch's too when torch was
    # imported first, as here: torch.distributed's deprecated reduce_op warns when looked at.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"gevent\.monkey\.")
    sys.argv = request["argv"][1:]
    os.execv = functools.partial(_gunicorn_in_process, default_path)
    serve = runpy.run_path(str(SERVE), run_name="smserve_serve")
    return serve["main"](sys.argv)


def _gunicorn_in_process(default_path: list[str], executable: str, argv: list[str]) -> None:
    """`serve`'s os.execv of `python -m gunicorn ...`, done here: sys.path as the new
    interpreter's (the working folder, PYTHONPATH, the rest), then gunicorn as __main__."""
    if argv[1:3] != ["-m", "gunicorn"]:
        raise RuntimeError(f"the fork server runs `-m gunicorn` only, not {argv}")
    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    sys.path[:] = [os.getcwd(), *entries, *default_path]
    sys.argv = [argv[0], *argv[3:]]
    runpy.run_module("gunicorn", run_name="__main__", alter_sys=True)
    raise SystemExit(0)


# ------------------------------------------------------------------ the client side

class ForkedProcess:
    """A forked server as the subprocess.Popen the tests use: pid, poll, wait,
    send_signal, terminate, kill, returncode. Its wait status comes from the fork
    server, whose child it is."""

    def __init__(self, args: list[str], conn: socket.socket, pid: int):
        self.args, self.pid, self.returncode = args, pid, None
        self._conn, self._buffer = conn, b""

    def _read_status(self, timeout: float | None) -> bool:
        self._conn.settimeout(timeout)
        try:
            while not self._buffer.endswith(b"\n"):
                chunk = self._conn.recv(64)
                if not chunk:  # the fork server ended: its children went with it
                    self._buffer = f"{signal.SIGKILL}\n".encode()
                    break
                self._buffer += chunk
        except (TimeoutError, BlockingIOError):
            return False
        self.returncode = os.waitstatus_to_exitcode(int(self._buffer))
        self._conn.close()
        return True

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not self._read_status(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The client: starts the fork server on first use, with the environment given."""

    def __init__(self, env: dict[str, str]):
        self.env = dict(env)
        self._proc: subprocess.Popen | None = None
        self._path = ""
        self._lock = threading.Lock()

    def eligible(self, argv: list[str], env: dict[str, str]) -> bool:
        if argv != [sys.executable, str(SERVE), "serve"]:
            return False
        differing = (env.keys() ^ self.env.keys()) | {k for k in env.keys() & self.env.keys() if env[k] != self.env[k]}
        return all(key.startswith(OWN_PREFIXES) or key in NEUTRAL for key in differing)

    def _started(self) -> str:
        with self._lock:
            if self._proc is None:
                self._path = os.path.join(tempfile.mkdtemp(prefix="smserve-forks-"), "socket")
                self._proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.fork_server", self._path],
                                              cwd=ROOT, env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              start_new_session=True)
                if self._proc.stdout.readline() != b"ready\n":
                    raise RuntimeError(f"the fork server did not start (exit {self._proc.wait()})")
                atexit.register(self.close)
            return self._path

    def start(self, argv: list[str], env: dict[str, str], cwd: Path | None, log) -> ForkedProcess | None:
        """The server, forked; None where it must start as a new interpreter (or the fork
        server has ended)."""
        if env.get(DISABLE) == "0" or not self.eligible(argv, env):
            return None
        path = self._started()
        if self._proc.poll() is not None:
            return None
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(30)
        null = os.open(os.devnull, os.O_RDWR)
        try:
            out = null if log in (None, subprocess.DEVNULL) else log.fileno()
            conn.connect(path)
            request = json.dumps({"argv": argv, "env": env, "cwd": str(cwd or os.getcwd())}).encode() + b"\n"
            conn.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [null, out, out]))])
            pid = b""
            while not pid.endswith(b"\n"):
                chunk = conn.recv(1)
                if not chunk:
                    raise RuntimeError("the fork server ended before it forked")
                pid += chunk
        except BaseException:
            conn.close()
            raise
        finally:
            os.close(null)
        return ForkedProcess(argv, conn, int(pid))

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.close()  # it kills what it forked and ends
            self._proc.wait(30)


if __name__ == "__main__":
    main(sys.argv[1])

"""The suite's fork server: one process per pytest process that imports what every
server's processes import (torch and the torch.export loader, numpy, flask, gevent,
gunicorn) once, then forks each test server from itself instead of starting a new
interpreter. A server's start then costs its own work, not seconds of CPU importing torch
again, and the suite starts about 180 of them on two cores.

What runs in the fork is `container/serve serve` itself: its checks, then gunicorn,
in-process where `serve` would exec it (the same argv, sys.path as the new interpreter's),
ending as an interpreter ends.

What differs from a new interpreter:
- torch is imported before the worker's gevent patching, not after: the locks and
  thread-locals torch makes when imported (dynamo's compile lock, its device context)
  are the threading module's own here and gevent's in production. So a server that
  compiles (SMSERVE_COMPILE) starts as a new interpreter, and the whole suite passes
  with TEST_FORK_SERVER=0 too (every server a new interpreter), which is the run that
  matches production. The master and its workers also hold a thousand modules of
  torch that production's master does not (and its worker imports itself).
- what a library reads from the environment when imported was read from the fork
  server's. So only a server whose environment differs from that one in the server's
  own settings (SM_*, SAGEMAKER_*, SMSERVE_*), in the tests' (TEST_*) and in NEUTRAL is
  forked; any other starts as a new interpreter.
- the hash seed is the fork server's (numpy's random state is seeded again, and
  Python's random module seeds itself after a fork).
`serve`'s exec itself is run by the image's tests (tests/container).

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
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

# (as local_test.server_process has them: importing it here would load it, and requests,
# into every forked server)
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
    me = os.getpid()
    before = dict(os.environ)
    preload()
    # What the imports set in the environment (torch's compile cache folder), which a new
    # interpreter's worker has too, and hands to the processes it starts.
    set_by_imports = {k: v for k, v in os.environ.items() if before.get(k) != v}
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
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(listener, selectors.EVENT_READ, "accept")
            selector.register(wake_r, selectors.EVENT_READ, "reap")
            selector.register(sys.stdin, selectors.EVENT_READ, "parent")  # EOF: the pytest process is gone
            print("ready", flush=True)
            while True:
                for key, _ in selector.select():
                    if key.data == "parent":
                        return
                    if key.data == "reap":
                        try:
                            while os.read(wake_r, 512):
                                pass
                        except BlockingIOError:
                            pass
                        _reap(children)
                        continue
                    try:
                        conn, _ = listener.accept()
                    except OSError:  # (out of descriptors) the client sees its connection refused
                        continue
                    try:
                        request, fds = _receive(conn)
                    except (OSError, ValueError) as e:
                        print(f"fork server: a request failed: {e!r}", file=sys.stderr, flush=True)
                        conn.close()
                        continue
                    try:
                        pid = os.fork()
                    except OSError as e:
                        print(f"fork server: could not fork: {e!r}", file=sys.stderr, flush=True)
                        for fd in fds:
                            os.close(fd)
                        conn.close()
                        continue
                    if pid == 0:
                        # Nothing of the fork server's own survives into the server.
                        signal.set_wakeup_fd(-1)
                        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                        selector.close()
                        for sock in (listener, conn, *children.values()):
                            sock.close()
                        os.close(wake_r)
                        os.close(wake_w)
                        raise SystemExit(_child(request, fds, default_path, set_by_imports))
                    for fd in fds:
                        os.close(fd)
                    children[pid] = conn
                    try:
                        conn.sendall(f"{pid}\n".encode())
                    except OSError:  # the client went away before it knew the pid: no one can stop it
                        _kill_group(pid)
    finally:
        # However this ends, nothing it started outlives it (their clients read the end as a kill).
        if os.getpid() == me:  # (in a child, its server's exit passes through here too)
            for pid in children:
                _kill_group(pid)


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """The request and its descriptors; on any failure none of them is left open."""
    conn.settimeout(10)
    fds = array.array("i")
    try:
        data = b""
        while not data.endswith(b"\n"):
            chunk, ancillary, _, _ = conn.recvmsg(1 << 16, socket.CMSG_LEN(3 * fds.itemsize))
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
            if not chunk:
                raise ConnectionError("the client went away mid-request")
            data += chunk
        request = json.loads(data)
        if len(fds) != 3:
            raise ValueError(f"{len(fds)} descriptors, not 3")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    conn.settimeout(None)
    return request, list(fds)


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
    """The child and its session: the child itself too, since it may not have begun its own
    session yet."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _child(request: dict, fds: list[int], default_path: list[str], set_by_imports: dict[str, str]) -> int:
    """In the fork: becomes `serve serve` with the request's environment, as a new session
    (start_new_session), and returns its exit code."""
    os.setsid()
    for target, fd in enumerate(fds):  # stdin, stdout, stderr
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({**set_by_imports, **request["env"]})
    tempfile.tempdir = None  # found again from this environment's TMPDIR
    import numpy.random

    numpy.random.seed()  # its own, as each new interpreter has (random reseeds itself at a fork)
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
        self._lock = threading.Lock()  # one reader of the status at a time (threads wait too)

    def _read_status(self, timeout: float | None) -> bool:
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            return False
        try:
            if self.returncode is not None:
                return True
            self._conn.settimeout(timeout)
            try:
                while not self._buffer.endswith(b"\n"):
                    chunk = self._conn.recv(64)
                    if not chunk:  # the fork server ended, and killed what it had forked
                        self._buffer = f"{signal.SIGKILL}\n".encode()
                        break
                    self._buffer += chunk
            except (TimeoutError, BlockingIOError):
                return False
            self.returncode = os.waitstatus_to_exitcode(int(self._buffer))
            self._conn.close()
            return True
        finally:
            self._lock.release()

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
        self._folder = self._path = ""
        self._died_told = False
        self._lock = threading.Lock()

    def eligible(self, argv: list[str], env: dict[str, str]) -> bool:
        if argv != [sys.executable, str(SERVE), "serve"]:
            return False
        if env.get("SMSERVE_COMPILE", "off").lower() != "off":
            return False  # compiling takes torch's own module-level locks: as they are in production
        differing = (env.keys() ^ self.env.keys()) | {k for k in env.keys() & self.env.keys() if env[k] != self.env[k]}
        return all(key.startswith(OWN_PREFIXES) or key in NEUTRAL for key in differing)

    def started(self) -> str:
        """The fork server's socket, the fork server started first if it is not yet."""
        with self._lock:
            if self._proc is None:
                self._folder = tempfile.mkdtemp(prefix="smserve-forks-")
                self._path = os.path.join(self._folder, "socket")
                with open(os.path.join(self._folder, "fork-server.log"), "wb") as log:
                    self._proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.fork_server", self._path],
                                                  cwd=ROOT, env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                  stderr=log, start_new_session=True)
                atexit.register(self.close)
                if self._proc.stdout.readline() != b"ready\n":
                    raise RuntimeError(f"the fork server did not start (exit {self._proc.wait()}):\n{self._log()}")
            return self._path

    def _log(self) -> str:
        try:
            with open(os.path.join(self._folder, "fork-server.log"), errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def start(self, argv: list[str], env: dict[str, str], cwd: Path | None, log) -> ForkedProcess | None:
        """The server, forked; None where it must start as a new interpreter (or the fork
        server has ended)."""
        if env.get(DISABLE) == "0" or not self.eligible(argv, env):
            return None
        path = self.started()
        if self._proc.poll() is not None:
            if not self._died_told:
                self._died_told = True
                warnings.warn(f"the fork server ended (exit {self._proc.returncode}); servers start as new "
                              f"interpreters from here:\n{self._log()}", stacklevel=2)
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
        if self._folder:
            shutil.rmtree(self._folder, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1])

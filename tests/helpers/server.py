"""The test server and what tests ask of it: ServerProcess and HTTPProcess (their home is
local_test/server_process.py, which compat_check and batch_example run too; in the tests a
server forks from fork_server.py's process), starting several side by side, their worker
processes, their /metrics, and waiting for a state by polling."""

from __future__ import annotations

import fcntl
import os
import re
import struct
import termios
import time
from typing import Callable, Iterable, TypeVar

import requests
from prometheus_client.parser import text_string_to_metric_families

from local_test import server_process
from local_test.server_process import (EXAMPLE_MODEL, ROOT, SERVE, HTTPProcess, ServerProcess, copy_model,
                                       free_port)

__all__ = ["EXAMPLE_MODEL", "ROOT", "SERVE", "HTTPProcess", "ServerProcess", "copy_model", "free_port",
           "start_all", "logged", "worker_pids", "descendants", "shm_held", "wait_until", "ws_url", "metric", "pending_requests",
           "passes_and_records", "listening", "all_read", "outgoing", "signal_pending", "log_lines"]

T = TypeVar("T")


def start_all(servers: Iterable[ServerProcess], timeout: float = 120) -> list[ServerProcess]:
    """Starts every server, then waits until each is ready: their loads overlap. If one
    never gets ready, all are stopped before the error propagates."""
    started: list[ServerProcess] = []
    try:
        for server in servers:
            started.append(server.start(wait=False))
        for server in started:
            server.wait_ready(timeout)
    except BaseException:
        for server in started:
            server.terminate(timeout=10)
        raise
    return started


def worker_pids(server: ServerProcess) -> set[int]:
    """The gunicorn master's children, from /proc (no psutil)."""
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields follow the last ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == server.proc.pid:
            pids.add(int(entry))
    return pids


def descendants(pid: int) -> set[int]:
    """Every live process under pid (its children, theirs, ...), from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def shm_held(pids) -> list[str]:
    """The /dev/shm files these processes hold open or mapped: a hook value's file has no
    name (O_TMPFILE), so what holds it is the only trace a leak leaves."""
    held = []
    for pid in pids:
        try:
            fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            with open(f"/proc/{pid}/maps") as f:
                maps = [line.split(None, 5)[-1].strip() for line in f if "/dev/shm/" in line]
        except OSError:  # ended meanwhile
            continue
        held += [f"{pid}: {target}" for target in fds + maps if target.startswith("/dev/shm/")]
    return held


def wait_until(probe: Callable[[], T], timeout: float = 10, interval: float = 0.02) -> T:
    """probe() once it returns something true, polled every interval; after timeout
    the last (false) value it returned."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def logged(server: ServerProcess, text: str, timeout: float = 10) -> bool:
    """Whether the server's log says text, within timeout: a worker writes its lines from
    a thread of its own, and may write one after the client has had its answer."""
    return bool(wait_until(lambda: text in server.log(), timeout=timeout))


def ws_url(server: ServerProcess, query: str = "", path: str = "/invocations-bidirectional-stream") -> str:
    """The server's WebSocket URL for a session."""
    return server.url.replace("http://", "ws://") + path + (f"?{query}" if query else "")


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    """A sample's value summed over every worker (its /metrics), of the samples whose labels
    include these."""
    text = requests.get(server.url + "/metrics", timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


def pending_requests(server: ServerProcess) -> int:
    """Requests the server holds now, queued for or in a forward pass, over every worker
    (each worker writes its count at least once a second)."""
    return int(metric(server, "smserve_pending_requests"))


def passes_and_records(server: ServerProcess, model: str) -> tuple[int, int]:
    """(forward passes, records inferred) of a model so far, over every worker."""
    return server_process.passes_and_records(server.url, model)


def _tcp_table() -> list[tuple[int, int, str, int, int]]:
    """Every TCP socket on the host, from /proc/net/tcp{,6}: (local port, remote port,
    state, bytes in its send queue, bytes in its receive queue not yet read)."""
    rows = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            tx, rx = (int(n, 16) for n in fields[4].split(":"))
            rows.append((int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16), fields[3], tx, rx))
    return rows


def listening(port: int) -> bool:
    """Whether a socket listens on port: after SIGTERM, no longer once the master and the
    worker have both closed theirs (the worker has begun its drain)."""
    return any(local == port and state == "0A" for local, _, state, _, _ in _tcp_table())


def all_read(server: ServerProcess, client) -> bool:
    """Whether every byte a client socket sent has left its kernel and been read by the
    server: the server's end of that connection holds nothing unread."""
    if outgoing(client):
        return False
    here = client.getsockname()[1]
    return any(local == server.port and remote == here and rx == 0 for local, remote, _, _, rx in _tcp_table())


def outgoing(client) -> int:
    """Bytes a client socket's kernel still holds, unsent or unacknowledged."""
    return struct.unpack("i", fcntl.ioctl(client.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]


def signal_pending(pid: int, signum: int) -> bool:
    """Whether a signal waits to be delivered to a process (a stopped one keeps it so)."""
    with open(f"/proc/{pid}/status") as f:
        masks = [int(line.split()[1], 16) for line in f if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(mask >> (signum - 1) & 1 for mask in masks)


def log_lines(log: str, level: str, message: str) -> list[str]:
    """A text-format log's lines at that level whose message holds `message`, whichever of
    the server's modules logged it: what is said is the contract, not where it is said."""
    pattern = re.compile(rf" {level} smserve(?:\.\w+)*: .*{re.escape(message)}")
    return [line for line in log.splitlines() if pattern.search(line)]

"""Shared by the benchmarks: request bodies for every content type, a keep-alive raw
HTTP client, `hey` run and its summary parsed, a /ping sampler for the time a load runs,
the worker processes seen from /proc, percentiles."""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from local_test.server_process import EXAMPLE_MODEL, ServerProcess  # noqa: E402,F401

SAGEMAKER_CT = "application/vnd.sagemaker-triton.binary+json;json-header-size="
IHCL = "Inference-Header-Content-Length"


def digits(rows: int, seed: int = 0) -> np.ndarray:
    """Pixel rows shaped like the example model's input (64 values in 0..16)."""
    return np.random.default_rng(seed).integers(0, 17, (rows, 64)).astype(np.float32)


# ---------------------------------------------------------------- bodies: (path, body, headers)


def json_body(x: np.ndarray):
    return "/invocations", json.dumps({"instances": x.tolist()}).encode(), {"Content-Type": "application/json"}


def csv_body(x: np.ndarray):
    text = "\n".join(",".join(f"{v:g}" for v in row) for row in x.tolist()) + "\n"
    return "/invocations", text.encode(), {"Content-Type": "text/csv"}


def jsonlines_body(x: np.ndarray):
    text = "".join(json.dumps(row) + "\n" for row in x.tolist())
    return "/invocations", text.encode(), {"Content-Type": "application/jsonlines"}


def npy_body(x: np.ndarray, accept: str = "application/json"):
    buf = io.BytesIO()
    np.save(buf, x)
    return "/invocations", buf.getvalue(), {"Content-Type": "application/x-npy", "Accept": accept}


def _v2_header(x: np.ndarray, binary_out: bool) -> bytes:
    header = {"inputs": [{"name": "pixels", "shape": list(x.shape), "datatype": "FP32",
                          "parameters": {"binary_data_size": x.nbytes}}],
              "outputs": [{"name": "probabilities", "parameters": {"binary_data": binary_out}}]}
    return json.dumps(header).encode()


def sagemaker_binary_body(x: np.ndarray, binary_out: bool = True):
    header = _v2_header(x, binary_out)
    return "/invocations", header + x.tobytes(), {"Content-Type": f"{SAGEMAKER_CT}{len(header)}"}


def v2_binary_body(x: np.ndarray, binary_out: bool = True):
    header = _v2_header(x, binary_out)
    return ("/v2/models/digits/infer", header + x.tobytes(),
            {"Content-Type": "application/octet-stream", IHCL: str(len(header))})


# Bodies a client gets wrong; each must be a 4xx (none is one of the known codec 500s).
def malformed_bodies():
    x = digits(2)
    _, good_json, _ = json_body(x)
    _, good_npy, _ = npy_body(x)
    _, good_sm, sm_headers = sagemaker_binary_body(x)
    return [
        ("/invocations", good_json[:-7], {"Content-Type": "application/json"}),
        ("/invocations", b'{"instances": [[1, 2, 3]]}', {"Content-Type": "application/json"}),
        ("/invocations", b"1,2,x\n", {"Content-Type": "text/csv"}),
        ("/invocations", b"[1,2]\n{oops\n", {"Content-Type": "application/jsonlines"}),
        ("/invocations", good_npy[:40], {"Content-Type": "application/x-npy"}),
        ("/invocations", good_sm[:-5], sm_headers),
        ("/invocations", good_sm, {"Content-Type": SAGEMAKER_CT + "-1"}),
        ("/invocations", b"abc", {"Content-Type": "application/evil"}),
    ]


# ---------------------------------------------------------------- a keep-alive raw client


class Client:
    """One kept-alive HTTP/1.1 connection; reconnects after the server closes it."""

    def __init__(self, port: int, timeout: float = 30):
        self.port, self.timeout = port, timeout
        self.sock: socket.socket | None = None
        self.buf = b""

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock, self.buf = None, b""

    def request(self, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> tuple[int, bytes]:
        """(status, body); raises OSError/ConnectionError when the connection fails."""
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = [f"{method} {path} HTTP/1.1", "Host: localhost", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        try:
            self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
            status, headers_in, payload = self._response()
        except BaseException:
            self.close()
            raise
        if headers_in.get("connection", "").lower() == "close":
            self.close()
        return status, payload

    def _recv(self) -> None:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("closed by the server")
        self.buf += data

    def _response(self):
        while b"\r\n\r\n" not in self.buf:
            self._recv()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        status = int(lines[0].split()[1])
        if headers.get("transfer-encoding", "").lower() == "chunked":
            chunks = []  # joined once: growing one bytes object per chunk is quadratic
            while True:
                while b"\r\n" not in self.buf:
                    self._recv()
                line, _, self.buf = self.buf.partition(b"\r\n")
                size = int(line.split(b";")[0], 16)
                while len(self.buf) < size + 2:
                    self._recv()
                chunks.append(self.buf[:size])
                self.buf = self.buf[size + 2:]
                if size == 0:
                    return status, headers, b"".join(chunks)
        need = int(headers.get("content-length", "0"))
        while len(self.buf) < need:
            self._recv()
        body, self.buf = self.buf[:need], self.buf[need:]
        return status, headers, body


# ---------------------------------------------------------------- processes and numbers


def worker_pids(master_pid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == master_pid:
                        pids.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return sorted(pids)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (every thread) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def run_hey(url: str, body: Path, headers: dict, seconds: float, concurrency: int,
            core: int | None = None) -> dict:
    """POST `body` (a file) to url with `hey` for `seconds`; its summary, parsed (not
    -o csv: the csv leaves out connection errors). headers must hold Content-Type.
    latency: percentile -> ms as hey prints it (0 where it had too few samples)."""
    headers = dict(headers)
    cmd = ["hey", "-z", f"{seconds}s", "-c", str(concurrency), "-m", "POST", "-T", headers.pop("Content-Type"),
           "-D", str(body)]
    for name, value in headers.items():
        cmd += ["-H", f"{name}: {value}"]
    if core is not None:
        cmd = ["taskset", "-c", str(core)] + cmd
    out = subprocess.run(cmd + [url], capture_output=True, text=True, check=True).stdout

    def seconds_of(label: str) -> float | None:
        found = re.search(label + r":\s+([\d.]+) secs", out)
        return float(found.group(1)) if found else None

    errors = out.split("Error distribution:")[1] if "Error distribution:" in out else ""
    return {
        "statuses": {int(code): int(n) for code, n in re.findall(r"\[(\d{3})\]\s+(\d+) responses", out)},
        "errors": sum(int(n) for n in re.findall(r"^\s+\[(\d+)\]\s", errors, re.M)),
        "elapsed": seconds_of("Total"),
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "latency": {p: float(v) * 1000 for p, v in re.findall(r"(\d+)% in ([\d.]+) secs", out)},
        "slowest": seconds_of("Slowest"),
        "average": seconds_of("Average"),
    }


class Pinger:
    """GET `url` every `period` seconds on a kept-alive connection while a load runs, as
    SageMaker's health check does: the ms each took, and how many failed (not 200, or no
    answer within `timeout`). A url of None pings nothing."""

    def __init__(self, url: str | None, period: float, timeout: float = 2):
        self.url, self.period, self.timeout = url, period, timeout
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with requests.Session() as session:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    ok = session.get(self.url, timeout=self.timeout).status_code == 200
                except requests.RequestException:
                    ok = False
                elapsed = time.perf_counter() - started
                self.latencies.append(elapsed * 1000)
                self.failures += not ok
                self._stop.wait(max(0.0, self.period - elapsed))

    def __enter__(self) -> "Pinger":
        if self.url:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.url:
            self._thread.join()


def pct(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def ms(seconds_list) -> list[float]:
    return [s * 1000 for s in seconds_list]


def raise_fd_limit() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def now() -> float:
    return time.monotonic()


def checkout(ref: str, work: Path) -> Path:
    """container/ as it was at git commit `ref`, unpacked under work/; its serve script."""
    target = work / "baseline"
    target.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "container"], capture_output=True, check=False)
    if archive.returncode != 0:
        sys.exit(f"--baseline {ref}: git archive failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target / "container" / "serve"

"""WebSocket sessions against HTTP requests: messages per second, and streamed answers.

    .venv/bin/python bench/bench_streaming.py                      # starts both servers
    .venv/bin/python bench/bench_streaming.py --messages 5000 --runs 50
    .venv/bin/python bench/bench_streaming.py --digits-url http://localhost:8080 --textgen-url http://localhost:8081

(a) The digits model, batch 1: --messages requests, each one JSON instance or one .npy
row, over one WebSocket session (/invocations-bidirectional-stream) and as separate
POST /invocations on kept-alive connections: requests.Session, and for scale the bare
socket client of _harness.py ("raw"), which costs the client far less. Sequential: one
in flight. Pipelined: the WebSocket sends every message from one thread while another
reads the answers (the server works on up to 64 at once per session); HTTP uses
--threads threads, each with its own kept-alive connection.

(b) The textgen model: time to the first character and to the whole answer, for a
--tokens answer, over HTTP streaming (Accept: text/plain, requests stream=True, one
kept-alive connection), over one WebSocket session (one message per answer) and over
a fresh WebSocket session per answer (the handshake included); median of --runs.

One worker, the server's own thread defaults, warnings-only logs. Prints tables with
the figures and the ratios; nothing is asserted.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import requests
from websockets.sync.client import connect

from _harness import ROOT, Client, ServerProcess, digits

PATH = "/invocations-bidirectional-stream"
TEXTGEN_MODEL = ROOT / "build" / "textgen"
DIGITS_MODEL = ROOT / "build" / "model"
PROMPT = "The iris"
def ws_connect(url: str, query: str = ""):
    ws_url = url.replace("http://", "ws://", 1) + PATH + (f"?{query}" if query else "")
    return connect(ws_url, compression=None, proxy=None, max_size=None, max_queue=None, ping_interval=None)


def start(model_dir: Path, log_path: Path) -> ServerProcess:
    env = {"SMSERVE_LOG_LEVEL": "warning", "SMSERVE_TORCH_THREADS": ""}
    return ServerProcess(model_dir, env, log_path=log_path).start()


# ---------------------------------------------------------------- (a) messages per second


def payloads() -> dict[str, tuple]:
    """kind -> (WebSocket message, HTTP body, HTTP headers, a good answer's check)."""
    row = digits(1, seed=3)
    as_json = json.dumps({"instances": row.tolist()})
    buf = io.BytesIO()
    np.save(buf, row)
    as_npy = buf.getvalue()
    return {
        "JSON": (as_json, as_json.encode(), {"Content-Type": "application/json"},
                 lambda answer: answer.startswith(b'{"predictions"') if isinstance(answer, bytes)
                 else answer.startswith('{"predictions"')),
        ".npy": (as_npy, as_npy, {"Content-Type": "application/x-npy", "Accept": "application/x-npy"},
                 lambda answer: isinstance(answer, bytes) and answer.startswith(b"\x93NUMPY")),
    }


def ws_sequential(url: str, message, count: int, good) -> tuple[float, int]:
    bad = 0
    with ws_connect(url) as ws:
        started = time.perf_counter()
        for _ in range(count):
            ws.send(message)
            bad += not good(ws.recv())
        elapsed = time.perf_counter() - started
    return elapsed, bad


def ws_pipelined(url: str, message, count: int, good) -> tuple[float, int]:
    bad = 0
    with ws_connect(url) as ws:
        started = time.perf_counter()
        sender = threading.Thread(target=lambda: [ws.send(message) for _ in range(count)])
        sender.start()
        for _ in range(count):
            bad += not good(ws.recv())
        elapsed = time.perf_counter() - started
        sender.join()
    return elapsed, bad


class RequestsClient:
    """requests.Session: what most Python callers use, one kept-alive connection."""

    def __init__(self, url: str):
        self.url = url
        self.session = requests.Session()

    def post(self, body: bytes, headers: dict) -> tuple[int, bytes]:
        response = self.session.post(self.url + "/invocations", data=body, headers=headers)
        return response.status_code, response.content

    def close(self) -> None:
        self.session.close()


class RawClient:
    """bench/_harness.py's kept-alive HTTP/1.1 over a bare socket: the least a client can cost."""

    def __init__(self, url: str):
        self.client = Client(int(url.rsplit(":", 1)[1]))

    def post(self, body: bytes, headers: dict) -> tuple[int, bytes]:
        return self.client.request("POST", "/invocations", body, headers)

    def close(self) -> None:
        self.client.close()


def http_requests(make_client, url: str, body: bytes, headers: dict, count: int, good, threads: int = 1):
    """count POSTs from `threads` threads (1: sequential), each with its own kept-alive
    connection; (seconds, bad answers)."""
    bad = [0] * threads
    clients = [make_client(url) for _ in range(threads)]
    for client in clients:
        client.post(body, headers)  # the connection, opened
    barrier = threading.Barrier(threads + 1)

    def work(i: int) -> None:
        barrier.wait()
        for _ in range(count // threads + (i < count % threads)):
            status, answer = clients[i].post(body, headers)
            bad[i] += status != 200 or not good(answer)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    for client in clients:
        client.close()
    return elapsed, sum(bad)


def bench_messages(url: str, count: int, threads: int) -> list[tuple]:
    rows = []
    for kind, (message, body, headers, good) in payloads().items():
        # Warm every path (the model's first shapes, the codecs) before timing.
        ws_sequential(url, message, 50, good)
        http_requests(RequestsClient, url, body, headers, 50, good)
        http_requests(RawClient, url, body, headers, 50, good)
        for mode, ws_run, http_threads in (("sequential", ws_sequential, 1), ("pipelined", ws_pipelined, threads)):
            ws_s, ws_bad = ws_run(url, message, count, good)
            http_s, http_bad = http_requests(RequestsClient, url, body, headers, count, good, http_threads)
            raw_s, raw_bad = http_requests(RawClient, url, body, headers, count, good, http_threads)
            rows.append((kind, mode, count / ws_s, count / http_s, count / raw_s, ws_bad + http_bad + raw_bad))
    return rows


# ---------------------------------------------------------------- (b) streamed answers


def http_stream(session: requests.Session, url: str, tokens: int, seed: int) -> tuple[float, float, int]:
    body = {"prompt": PROMPT, "max_tokens": tokens, "seed": seed}
    started = time.perf_counter()
    first = None
    text = b""
    with session.post(url + "/invocations", json=body, headers={"Accept": "text/plain"}, stream=True) as response:
        response.raise_for_status()
        for chunk in response.iter_content(chunk_size=None):
            if first is None:
                first = time.perf_counter()
            text += chunk
    return first - started, time.perf_counter() - started, len(text.decode())


def ws_stream(ws, tokens: int, seed: int, started: float | None = None) -> tuple[float, float, int]:
    started = started or time.perf_counter()
    ws.send(json.dumps({"prompt": PROMPT, "max_tokens": tokens, "seed": seed}))
    first = None
    text = ""
    for frame in ws.recv_streaming():
        if first is None:
            first = time.perf_counter()
        text += frame
    return first - started, time.perf_counter() - started, len(text)


def ws_fresh_stream(url: str, tokens: int, seed: int) -> tuple[float, float, int]:
    started = time.perf_counter()
    with ws_connect(url) as ws:
        return ws_stream(ws, tokens, seed, started)


def bench_tokens(url: str, tokens: int, runs: int) -> list[tuple]:
    results: dict[str, list[tuple[float, float, int]]] = {"HTTP text/plain": [], "WebSocket, one session": [],
                                                          "WebSocket, session per answer": []}
    with requests.Session() as session, ws_connect(url) as ws:
        for seed in range(3):  # warm up
            http_stream(session, url, tokens, seed)
            ws_stream(ws, tokens, seed)
        # Interleaved, so a slow moment of the machine falls on every transport alike.
        for seed in range(runs):
            results["HTTP text/plain"].append(http_stream(session, url, tokens, seed))
            results["WebSocket, one session"].append(ws_stream(ws, tokens, seed))
            results["WebSocket, session per answer"].append(ws_fresh_stream(url, tokens, seed))
    rows = []
    for name, samples in results.items():
        first = statistics.median(s[0] for s in samples) * 1000
        whole = statistics.median(s[1] for s in samples) * 1000
        chars = min(s[2] for s in samples)
        rows.append((name, first, whole, chars))
    return rows


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--digits-url", help="a running server of the digits model (default: start one)")
    parser.add_argument("--textgen-url", help="a running server of the textgen model (default: start one)")
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=16, help="HTTP client threads when pipelined")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--skip", choices=("messages", "tokens"), help="leave one part out")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench_streaming_"))
    if args.skip != "messages":
        server = None
        try:
            url = args.digits_url or (server := start(DIGITS_MODEL, work / "digits.log")).url
            rows = bench_messages(url, args.messages, args.threads)
        finally:
            if server:
                server.terminate()
        print(f"(a) digits, batch 1, {args.messages} messages each; pipelined HTTP: {args.threads} threads, "
              f"one kept-alive connection each; {os.cpu_count()} CPUs for client and server")
        print(f"{'message':<8} {'mode':<11} {'WebSocket msg/s':>16} {'HTTP req/s':>11} {'raw HTTP req/s':>15} "
              f"{'WS / HTTP':>10} {'WS / raw':>9} {'bad':>4}")
        for kind, mode, ws_rate, http_rate, raw_rate, bad in rows:
            print(f"{kind:<8} {mode:<11} {ws_rate:>16.0f} {http_rate:>11.0f} {raw_rate:>15.0f} "
                  f"{ws_rate / http_rate:>9.2f}x {ws_rate / raw_rate:>8.2f}x {bad:>4}")
        print()

    if args.skip != "tokens":
        server = None
        try:
            url = args.textgen_url or (server := start(TEXTGEN_MODEL, work / "textgen.log")).url
            rows = bench_tokens(url, args.tokens, args.runs)
        finally:
            if server:
                server.terminate()
        http_first, http_whole = rows[0][1], rows[0][2]
        print(f"(b) textgen, {args.tokens}-character answers, median of {args.runs}")
        print(f"{'transport':<30} {'first char ms':>13} {'whole ms':>9} {'whole/first':>12} "
              f"{'first vs HTTP':>14} {'whole vs HTTP':>14} {'chars':>6}")
        for name, first, whole, chars in rows:
            print(f"{name:<30} {first:>13.2f} {whole:>9.1f} {whole / first:>11.0f}x "
                  f"{first / http_first:>13.2f}x {whole / http_whole:>13.2f}x {chars:>6}")
    print(f"server logs: {work}")


if __name__ == "__main__":
    main()

"""Hostile input against a real gunicorn: issue #10 section 5, and the classes that held.

Each case sends one request (over a raw socket: most of them cannot be expressed with
`requests`) and asserts the documented answer: a 4xx whose body is `{"error": ...}`
with Content-Type application/json, or, for a body cut short, the connection closed
without an answer; never a 5xx, never a partial inference. After each case the same
server must still answer a valid request, with the same worker processes (the set of
the gunicorn master's children is unchanged: no case may kill or restart a worker),
and the case must not have logged a traceback.

Servers, one per module: the example model untouched; a copy whose predict_fn answers
NaN/inf (non-finite outputs) with short read deadlines; a weightless model with a BYTES
input (the BYTES parser's bombs).
"""

from __future__ import annotations

import io
import json
import math
import pickle
import socket
import struct
import time
import zipfile
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest

from tests.helpers.server import ServerProcess, copy_model, wait_until, worker_pids
from smserve.codecs.records.csvrows import MAX_CELL_BYTES

SAGEMAKER_CT = "application/vnd.sagemaker-triton.binary+json;json-header-size="
IHCL = "Inference-Header-Content-Length"
PIXELS = [float(i % 17) for i in range(64)]
BIG_INT = "9" * 5000  # past Python's 4,300-digit int limit

NAN_PREDICT = '''
import numpy as np


def predict_fn(data, model):
    out = model(data).detach().numpy().copy()
    out[:, 0] = np.nan
    out[:, 1] = np.inf
    out[:, 2] = -np.inf
    return out
'''

BYTES_HOOKS = '''
import numpy as np


def model_fn(model_dir):
    return None


def predict_fn(data, model):
    blobs = data["B"] if isinstance(data, dict) else data
    return {"Y": np.array([[len(bytes(v)) for v in np.asarray(blobs).reshape(-1)]], dtype=np.float32)}
'''


# ---------------------------------------------------------------- raw HTTP


@dataclass
class Answer:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self):
        return json.loads(self.body)


def request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | list | None = None) -> bytes:
    """An HTTP/1.1 request; headers as a list of pairs when a name must repeat."""
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    names = {k.lower() for k, _ in pairs}
    if body and "content-length" not in names and "transfer-encoding" not in names:
        pairs.append(("Content-Length", str(len(body))))
    head = [f"{method} {path} HTTP/1.1", "Host: localhost"] + [f"{k}: {v}" for k, v in pairs]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def post(path: str, body: bytes, content_type: str, **headers) -> bytes:
    return request("POST", path, body, {"Content-Type": content_type, **{k.replace("_", "-"): v for k, v in headers.items()}})


def exchange(port: int, data: bytes, half_close: bool = False, timeout: float = 15) -> Answer | None:
    """Send data, read one response; None when the server closed without answering."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer (and close) before it has read everything
        buf = b""
        try:
            while b"\r\n\r\n" not in buf:
                chunk = sock.recv(65536)
                if not chunk:
                    assert not buf, f"connection closed inside a response head: {buf[:200]!r}"
                    return None
                buf += chunk
        except ConnectionResetError:
            assert not buf, f"connection reset inside a response head: {buf[:200]!r}"
            return None
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        answer = Answer(int(lines[0].split()[1]), headers)
        if "content-length" in headers:
            need = int(headers["content-length"])
            while len(rest) < need:
                chunk = sock.recv(65536)
                assert chunk, f"connection closed inside a response body ({len(rest)} of {need} bytes)"
                rest += chunk
            answer.body = rest[:need]
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            answer.body = _dechunk(sock, rest)
        else:
            while chunk := sock.recv(65536):
                rest += chunk
            answer.body = rest
        return answer


def _dechunk(sock, buf: bytes) -> bytes:
    body = b""
    while True:
        while b"\r\n" not in buf:
            buf += sock.recv(65536)
        line, _, buf = buf.partition(b"\r\n")
        size = int(line.split(b";")[0], 16)
        while len(buf) < size + 2:
            buf += sock.recv(65536)
        body, buf = body + buf[:size], buf[size + 2:]
        if size == 0:
            return body


# ---------------------------------------------------------------- server health


def strict_json(data: bytes):
    """json.loads that refuses NaN/Infinity, as every strict parser (and JSON) does."""

    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    return json.loads(data, parse_constant=refuse)


def assert_json_error(answer: Answer | None, statuses) -> None:
    assert answer is not None, "closed without an answer"
    assert answer.status in statuses, f"{answer.status} {answer.body[:300]!r}"
    assert answer.headers.get("content-type", "").split(";")[0] == "application/json", answer.headers
    error = strict_json(answer.body)
    assert isinstance(error, dict) and isinstance(error.get("error"), str) and error["error"], answer.body[:300]


class Guard:
    """Records the workers and the log before a case; then asserts the server still serves."""

    def __init__(self, server: ServerProcess, valid: bytes, check: Callable[[Answer], None],
                 allow_traceback: bool = False):
        self.server, self.valid, self.check = server, valid, check
        self.allow_traceback = allow_traceback
        self.pids = worker_pids(server)
        assert self.pids, "no worker process found"
        self.log_at = len(server.log())

    def still_serving(self) -> None:
        valid_at = len(self.server.log())
        answer = exchange(self.server.port, self.valid)
        assert answer is not None and answer.status == 200, answer
        self.check(answer)
        assert worker_pids(self.server) == self.pids, "a worker died or was replaced"
        assert self.server.proc.poll() is None
        # A line is logged as its answer leaves: once the valid request's access line is
        # there, so is whatever the case before it logged.
        method, path = self.valid.split(b" ", 2)[:2]
        access = f'"{method.decode()} {path.decode()}" 200 '
        wait_until(lambda: access in self.server.log()[valid_at:], timeout=5)
        new_log = self.server.log()[self.log_at:]
        assert self.allow_traceback or "Traceback" not in new_log, new_log[-3000:]


def digits_ok(answer: Answer) -> None:
    predictions = strict_json(answer.body)["predictions"]
    assert len(predictions) == 1 and len(predictions[0]) == 10


VALID_DIGITS = post("/invocations", json.dumps({"instances": [PIXELS]}).encode(), "application/json")


# The side servers, each started when a test first asks for it (under xdist, only in the
# processes whose tests use it).
@pytest.fixture(scope="module")
def nan_server(example_model_dir, tmp_path_factory):
    """The NaN model, with short read deadlines."""
    base = tmp_path_factory.mktemp("hostile-nan")
    nan_dir = copy_model(example_model_dir, base / "nan", NAN_PREDICT)
    with ServerProcess(nan_dir, {"SMSERVE_HEADER_TIMEOUT": "1", "SMSERVE_BODY_TIMEOUT": "2"},
                       log_path=base / "nan.log") as server:
        yield server


@pytest.fixture(scope="module")
def bytes_server(tmp_path_factory):
    """The BYTES model."""
    base = tmp_path_factory.mktemp("hostile-bytes")
    bytes_dir = base / "bytes"
    (bytes_dir / "code").mkdir(parents=True)
    (bytes_dir / "code" / "inference.py").write_text(BYTES_HOOKS)
    (bytes_dir / "metadata.json").write_text(json.dumps({
        "name": "blobs", "max_batch_size": 0,
        "inputs": [{"name": "B", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "Y", "datatype": "FP32", "shape": [1, -1]}],
    }))
    with ServerProcess(bytes_dir, log_path=base / "bytes.log") as server:
        yield server


# ---------------------------------------------------------------- payloads


def json_body(text: str) -> bytes:
    return post("/invocations", text.encode(), "application/json")


def record(first: str) -> str:
    return ",".join([first] + ["1"] * 63)


def v2_header(shape, datatype="FP32", size=256, name="pixels", extra=None) -> bytes:
    tensor = {"name": name, "shape": shape, "datatype": datatype, "parameters": {"binary_data_size": size}}
    return json.dumps({"inputs": [tensor], **(extra or {})}).encode()


def sagemaker_binary(header: bytes, blob: bytes, header_size: str | None = None) -> bytes:
    size = str(len(header)) if header_size is None else header_size
    return post("/invocations", header + blob, SAGEMAKER_CT + size)


def v2_binary(path: str, header: bytes, blob: bytes, lengths: list[str]) -> bytes:
    pairs = [("Content-Type", "application/octet-stream")] + [(IHCL, n) for n in lengths]
    return request("POST", path, header + blob, pairs)


def npy_bytes(header_dict_text: str, data: bytes = b"") -> bytes:
    """A .npy v1.0 file with a hand-written header (it can claim anything)."""
    text = header_dict_text.encode("latin-1")
    pad = (64 - (10 + len(text) + 1) % 64) % 64
    text += b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + data


def npy_v2_bytes(header_text: str) -> bytes:
    """A .npy v2.0 header (its length in 4 bytes: any length), as written, no data."""
    text = header_text.encode("latin-1")
    return b"\x93NUMPY\x02\x00" + struct.pack("<I", len(text)) + text


def npz_of(member: bytes) -> bytes:
    """A compressed .npz holding one member, x.npy."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("x.npy", member)
    return out.getvalue()


def npy_post(payload: bytes) -> bytes:
    return post("/invocations", payload, "application/x-npy")


UNCLOSED_NPY_HEADER = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 64)" + " " * 200_000
DIGIT_BLOB = np.asarray([PIXELS], dtype=np.float32).tobytes()
GOOD_HEADER = v2_header([1, 64])
CHUNKED_HEAD = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


@dataclass
class Case:
    id: str
    data: bytes
    statuses: tuple = (400,)
    half_close: bool = False
    closed_ok: bool = False  # closing without an answer is also a documented answer
    xfail: str | None = None


def _cases() -> list[Case]:
    short = json.dumps({"instances": [PIXELS, PIXELS, PIXELS]}).encode()
    return [
        # ---- issue #10 section 5: 500s that must be 4xx
        Case("json-int-5000-digits", json_body('{"instances": [[%s]]}' % record(BIG_INT))),
        Case("jsonlines-int-5000-digits",
             post("/invocations", f"[{record(BIG_INT)}]\n".encode(), "application/jsonlines")),
        Case("v2-json-shape-5000-digits",
             json_body('{"inputs": [{"name": "pixels", "shape": [%s, 64], "datatype": "FP32", "data": [1.0]}]}' % BIG_INT)),
        Case("json-header-size-5000-digits", sagemaker_binary(GOOD_HEADER, DIGIT_BLOB, BIG_INT)),
        Case("ihcl-5000-digits-invocations", v2_binary("/invocations", GOOD_HEADER, DIGIT_BLOB, [BIG_INT])),
        Case("ihcl-5000-digits-v2", v2_binary("/v2/models/digits/infer", GOOD_HEADER, DIGIT_BLOB, [BIG_INT])),
        Case("chunk-size-zz", CHUNKED_HEAD + b"zz\r\nabc\r\n0\r\n\r\n", statuses=(400,)),
        Case("chunk-size-negative", CHUNKED_HEAD + b"-3\r\nabc\r\n0\r\n\r\n", statuses=(400,)),
        # ---- a body shorter than it says: never a partial inference
        Case("short-body-half-closed",
             post("/invocations", short[:289], "application/json", Content_Length=str(len(short))),
             half_close=True, closed_ok=True),
        Case("short-chunked-body-half-closed", CHUNKED_HEAD + b"10\r\nabc", half_close=True, closed_ok=True),
        Case("huge-chunk-half-closed", CHUNKED_HEAD + b"ffffffffff\r\nabc\r\n0\r\n\r\n",
             statuses=(400, 413), half_close=True, closed_ok=True),
        # ---- ambiguous requests
        Case("ihcl-twice-different-invocations",
             v2_binary("/invocations", GOOD_HEADER, DIGIT_BLOB, [str(len(GOOD_HEADER)), str(len(GOOD_HEADER) + 4)])),
        Case("ihcl-twice-different-v2",
             v2_binary("/v2/models/digits/infer", GOOD_HEADER, DIGIT_BLOB,
                       [str(len(GOOD_HEADER)), str(len(GOOD_HEADER) + 4)])),
        Case("json-header-size-twice",
             sagemaker_binary(GOOD_HEADER, DIGIT_BLOB, f"{len(GOOD_HEADER)};json-header-size={len(GOOD_HEADER) + 4}")),
        Case("content-length-twice-different",
             request("POST", "/invocations", b"[1] ", [("Content-Type", "application/json"),
                                                       ("Content-Length", "3"), ("Content-Length", "4")])),
        Case("content-length-and-chunked",
             request("POST", "/invocations", b"3\r\n[1]\r\n0\r\n\r\n",
                     [("Content-Type", "application/json"), ("Content-Length", "3"),
                      ("Transfer-Encoding", "chunked")])),
        Case("content-length-5000-digits",
             request("POST", "/invocations", b"[1]", [("Content-Type", "application/json"),
                                                      ("Content-Length", BIG_INT)])),
        Case("content-length-negative",
             request("POST", "/invocations", b"[1]", [("Content-Type", "application/json"),
                                                      ("Content-Length", "-3")])),
        # ---- non-numeric and non-finite JSON values
        *[Case(f"json-value-{name}", json_body('{"instances": [[%s]]}' % record(token)))
          for name, token in [("NaN", "NaN"), ("Infinity", "Infinity"), ("minus-Infinity", "-Infinity"),
                              ("null", "null"), ("true", "true"), ("string-1", '"1"')]],
        # ---- header-size edge cases (SageMaker binary)
        Case("json-header-size-0-not-raw", sagemaker_binary(GOOD_HEADER, DIGIT_BLOB, "0")),
        Case("json-header-size-negative", sagemaker_binary(GOOD_HEADER, DIGIT_BLOB, "-1")),
        Case("json-header-size-past-body", sagemaker_binary(GOOD_HEADER, DIGIT_BLOB, str(len(GOOD_HEADER) + 10_000))),
        Case("json-header-size-empty", sagemaker_binary(GOOD_HEADER, DIGIT_BLOB, "")),
        Case("json-header-size-not-a-number", sagemaker_binary(GOOD_HEADER, DIGIT_BLOB, "0x10")),
        Case("ihcl-negative", v2_binary("/invocations", GOOD_HEADER, DIGIT_BLOB, ["-1"])),
        Case("ihcl-past-body", v2_binary("/v2/models/digits/infer", GOOD_HEADER, DIGIT_BLOB, ["100000"])),
        # ---- allocation bombs: claims far past the bytes sent
        Case("v2-shape-2e40-rows", sagemaker_binary(v2_header([2 ** 40, 64]), DIGIT_BLOB)),
        Case("v2-shape-overflows-int64", sagemaker_binary(v2_header([2 ** 62, 2 ** 62]), DIGIT_BLOB)),
        Case("v2-shape-negative", sagemaker_binary(v2_header([-1, 64]), DIGIT_BLOB)),
        Case("v2-binary-data-size-1e15", sagemaker_binary(v2_header([1, 64], size=10 ** 15), DIGIT_BLOB)),
        Case("v2-datatype-unknown", sagemaker_binary(v2_header([1, 64], datatype="FP1024"), DIGIT_BLOB)),
        Case("v2-datatype-wider", sagemaker_binary(v2_header([2 ** 36, 64], datatype="FP64"), DIGIT_BLOB)),
        Case("v2-json-shape-2e31-one-value",
             json_body(json.dumps({"inputs": [{"name": "pixels", "shape": [2 ** 31, 64], "datatype": "FP32",
                                               "data": [1.0]}]}))),
        Case("v2-infer-shape-2e40", post("/v2/models/digits/infer", json.dumps(
            {"inputs": [{"name": "pixels", "shape": [2 ** 40, 64], "datatype": "FP32", "data": [1.0]}]}).encode(),
            "application/json")),
        Case("raw-binary-3-bytes", post("/invocations", b"abc", "application/octet-stream")),
        Case("npy-shape-1e12-rows", npy_post(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': "
                                                       "(1000000000000, 64), }", b"\0" * 16))),
        Case("npy-shape-overflows-int64", npy_post(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': "
                                                             f"({2 ** 62}, {2 ** 62}), }}", b"\0" * 16))),
        Case("npy-shape-5000-digits", npy_post(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': "
                                                         f"({BIG_INT}, 64), }}", b"\0" * 16))),
        Case("npy-header-length-past-body", npy_post(b"\x93NUMPY\x01\x00\xff\xff{")),
        Case("npy-v2-header-length-4GB", npy_post(b"\x93NUMPY\x02\x00\xff\xff\xff\xff{'descr'")),
        Case("npy-descr-bogus", npy_post(npy_bytes("{'descr': '<f999999999', 'fortran_order': False, "
                                                   "'shape': (1, 64), }", b"\0" * 16))),
        # ---- issue #45: a long run where a pattern backtracked (minutes of the worker's GIL)
        Case("npy-header-200kB-blanks-unclosed", npy_post(npy_v2_bytes(UNCLOSED_NPY_HEADER))),
        Case("npz-member-header-200kB-blanks-unclosed",
             post("/invocations", npz_of(npy_v2_bytes(UNCLOSED_NPY_HEADER)), "application/x-npz")),
        # The longest cell that is read (a longer one is refused unread).
        Case("csv-cell-of-digits-then-junk", post("/invocations", b"1" * (MAX_CELL_BYTES - 1) + b"x\n", "text/csv")),
        Case("json-nesting-100000", json_body("[" * 100_000 + "]" * 100_000)),
        Case("jsonlines-nesting-100000",
             post("/invocations", b"[" * 100_000 + b"]" * 100_000 + b"\n", "application/jsonlines")),
        Case("csv-100000-columns", post("/invocations", b"1," * 100_000 + b"1\n", "text/csv")),
        # ---- HTTP framing that gunicorn refuses: JSON errors, not HTML pages
        Case("header-10kB", request("GET", "/ping", headers={"X-Big": "a" * 10_000}), statuses=(431, 400)),
        Case("headers-200", request("GET", "/ping", headers=[(f"X-H{i}", "1") for i in range(200)]),
             statuses=(431, 400)),
        Case("request-line-10kB", request("GET", "/" + "a" * 10_000), statuses=(414, 400)),
        Case("method-invalid", b"P@ST /invocations HTTP/1.1\r\nHost: x\r\n\r\n"),
        Case("http-version-9.9", b"GET /ping HTTP/9.9\r\nHost: x\r\n\r\n", statuses=(400, 505)),
        Case("request-line-binary", b"\x00\x01\x02\xff\r\n\r\n"),
        Case("header-nul-byte", b"GET /ping HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n"),
        Case("header-without-colon", b"GET /ping HTTP/1.1\r\nHost: x\r\nXA\r\n\r\n"),
        # gunicorn hands gzip/deflate transfer codings to the application, which does not undo them.
        Case("transfer-encoding-gzip-chunked",
             b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: text/csv\r\n"
             b"Transfer-Encoding: gzip, chunked\r\n\r\n" + b"3\r\n1,2\r\n0\r\n\r\n", statuses=(501,)),
        # 513 valid CSV rows in 65,664 one-byte chunks: past Triton's 65,536.
        Case("too-many-chunks", CHUNKED_HEAD.replace(b"application/json", b"text/csv")
             + b"".join(b"1\r\n%c\r\n" % c for c in b",".join([b"1"] * 64) + b"\n") * 513 + b"0\r\n\r\n",
             statuses=(400,)),
        Case("transfer-encoding-gzip",
             b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Transfer-Encoding: gzip\r\n\r\n", statuses=(400, 501)),
        Case("content-length-1e11", request("POST", "/invocations", b"", [("Content-Type", "application/json"),
                                                                         ("Content-Length", "100000000000")]),
             statuses=(413,)),
        # ---- routing and negotiation
        Case("content-type-unknown", post("/invocations", b"abc", "application/evil"), statuses=(415,)),
        Case("accept-unmeetable", post("/invocations", json.dumps({"instances": [PIXELS]}).encode(),
                                       "application/json", Accept="image/png"), statuses=(406,)),
        Case("get-invocations", request("GET", "/invocations"), statuses=(405,)),
        Case("unknown-path", request("GET", "/../../etc/passwd"), statuses=(400, 404)),
        Case("unknown-model-v2", post("/v2/models/nope/infer", b"{}", "application/json"), statuses=(404,)),
    ]


CASES = _cases()


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.xfail)] if c.xfail else [])
     for c in CASES],
)
def test_hostile_request_is_a_json_4xx_and_the_worker_lives(example_server, case):
    guard = Guard(example_server, VALID_DIGITS, digits_ok)
    answer = exchange(example_server.port, case.data, half_close=case.half_close)
    if answer is None:
        assert case.closed_ok, "closed without an answer"
    else:
        assert_json_error(answer, case.statuses)
    guard.still_serving()


def test_a_client_error_in_a_big_body_logs_no_traceback(example_server):
    """Bodies over 256 kB are decoded on a codec thread; a BadRequest raised there is
    still a 400, but gevent's thread pool prints it as a traceback to the log first, so
    every bad big body (an easy flood) writes ~1 kB of traceback as if the server broke."""
    guard = Guard(example_server, VALID_DIGITS, digits_ok)
    answer = exchange(example_server.port, post("/invocations", b"1," * 1_000_000 + b"1\n", "text/csv"))
    assert_json_error(answer, (400,))
    guard.still_serving()


def test_csv_int_of_5000_digits_is_refused_or_answered_as_strict_json(example_server):
    """The CSV parser takes a 5000-digit integer as a float (inf): a 4xx, or a 200 whose
    answer is still JSON (non-finite outputs as null), never NaN in a JSON body."""
    guard = Guard(example_server, VALID_DIGITS, digits_ok)
    answer = exchange(example_server.port, post("/invocations", (record(BIG_INT) + "\n").encode(), "text/csv"))
    assert answer is not None and answer.status < 500, answer
    if answer.status != 200:
        assert_json_error(answer, range(400, 500))
    else:
        _assert_strict_json_answer(answer)
    guard.still_serving()


# ---------------------------------------------------------------- pickle canaries


def _object_npy(canary) -> bytes:
    class Canary:
        def __reduce__(self):
            return open, (str(canary), "w")  # unpickling creates the file

    array = np.empty(2, dtype=object)
    array[:] = [Canary(), Canary()]
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=True)
    return buf.getvalue()


def _structured_object_npy(canary) -> bytes:
    class Canary:
        def __reduce__(self):
            return open, (str(canary), "w")

    array = np.empty(1, dtype=[("a", "<f4"), ("b", "O")])
    array[0] = (1.0, Canary())
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=True)
    return buf.getvalue()


def _bare_pickle_as_npy(canary) -> bytes:
    class Canary:
        def __reduce__(self):
            return open, (str(canary), "w")

    return pickle.dumps(Canary())


@pytest.mark.parametrize("make", [_object_npy, _structured_object_npy, _bare_pickle_as_npy],
                         ids=["object-dtype", "structured-with-object-field", "bare-pickle"])
@pytest.mark.parametrize("content_type", ["application/x-npy", "application/npy"])
def test_pickle_in_npy_is_never_unpickled(example_server, tmp_path, make, content_type):
    canary = tmp_path / "unpickled"
    payload = make(canary)
    assert b"builtins" in payload or b"io" in payload  # the payload really would call open()
    guard = Guard(example_server, VALID_DIGITS, digits_ok)
    answer = exchange(example_server.port, post("/invocations", payload, content_type))
    assert_json_error(answer, (400,))
    guard.still_serving()
    assert not canary.exists(), "the server unpickled a request body"


# ---------------------------------------------------------------- non-finite outputs


def _assert_strict_json_answer(answer: Answer):
    assert answer.headers.get("content-type", "").split(";")[0] in ("application/json", "application/jsonlines")
    text = answer.body.decode()
    lines = text.splitlines() if answer.headers["content-type"].startswith("application/jsonlines") else [text]
    return [strict_json(line) for line in lines]


NAN_VALID = VALID_DIGITS


def _nan_ok(answer: Answer) -> None:
    assert answer.status == 200  # the NaN model's valid request: any 200 shows it serves


@pytest.mark.parametrize("accept", ["application/json", "application/jsonlines"])
@pytest.mark.parametrize("form", ["json", "jsonlines", "csv", "v2-json"])
def test_nan_outputs_come_back_as_strict_json(nan_server, form, accept):
    server = nan_server
    guard = Guard(server, NAN_VALID, _nan_ok)
    if form == "v2-json":
        if accept != "application/json":
            pytest.skip("a v2 request gets a v2 answer")
        data = json_body(json.dumps({"inputs": [{"name": "pixels", "shape": [2, 64], "datatype": "FP32",
                                                 "data": PIXELS * 2}]}))
    elif form == "json":
        data = post("/invocations", json.dumps({"instances": [PIXELS, PIXELS]}).encode(), "application/json",
                    Accept=accept)
    elif form == "jsonlines":
        data = post("/invocations", ((json.dumps(PIXELS) + "\n") * 2).encode(), "application/jsonlines",
                    Accept=accept)
    else:
        data = post("/invocations", ((",".join(map(str, PIXELS)) + "\n") * 2).encode(), "text/csv", Accept=accept)
    answer = exchange(server.port, data)
    assert answer is not None and answer.status == 200, answer
    documents = _assert_strict_json_answer(answer)
    if form == "v2-json":
        values = documents[0]["outputs"][0]["data"]
        assert values[0] is None and values[1] is None and values[2] is None
        assert all(isinstance(v, float) for v in values[3:10])
    else:
        assert len(documents) in (1, 2)
    guard.still_serving()


def test_nan_outputs_in_npy_and_binary_are_kept_as_is(nan_server):
    """Only JSON cannot carry non-finite values; .npy and v2 binary carry them exactly."""
    server = nan_server
    buf = io.BytesIO()
    np.save(buf, np.asarray([PIXELS], dtype=np.float32))
    answer = exchange(server.port, post("/invocations", buf.getvalue(), "application/x-npy", Accept="application/x-npy"))
    assert answer is not None and answer.status == 200, answer
    out = np.load(io.BytesIO(answer.body), allow_pickle=False)
    assert math.isnan(out[0, 0]) and out[0, 1] == np.inf and out[0, 2] == -np.inf
    header = v2_header([1, 64], extra={"outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}]})
    answer = exchange(server.port, sagemaker_binary(header, DIGIT_BLOB))
    assert answer is not None and answer.status == 200, answer
    size = int(answer.headers["content-type"].split("json-header-size=")[1])
    out = np.frombuffer(answer.body[size:], dtype=np.float32)
    assert math.isnan(out[0]) and out[1] == np.inf and out[2] == -np.inf


# ---------------------------------------------------------------- BYTES bombs


def _bytes_request(blob: bytes, shape=(1,), size: int | None = None) -> bytes:
    header = v2_header(list(shape), datatype="BYTES", size=len(blob) if size is None else size, name="B")
    return sagemaker_binary(header, blob)


def _blobs_ok(answer: Answer) -> None:
    assert strict_json(answer.body)["outputs"][0]["data"] == [3.0]


BYTES_VALID = _bytes_request(struct.pack("<I", 3) + b"abc")


@pytest.mark.parametrize("blob, shape, size", [
    (struct.pack("<I", 0x7FFFFFFF) + b"abcd", (1,), None),  # a length prefix 2 GB past the end
    (struct.pack("<I", 0xFFFFFFFF) + b"abcd", (1,), None),
    (struct.pack("<I", 3) + b"abc" + struct.pack("<I", 10 ** 9), (2,), None),  # second element past the end
    (struct.pack("<I", 3) + b"ab", (1,), None),  # first element short
    (b"\x01\x00", (1,), None),  # not even a length prefix
    (struct.pack("<I", 0) * 2, (10 ** 9,), None),  # a billion elements claimed, two sent
    (struct.pack("<I", 0) * 2, (2 ** 62, 2 ** 62), None),
    (struct.pack("<I", 3) + b"abc", (1,), 10 ** 15),  # binary_data_size far past the body
    (struct.pack("<I", 3) + b"abcEXTRA", (1,), None),  # trailing bytes after the last element
], ids=["prefix-2GB", "prefix-4GB", "second-prefix-1GB", "element-short", "no-prefix", "1e9-elements",
        "shape-overflows", "binary-data-size-1e15", "trailing-bytes"])
def test_bytes_bombs_are_400(bytes_server, blob, shape, size):
    server = bytes_server
    guard = Guard(server, BYTES_VALID, _blobs_ok)
    answer = exchange(server.port, _bytes_request(blob, shape, size))
    assert_json_error(answer, (400,))
    guard.still_serving()


# ---------------------------------------------------------------- deadlines (NaN server: 1 s head, 2 s body)


def _open(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _answer_within(sock: socket.socket, seconds: float) -> tuple[bytes, float]:
    started = time.monotonic()
    sock.settimeout(seconds)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (socket.timeout, ConnectionResetError):
        pass
    return data, time.monotonic() - started


def test_stalled_head_and_body_are_closed_by_their_deadlines(nan_server):
    server = nan_server
    guard = Guard(server, NAN_VALID, _nan_ok)
    head = _open(server.port)
    head.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
    body = _open(server.port)
    body.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n[[1,2,3,4,")
    chunked = _open(server.port)
    chunked.sendall(CHUNKED_HEAD + b"ffffffffff\r\nabc")  # a 1 TB chunk that never comes
    results = {name: _answer_within(sock, 8) for name, sock in
               [("head", head), ("body", body), ("chunked", chunked)]}
    for sock in (head, body, chunked):
        sock.close()
    for name, (data, waited) in results.items():
        assert waited < 7, f"{name}: still open after {waited:.1f} s"
        assert not data or data.startswith(b"HTTP/1.1 408") or data.startswith(b"HTTP/1.1 413"), (name, data[:200])
        assert b" 200 " not in data.split(b"\r\n")[0]
    guard.still_serving()


def test_a_chunk_size_over_the_payload_limit_is_413_at_once(example_server):
    """A Content-Length over the limit is refused before any body byte is read; a chunk
    size over it should be too, not held until the body deadline (then 408)."""
    guard = Guard(example_server, VALID_DIGITS, digits_ok)
    sock = _open(example_server.port)
    sock.sendall(CHUNKED_HEAD + b"ffffffffff\r\nabc")
    data, waited = _answer_within(sock, 5)
    sock.close()
    assert data.startswith(b"HTTP/1.1 413"), f"after {waited:.1f} s: {data[:200]!r}"
    guard.still_serving()


TCP_CLOSE = 7  # linux/tcp_states.h: what a reset leaves (a graceful close leaves CLOSE_WAIT, 8)


def _tcp_state(sock: socket.socket) -> int:
    """The connection's TCP state, read without reading any of its bytes."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


def test_a_client_that_never_reads_its_answer_is_not_held_forever(nan_server):
    """A request with a large answer from a client that never reads: the worker's send
    blocks with the request's body and answer in memory. Busy connections are never
    evicted and no deadline covers the send, so each such client pins its memory until
    it disconnects. A send deadline (like the body deadline: 2 s here) must end it."""
    server = nan_server
    # Ending the answer part-way may log why; what matters here is that it ends.
    guard = Guard(server, NAN_VALID, _nan_ok, allow_traceback=True)
    buf = io.BytesIO()
    np.save(buf, np.tile(np.asarray(PIXELS, dtype=np.float32), (60_000, 1)))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(request("POST", "/invocations", buf.getvalue(), {"Content-Type": "application/x-npy"}))
    # 2 s body deadline, inference, then a send that can never finish: at the 2 s send
    # deadline the server resets the connection (SO_LINGER 0), so neither the worker nor
    # the kernel keeps the answer queued. Read nothing meanwhile; watch the TCP state.
    closed = wait_until(lambda: _tcp_state(sock) == TCP_CLOSE, timeout=30, interval=0.05)
    state = _tcp_state(sock)
    sock.close()
    assert closed, f"the server has not reset the connection after 30 s (TCP state {state})"
    guard.still_serving()

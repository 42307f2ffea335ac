"""Every regular expression applied to bytes a client (or an endpoint) sends runs in
linear time: issue #45 items 2 and 6, where a .npy header and a CSV cell of a few
kilobytes held a worker's GIL for seconds (a backtracking pattern, quadratic).

Each case applies one pattern as its module applies it (or the function that does)
to adversarial inputs of growing size (a valid prefix, then a long run of the
character that pattern backtracks over, and no terminator), and compares the time at
16n with the time at n: about 16 when linear, about 256 when quadratic. The bound
sits between (BOUND); times are the best of several runs of this thread's CPU time (a
busy machine stretches a long sample's wall time more than a short one's), and are
never compared to a clock. So it runs beside other tests: three CPU- or memory-bound
processes on two cores do not move a ratio past the bound.
"""

from __future__ import annotations

import gc
import io
import struct
import time
import zipfile
from types import SimpleNamespace
from typing import Callable

import pytest
from gunicorn.config import Config
from gunicorn.http.errors import ParseException

from deploy import codec as deploy_codec, invoke as deploy_invoke, push as deploy_push
from local_test import runtime as local_runtime
from local_test.batch_transform import records as local_records
from smserve.codecs import simple
from smserve.codecs.records import csvrows, jsondoc
from smserve.codecs.v2 import header as v2_header
from smserve.core import session_ids
from smserve.engine.multimodel import registry as model_registry
from smserve.errors import BadRequest
from smserve.http import connection as head, exchange
from smserve.http.connection import PlainHeadParser, SettledConfig
from smserve.routes import endpoints, models as model_routes
from smserve.settings import Settings

# t(16n) / t(n): 16 when linear, 256 when quadratic; a quarter of quadratic's.
BOUND = 64
# n: large enough that a quadratic pattern's time is all backtracking at n already.
N = 512
# The shortest a timed sample at n may be (repetitions added until it is).
SAMPLE_S = 2e-3
RUNS = 5

NPY_SHAPE = "{'descr': '<f4', 'fortran_order': False, 'shape': "
NPY_PREFIX = NPY_SHAPE + "(1, 64)"


def _refused(apply: Callable) -> Callable:
    """apply, its BadRequest (the answer to a bad input) taken as its result."""

    def run(data):
        try:
            return apply(data)
        except BadRequest:
            return None

    return run


def _npy_body(text: str) -> bytes:
    """A .npy body (format 2.0: a header of any length) whose header is `text`."""
    raw = text.encode("latin-1")
    return simple.NPY_MAGIC + b"\x02\x00" + struct.pack("<I", len(raw)) + raw


def _npz_body(text: str) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("x.npy", _npy_body(text))
    return out.getvalue()


REQUEST_LINE = b"GET / HTTP/1.1\r\n"


def _fields(lines: bytes):
    """head._FIELD's search as http/connection.py makes it: from the request line's end to the head's."""
    buf = REQUEST_LINE + lines
    return list(head._FIELD.finditer(buf, len(REQUEST_LINE), len(buf)))


class _Socket:
    """A socket whose reads return one buffer's bytes."""

    def __init__(self, data: bytes):
        self.data = memoryview(data)

    def recv(self, size: int) -> bytes:
        chunk, self.data = self.data[:size], self.data[size:]
        return bytes(chunk)


HEAD_CONFIG = SettledConfig(Config())  # gunicorn's defaults, as the worker settles them


def _parse_head(buf: bytes):
    """The worker's parser on a head (http/connection.py, gunicorn's parser where it is not plain)."""
    try:
        return next(PlainHeadParser(HEAD_CONFIG, _Socket(buf), ("127.0.0.1", 5000)))
    except ParseException:  # its refusal of a bad head
        return None


def _route_table():
    return endpoints.build(SimpleNamespace(pools=SimpleNamespace(offload=None)),  # (no model: nothing offloaded)
                           Settings.from_env({"SAGEMAKER_MULTI_MODEL": "true"}))


def _tool_cases():
    """The patterns of the local tools and the deploy scripts that read what a client
    or an endpoint sends."""
    return [
        # local_test: a local client's path; a batch input file's CSV cells.
        ("local-runtime-path", local_runtime._PATH.match, lambda n: "/endpoints/" + "a" * n),
        ("local-runtime-path-slashes", local_runtime._PATH.match, lambda n: "/endpoints/a" + "/" * n),
        ("local-json-number-digits", local_records._JSON_NUMBER.fullmatch, lambda n: b"1" * n + b"x"),
        ("local-json-number-fraction", local_records._JSON_NUMBER.fullmatch, lambda n: b"1." + b"1" * n + b"x"),
        ("local-json-number-exponent", local_records._JSON_NUMBER.fullmatch, lambda n: b"1e" + b"1" * n + b"x"),
        # deploy: an endpoint's Content-Type and session ID; a registry's 401 challenge.
        ("deploy-header-size", deploy_codec._HEADER_SIZE.search, lambda n: "json-header-size=" * (n // 17 + 1)),
        ("deploy-session-id-hyphens", deploy_invoke._SESSION_ID.match, lambda n: "a" + "-" * n + "!"),
        ("deploy-session-id-pairs", deploy_invoke._SESSION_ID.match, lambda n: "a-" * (n // 2) + "!"),
        ("deploy-registry-challenge",
         lambda challenge: deploy_push._registry_auth(challenge, "repo", "user", "password", False),
         lambda n: "Bearer " + "a" * n),
        ("deploy-registry-challenge-fields",
         lambda challenge: deploy_push._registry_auth(challenge, "repo", "user", "password", False),
         lambda n: 'Bearer a="' + "b" * n),
    ]


def _cases():
    table = _route_table()
    return [
        # ---- .npy headers (codecs/simple.py): the pattern, and a body through read_npy and read_npz
        ("npy-header-trailing-blanks", simple._NPY_HEADER.fullmatch, lambda n: NPY_PREFIX + " " * n),
        ("npy-header-comma-blanks", simple._NPY_HEADER.fullmatch, lambda n: NPY_PREFIX + "," + " " * n + "x"),
        ("npy-header-open-blanks", simple._NPY_HEADER.fullmatch, lambda n: "{" + " " * n),
        ("npy-header-key-blanks", simple._NPY_HEADER.fullmatch, lambda n: "{'descr'" + " " * n),
        ("npy-header-shape-blanks", simple._NPY_HEADER.fullmatch, lambda n: NPY_SHAPE + "(" + " " * n),
        ("npy-header-shape-digits", simple._NPY_HEADER.fullmatch, lambda n: NPY_SHAPE + "(" + "1" * n),
        ("npy-header-shape-dims", simple._NPY_HEADER.fullmatch, lambda n: NPY_SHAPE + "(" + "1, " * (n // 3)),
        ("npy-header-shape-dim-blanks", simple._NPY_HEADER.fullmatch, lambda n: NPY_SHAPE + "(1" + " " * n),
        ("npy-read-trailing-blanks", _refused(simple.read_npy), lambda n: _npy_body(NPY_PREFIX + " " * n)),
        ("npz-read-trailing-blanks", _refused(lambda body: simple.read_npz(body, 1 << 30)),
         lambda n: _npz_body(NPY_PREFIX + " " * n)),
        # ---- CSV cells (codecs/records/csvrows.py): the patterns, and through the codec
        ("csv-finite-digits", csvrows._FINITE.fullmatch, lambda n: "1" * n + "x"),
        ("csv-finite-fraction", csvrows._FINITE.fullmatch, lambda n: "1." + "1" * n + "x"),
        ("csv-finite-point", csvrows._FINITE.fullmatch, lambda n: "." + "1" * n + "x"),
        ("csv-finite-exponent", csvrows._FINITE.fullmatch, lambda n: "1e" + "1" * n + "x"),
        ("csv-finite-blanks", csvrows._FINITE.fullmatch, lambda n: " " * n + "x"),
        ("csv-finite-trailing-blanks", csvrows._FINITE.fullmatch, lambda n: "1" + " " * n + "x"),
        ("csv-non-finite-blanks", csvrows._NON_FINITE.fullmatch, lambda n: " " * n + "x"),
        ("csv-non-finite-trailing-blanks", csvrows._NON_FINITE.fullmatch, lambda n: "nan" + " " * n + "x"),
        ("csv-cell-problem-digits", csvrows._cell_problem, lambda n: "1" * n + "x"),
        ("csv-body-digits", _refused(csvrows.csv), lambda n: b"1" * n + b"x\n"),
        ("csv-skip-blanks", lambda body: csvrows._skip(body, 0, len(body), b" \t"), lambda n: b" " * n + b"x"),
        # ---- JSON documents (codecs/records/jsondoc.py, codecs/simple.py)
        ("json-records-start-blanks", jsondoc._RECORDS_START.match, lambda n: b" " * n + b"x"),
        ("json-records-start-object-blanks", jsondoc._RECORDS_START.match, lambda n: b"{" + b" " * n + b"x"),
        ("json-records-start-key-blanks", jsondoc._RECORDS_START.match,
         lambda n: b'{"instances"' + b" " * n + b"x"),
        ("json-records-start-colon-blanks", jsondoc._RECORDS_START.match,
         lambda n: b'{"instances":' + b" " * n + b"x"),
        ("json-object-blanks", lambda body: simple.wraps_records(body, "application/json"),
         lambda n: b" " * n + b"x"),
        # ---- v2's header length (codecs/v2/header.py)
        ("v2-stoi-blanks", v2_header._stoi, lambda n: " " * n + "x"),
        ("v2-stoi-digits", v2_header._stoi, lambda n: "1" * n + "x"),
        # ---- request heads (http/connection.py): the request line, the fields, one whole head
        ("head-request-line-path", head._REQUEST_LINE.match, lambda n: b"GET /" + b"a" * n),
        ("head-request-line-no-crlf", head._REQUEST_LINE.match, lambda n: b"GET /" + b"a" * n + b" HTTP/1.1"),
        ("head-field-no-colon", _fields, lambda n: b"a" * n + b"\r\n"),
        ("head-field-value-no-crlf", _fields, lambda n: b"a:" + b"b" * n + b"\x00\r\n"),
        ("head-field-colons", _fields, lambda n: b"a:" * (n // 2) + b"\n"),
        ("head-field-bare-lfs", _fields, lambda n: b"a\n" * (n // 2) + b"\r\n"),
        # (whole heads within the parser's first read: a longer one is gunicorn's alone)
        ("head-line-no-colon", _parse_head,
         lambda n: REQUEST_LINE + b"Host: x\r\n" + b"a" * (n // 2) + b"\r\n\r\n"),
        ("head-value-bare-lf", _parse_head,
         lambda n: REQUEST_LINE + b"Host: x\r\nX-A: " + b"b" * (n // 2) + b"\nX-B: c\r\n\r\n"),
        # ---- session IDs (core/session_ids.py): the patterns, and the header's check
        ("session-id-hyphens", session_ids._ID.fullmatch, lambda n: "a" + "-" * n + "!"),
        ("session-id-pairs", session_ids._ID.fullmatch, lambda n: "a-" * (n // 2) + "!"),
        ("session-id-ours", session_ids._OURS.fullmatch, lambda n: "1-aaaaaaaa-" + "a" * n),
        ("session-id-requested", _refused(session_ids.requested), lambda n: "a" + "-" * n + "!"),
        # ---- paths and names (routes/, engine/multimodel/registry.py), an answer's header values
        ("route-path-name", lambda path: table.match("GET", path), lambda n: "/v2/models/" + "a" * n + "/x"),
        ("route-path-version", lambda path: table.match("POST", path),
         lambda n: "/v2/models/m/versions/" + "a" * n + "/inferx"),
        ("route-page-digits", model_routes._DIGITS.fullmatch, lambda n: "1" * n + "x"),
        ("model-name", model_registry._NAME.fullmatch, lambda n: "a" * n + "\x00"),
        ("answer-header-value", exchange._UNSAFE_VALUE.search, lambda n: "a" * n),
    ] + _tool_cases()


def _seconds(apply: Callable, data, reps: int) -> float:
    start = time.thread_time()
    for _ in range(reps):
        apply(data)
    return (time.thread_time() - start) / reps


def _best(apply: Callable, data, reps: int, below: float = 0.0) -> float:
    """The best of RUNS samples; fewer once one is below `below` (the bound is met)."""
    best = float("inf")
    for _ in range(RUNS):
        best = min(best, _seconds(apply, data, reps))
        if best < below:
            break
    return best


CASES = _cases()


@pytest.mark.parametrize("apply, make", [pytest.param(a, m, id=i) for i, a, m in CASES])
def test_time_grows_linearly_with_adversarial_input(apply, make):
    small, middle, large = make(N), make(4 * N), make(16 * N)
    apply(small)  # first-call costs (imports, compiled patterns) are no part of it
    reps = 1
    while _seconds(apply, small, reps) * reps < SAMPLE_S and reps < 1 << 16:
        reps *= 2
    gc.disable()  # a collection inside one sample is no part of the pattern's time
    try:
        t1 = _best(apply, small, reps)
        t4 = _best(apply, middle, reps)
        t16 = _best(apply, large, reps, below=BOUND * t1)
    finally:
        gc.enable()
    assert t16 / t1 < BOUND, (
        f"time grows faster than the input: x{t4 / t1:.1f} at 4n, x{t16 / t1:.1f} at 16n "
        f"(n = {N}; linear is about x4 and x16, quadratic x16 and x256)"
    )

"""The modules one POST /invocations runs, as docs/architecture.md lists them: a real
gunicorn worker traced (tests/helpers/request_path/sitecustomize.py) while it answers an
.npy body, the set compared with the doc's table, so the doc stays the request's true path.
The base modules every layer uses (settings, errors, logs, files, memo, metrics/, core/)
are left out of both, as the doc says."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.helpers.server import EXAMPLE_MODEL, ServerProcess, wait_until

ROOT = Path(__file__).resolve().parents[2]
TRACER = ROOT / "tests" / "helpers" / "request_path"
DOC = ROOT / "docs" / "architecture.md"
# The most a request may run (issue 46): a module added to the path must take one away.
MOST = 15


def _base(module: str) -> bool:
    return "/" not in module or module.startswith(("metrics/", "core/"))


def _documented() -> list[str]:
    text = DOC.read_text()
    section = text.split("### The modules it runs", 1)[1].split("\n#", 1)[0]
    return re.findall(r"^\| `([a-z_/]+\.py)`", section, flags=re.M)


def _traced(server: ServerProcess, out: Path) -> set[str]:
    buffer = io.BytesIO()
    np.save(buffer, np.zeros((1, 64), np.float32))
    for _ in range(3):  # the first requests may run what only a first request does
        with requests.Session() as session:  # one connection a request: each trace starts at its head
            answer = session.post(server.url + "/invocations", data=buffer.getvalue(),
                                  headers={"Content-Type": "application/x-npy", "Accept": "application/x-npy"})
            assert answer.status_code == 200, answer.text
    written = wait_until(lambda: sorted(p for p in out.parent.glob(out.name + ".*") if p.suffix != ".part"))
    return {line for line in written[0].read_text().split() if not _base(line)}


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> set[str]:
    out = tmp_path_factory.mktemp("path") / "trace"
    env = {"PYTHONPATH": str(TRACER), "REQUEST_PATH_OUT": str(out)}
    with ServerProcess(EXAMPLE_MODEL, env=env) as server:
        return _traced(server, out)


def test_the_doc_lists_the_modules_one_invocation_runs(traced):
    # The trace sees the whole path: the connection's side and the inference's.
    assert {"http/connection.py", "engine/batching/runner.py", "engine/model/torch_model.py"} <= traced
    documented = _documented()
    assert len(documented) == len(set(documented))
    assert set(documented) == traced


def test_one_invocation_runs_no_more_modules_than_it_did(traced):
    assert len(traced) <= MOST, "\n".join(sorted(traced))

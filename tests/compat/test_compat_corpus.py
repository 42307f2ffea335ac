"""`make compat-check` over every corpus entry (tests/compat/corpus): each answer of this
server must equal the AWS toolkit's, as is and with the PyTorch containers' batching
settings under concurrent requests. Both sides are real processes: the toolkit's
handler under TorchServe's ts backend, and this server's gunicorn. Per entry the toolkit's
side starts once and answers both trials (the settings are this server's only); this
server starts once per trial, in the test's own process (compat_check.run), and a
difference shows the trial as compat-check's options and its table."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile

import pytest

from local_test.compat_check import Trial, run
from tests.helpers.server import ROOT
from tests.compat.corpus import ENTRIES, materialize

# The entries that differ today, and why: each is a fix under way on this server's side.
# strict: once a fix lands, its entry passes, and this list must lose it.
DIFFER_TODAY: dict[str, str] = {}
AS_IS = Trial()
# The PyTorch containers' batching settings (a DLC endpoint's environment), and enough
# requests in flight to fill a batch.
DLC_BATCHING = Trial({"SAGEMAKER_TS_BATCH_SIZE": "8", "SAGEMAKER_TS_MAX_BATCH_DELAY": "50"}, concurrency=8, repeat=3)


def compat_check(model, requests_dir, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "local_test.compat_check", str(model), str(requests_dir), *args],
                          cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)


def entries():
    return [pytest.param(e, marks=pytest.mark.xfail(strict=True, reason=DIFFER_TODAY[e])) if e in DIFFER_TODAY else e
            for e in ENTRIES]


def test_the_corpus_is_as_promised():
    assert len(ENTRIES) >= 12
    assert set(DIFFER_TODAY) <= set(ENTRIES)
    for entry in ENTRIES:
        scripts = [p.read_text() for p in (ROOT / "tests/compat/corpus" / entry / "code").glob("*.py")]
        script = next(s for s in scripts if "def model_fn" in s)
        assert "Modelled on " in script, entry  # names the public script it follows


@pytest.mark.slow
@pytest.mark.parametrize("entry", entries())
def test_answers_equal_the_toolkits_as_is_and_with_dlc_batching(entry, tmp_path, monkeypatch):
    model, requests_dir, env = materialize(entry, tmp_path)
    for key, value in env.items():  # both sides', as the environment compat-check runs in
        monkeypatch.setenv(key, value)
    (logs := tmp_path / "logs").mkdir()
    outcomes = run(model, requests_dir, [AS_IS, DLC_BATCHING], logs=logs)
    differing = [f"{entry}, {o.trial}: answers differ (logs: {logs})\n{o.report()}" for o in outcomes if not o.equal]
    assert not differing, "\n\n".join(differing)


# A script that answers which server runs it: the ts package is loaded only on the
# toolkit's side, so its answers must differ there, and compat-check must say where.
WHICH_SERVER = '''
import json, sys
def model_fn(model_dir):
    return "model"
def input_fn(request_body, content_type):
    return json.loads(request_body)
def predict_fn(data, model):
    return data
def output_fn(prediction, accept):
    return json.dumps({"echo": prediction, "under_torchserve": "ts" in sys.modules})
'''


@pytest.mark.slow
def test_a_model_tar_gz_is_unpacked_and_a_difference_is_named(tmp_path):
    (tmp_path / "model" / "code").mkdir(parents=True)
    (tmp_path / "model" / "code" / "inference.py").write_text(WHICH_SERVER)
    with tarfile.open(tmp_path / "model.tar.gz", "w:gz") as archive:
        archive.add(tmp_path / "model" / "code", arcname="code")
    (tmp_path / "requests").mkdir()
    (tmp_path / "requests" / "echo.json").write_text('{"x": [1, 2.5]}')
    (tmp_path / "requests" / "echo.bin").write_text('{"x": [1, 2.5]}')
    (tmp_path / "requests" / "manifest.json").write_text('{"echo.bin": {"content_type": "application/json"}}')
    result = compat_check(tmp_path / "model.tar.gz", tmp_path / "requests", {})
    assert result.returncode == 1, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("echo.")]
    assert len(rows) == 2 and all("DIFFERS: $.under_torchserve: True vs False" in row for row in rows), result.stdout
    assert "0 of 2 answers equal; 2 differ" in result.stdout

"""One composition root: settings.py reads the environment (and gunicorn_conf.py, the
master's, may hand values to gunicorn and prometheus_client); every other module gets
what it needs handed down (docs/architecture.md, "Composition root")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from smserve.engine.worker import hardware
from smserve.settings import Settings, child_environment

PACKAGE = Path(__file__).resolve().parents[2] / "container" / "smserve"
ALLOWED = {"settings.py"}
READS = re.compile(r"os\.environ|getenv\(|from\s+os\s+import[^\n]*environ")


def test_only_the_composition_root_reads_the_environment():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name in ALLOWED:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if READS.search(line):
                found.append(f"{name}:{number}: {line.strip()}")
    assert not found, "the environment is read outside settings.py:\n" + "\n".join(found)


def test_the_runtime_variables_become_settings():
    settings = Settings.from_env({"SMSERVE_STATE_DIR": "/tmp/state", "PROMETHEUS_MULTIPROC_DIR": "/tmp/metrics",
                                  "CUDA_VISIBLE_DEVICES": ""})
    assert (settings.state_dir, settings.metrics_dir) == ("/tmp/state", "/tmp/metrics")
    assert settings.cuda_visible_devices == "" and settings.nvidia_visible_devices is None  # empty: no GPU
    assert Settings.from_env({"SMSERVE_STATE_DIR": " ", "PROMETHEUS_MULTIPROC_DIR": ""}).metrics_dir is None


@pytest.mark.parametrize("cuda, nvidia, expected", [
    ("0,1,2", None, 3), ("", None, 0), ("-1", None, 0), (None, "GPU-abc,GPU-def", 2), (None, "void", 0),
    ("all", "0,1", 2),  # "all" names no devices: the next list decides
])
def test_gpu_count_follows_the_visible_devices(cuda, nvidia, expected):
    env = {k: v for k, v in {"CUDA_VISIBLE_DEVICES": cuda, "NVIDIA_VISIBLE_DEVICES": nvidia}.items() if v is not None}
    settings = Settings.from_env(env)
    assert hardware.gpu_count(settings) == expected
    assert hardware.default_workers(settings) == max(expected, 1)


def test_a_child_gets_this_environment_with_its_overrides(monkeypatch):
    monkeypatch.setenv("SMSERVE_MAX_SESSIONS", "7")
    env = child_environment(PYTHONPATH="/x")
    assert env["PYTHONPATH"] == "/x" and Settings.from_env(env).max_sessions == 7

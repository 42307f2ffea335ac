"""The Makefile, through `make -n` dry runs: nothing is built or started."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.server import ROOT

# Variables of the user's shell that the Makefile reads; each test sets its own.
USER_VARIABLES = ("SM_MODEL_DIR", "SAGEMAKER_BIND_TO_PORT", "MODEL_DIR", "PORT", "TORCH_VARIANT", "VENV",
                  "SMSERVE_EXIT_ON_LOAD_ERROR", "TORCH_WHEEL_DIR", "BASE_IMAGE", "CONTAINER_ENGINE",
                  "MAKEFLAGS", "MFLAGS", "MAKELEVEL")


def make(*args: str, env: dict[str, str] | None = None) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in USER_VARIABLES}
    result = subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, env={**clean, **(env or {})},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-zA-Z][a-zA-Z0-9_-]*):(?!=)", text, re.MULTILINE))


def serve_command(output: str) -> str:
    return next(line for line in output.splitlines() if "container/serve serve" in line)


def test_help_lists_every_target_with_one_line():
    listed = {}
    for line in make("help").splitlines():
        name, _, description = line.strip().partition(" ")
        listed[name] = description.strip()
    missing = targets() - set(listed)
    assert not missing, f"targets without a `## description` on their line: {sorted(missing)}"
    assert all(listed.values()), "every target has a description"


def test_help_is_the_default_goal():
    assert make() == make("help")


def test_serve_defaults_to_the_example_on_8080_and_builds_it():
    out = make("-n", "-B", "serve", "VENV=/nonexistent-venv")
    assert f"SM_MODEL_DIR={ROOT}/build/model SAGEMAKER_BIND_TO_PORT=8080" in serve_command(out)
    assert "-m model.train" in out
    # A multi-model server loads from this checkout (make mme-local's cache), not /opt/ml/models.
    assert f" SMSERVE_MODELS_ROOT={ROOT} " in serve_command(out)


def test_sagemaker_variables_in_the_environment_win(tmp_path):
    out = make("-n", "-B", "serve", env={"SM_MODEL_DIR": str(tmp_path), "SAGEMAKER_BIND_TO_PORT": "9123"})
    assert serve_command(out).startswith(f"SM_MODEL_DIR={tmp_path} SAGEMAKER_BIND_TO_PORT=9123 ")


def test_make_variables_work_and_beat_the_environment(tmp_path):
    other = tmp_path / "other"
    out = make("-n", "-B", "serve", f"MODEL_DIR={tmp_path}", "PORT=9124",
               env={"SM_MODEL_DIR": str(other), "SAGEMAKER_BIND_TO_PORT": "9123"})
    assert serve_command(out).startswith(f"SM_MODEL_DIR={tmp_path} SAGEMAKER_BIND_TO_PORT=9124 ")


def test_relative_model_dir_is_made_absolute():
    out = make("-n", "-B", "serve", "MODEL_DIR=models/mine")
    assert f"SM_MODEL_DIR={ROOT}/models/mine " in serve_command(out)


@pytest.mark.parametrize("target", ["serve", "run", "sm-model"])
def test_a_user_model_never_trains_the_example(tmp_path, target):
    """Even without metadata.json, which the server derives."""
    (tmp_path / "model.pt2").write_bytes(b"")
    out = make("-n", "-B", target, f"MODEL_DIR={tmp_path}", "CONTAINER_ENGINE=podman", "IMAGE_URI=x@sha256:0")
    assert "model.train" not in out


def fake_venv(tmp_path, local_wheel: bool):
    """A venv whose python and uv record each call and succeed, except that a pip install
    with --no-index, and the look for a local wheel's folder, fail when no local torch
    wheel is to be had."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text('#!/bin/sh\necho "$*" >> "$(dirname "$0")/calls"\n'
                      f'case "$*" in *--no-index*|*local_wheel_folder*) exit {0 if local_wheel else 1};; esac\n')
    python.chmod(0o755)
    uv = venv / "bin" / "uv"
    uv.write_text('#!/bin/sh\necho "uv $*" >> "$(dirname "$0")/calls"\n')
    uv.chmod(0o755)
    return venv


def install(tmp_path, variant: str, local_wheel: bool = True) -> tuple[list[str], Path]:
    venv = fake_venv(tmp_path, local_wheel)
    make("install", f"TORCH_VARIANT={variant}", f"VENV={venv}")
    return (venv / "bin" / "calls").read_text().splitlines(), venv


def torch_pin() -> str:
    return re.search(r"^torch==(\S+)", (ROOT / "requirements-dev.txt").read_text(), re.MULTILINE).group(1)


@pytest.mark.parametrize("local_wheel", [True, False])
def test_cpu_install_takes_the_locked_set_and_torch_cpu_without_waiting_on_an_index(tmp_path, local_wheel):
    calls, venv = install(tmp_path, "cpu", local_wheel)
    # uv by pip, then by uv the hashed lock without torch, then torch's CPU build: from a
    # local wheel (pip's find-links, by uv from the folder pip's dry run found it in) with
    # no index at all; only when there is none, from the CPU index.
    assert calls[:2] == ["-m pip install --require-hashes --no-deps -r lock/uv.txt",
                         f"uv pip install --python {venv}/bin/python --require-hashes --no-deps --compile-bytecode -r lock/dev-no-torch.txt"]
    assert sorted(calls[2:4]) == [  # (the two ends of one pipe: either may log first)
        f"-m pip install --dry-run --quiet --no-deps --no-index --ignore-installed --report - torch=={torch_pin()}+cpu",
        "scripts/local_wheel_folder.py"]
    fallback = [c for c in calls if "--index-url" in c]
    if local_wheel:
        assert calls[4] == (f"uv pip install --python {venv}/bin/python --no-deps --no-index --compile-bytecode "
                            f"--find-links  torch=={torch_pin()}+cpu")  # (the fake found the folder "")
        assert not fallback
    else:
        assert calls[4:6] == [f"-m pip install --no-deps --no-index torch=={torch_pin()}+cpu",
                              f"-m pip install --no-deps --index-url https://download.pytorch.org/whl/cpu torch=={torch_pin()}+cpu"]
    installs = [c for c in calls if "install" in c and "--dry-run" not in c]
    assert not any("--quiet" in c or " -q " in f" {c} " for c in installs), "the installs' progress is shown"
    assert calls[-1] == "-m pip check"
    assert sorted(p.name for p in venv.glob(".installed-*")) == [".installed-cpu"]
    # Installed: a second `make install` has nothing to do.
    (venv / "bin" / "calls").unlink()
    make("install", "TORCH_VARIANT=cpu", f"VENV={venv}")
    assert not (venv / "bin" / "calls").exists()


def test_cuda_install_takes_pypi_torch_from_the_hashed_lock(tmp_path):
    calls, venv = install(tmp_path, "cuda")
    assert calls == ["-m pip install --require-hashes --no-deps -r lock/uv.txt",
                     f"uv pip install --python {venv}/bin/python --require-hashes --no-deps --compile-bytecode -r lock/dev.txt",
                     "-m pip check"]
    assert sorted(p.name for p in venv.glob(".installed-*")) == [".installed-cuda"]


def test_new_model_and_batch_example_run_their_modules(tmp_path):
    assert f"-m model.init {tmp_path}" in make("-n", "new-model", f"DIR={tmp_path}", "VENV=/tmp/some-venv")
    assert "-m local_test.batch_example" in make("-n", "-B", "batch-example", "VENV=/tmp/some-venv")


def make_result(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """make's whole result, failures included."""
    clean = {k: v for k, v in os.environ.items() if k not in USER_VARIABLES}
    return subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=60)


def serving_venv(tmp_path) -> Path:
    """A fake venv whose python records each call, and for `container/serve serve` the
    environment make hands the server, then exits as the server would after a failed load."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text('#!/bin/sh\necho "$*" >> "$(dirname "$0")/calls"\n'
                      'case "$*" in *"container/serve serve"*)\n'
                      '  echo "SM_MODEL_DIR=$SM_MODEL_DIR SMSERVE_EXIT_ON_LOAD_ERROR=$SMSERVE_EXIT_ON_LOAD_ERROR"'
                      ' > "$(dirname "$0")/served"; exit 3;;\nesac\n')
    python.chmod(0o755)
    uv = venv / "bin" / "uv"
    uv.write_text('#!/bin/sh\necho "uv $*" >> "$(dirname "$0")/calls"\n')
    uv.chmod(0o755)
    return venv


def test_serve_stops_on_a_model_that_fails_to_load(tmp_path):
    """Locally a broken model is the news: make serve asks the server to exit (it keeps
    running with /ping 500 only under SageMaker), and make fails with it."""
    venv = serving_venv(tmp_path)
    (tmp_path / "empty").mkdir()
    result = make_result("serve", f"MODEL_DIR={tmp_path / 'empty'}", "TORCH_VARIANT=cpu", f"VENV={venv}")
    assert result.returncode != 0
    assert (venv / "bin" / "served").read_text().split() == [f"SM_MODEL_DIR={tmp_path / 'empty'}",
                                                              "SMSERVE_EXIT_ON_LOAD_ERROR=true"]


def test_serve_leaves_the_server_up_when_asked(tmp_path):
    venv = serving_venv(tmp_path)
    make_result("serve", f"MODEL_DIR={tmp_path}", "TORCH_VARIANT=cpu", f"VENV={venv}",
                env={"SMSERVE_EXIT_ON_LOAD_ERROR": "false"})
    assert "SMSERVE_EXIT_ON_LOAD_ERROR=false" in (venv / "bin" / "served").read_text()


@pytest.mark.parametrize("how", ["make variable", "environment"])
def test_serve_on_a_missing_folder_names_the_setting_the_user_gave(tmp_path, how):
    venv = serving_venv(tmp_path)
    missing = tmp_path / "no-such-model"
    if how == "make variable":
        result = make_result("serve", f"MODEL_DIR={missing}", "TORCH_VARIANT=cpu", f"VENV={venv}")
        named = f"MODEL_DIR={missing} is not a folder"
    else:
        result = make_result("serve", "TORCH_VARIANT=cpu", f"VENV={venv}", env={"SM_MODEL_DIR": str(missing)})
        named = f"SM_MODEL_DIR={missing} is not a folder"
    assert result.returncode == 2
    assert named in result.stderr
    assert not (venv / "bin" / "served").exists(), "the server is not started"


def fake_engine(tmp_path, name: str, fails: bool) -> Path:
    """A container engine that records its arguments; a failing one says what podman
    says when the registry is out of reach."""
    engine = tmp_path / "bin" / name
    engine.parent.mkdir(exist_ok=True)
    failure = ('echo "Error: creating build container: initializing source docker://python:3.11-slim-bookworm: '
               'pinging container registry registry-1.docker.io: dial tcp: i/o timeout" >&2; exit 125\n')
    engine.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done > "$(dirname "$0")/args"\n'
                      + (failure if fails else "exit 0\n"))
    engine.chmod(0o755)
    return engine


def test_a_failed_build_says_how_to_make_the_base_image_locally(tmp_path):
    engine = fake_engine(tmp_path, "podman", fails=True)
    result = make_result("build", f"CONTAINER_ENGINE={engine}")
    assert result.returncode != 0
    (hint,) = [line for line in result.stderr.splitlines() if line.startswith("make build:")]
    assert "'make base-image'" in hint and "'make build BASE_IMAGE=localhost/bookworm-python:3.11'" in hint
    assert "Building offline or behind a proxy" in hint


def test_a_build_that_succeeds_says_nothing_more(tmp_path):
    engine = fake_engine(tmp_path, "podman", fails=False)
    result = make_result("build", f"CONTAINER_ENGINE={engine}")
    assert result.returncode == 0 and "base-image" not in result.stderr


def test_torch_wheel_dir_builds_with_the_local_wheel(tmp_path):
    """What the container tests pass by hand: the wheel's folder mounted into the build
    and searched by pip, and torch pinned to the wheel's own version."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / f"torch-{torch_pin()}+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    engine = fake_engine(tmp_path, "podman", fails=False)
    result = make_result("build", f"CONTAINER_ENGINE={engine}", f"TORCH_WHEEL_DIR={wheels}")
    assert result.returncode == 0, result.stderr
    args = (engine.parent / "args").read_text().splitlines()
    pairs = list(zip(args, args[1:]))
    assert ("--build-arg", f"TORCH_FIND_LINKS={wheels}") in pairs
    assert ("--volume", f"{wheels}:{wheels}:ro") in pairs
    assert ("--build-arg", f"TORCH_VERSION={torch_pin()}+cpu") in pairs


def test_torch_wheel_dir_without_the_wheel_or_with_docker_is_refused_before_building(tmp_path):
    (tmp_path / "wheels").mkdir()
    podman = fake_engine(tmp_path, "podman", fails=False)
    result = make_result("build", f"CONTAINER_ENGINE={podman}", f"TORCH_WHEEL_DIR={tmp_path / 'wheels'}")
    assert result.returncode == 2 and f"holds no torch-{torch_pin()} wheel" in result.stderr
    docker = fake_engine(tmp_path, "docker", fails=False)
    result = make_result("build", f"CONTAINER_ENGINE={docker}", f"TORCH_WHEEL_DIR={tmp_path / 'wheels'}")
    assert result.returncode == 2 and "TORCH_WHEEL_DIR needs podman" in result.stderr
    assert not (tmp_path / "bin" / "args").exists(), "the engine was not called"


@pytest.mark.parametrize("report, folder", [
    ({"install": [{"download_info": {"url": "file:///opt/my%20wheels/torch-2.13.0%2Bcpu-cp311-cp311-linux_x86_64.whl"}}]},
     "/opt/my wheels"),
    ({"install": [{"download_info": {"url": "https://example.com/wheels/torch-2.13.0%2Bcpu.whl"}}]}, None),
    ({"install": []}, None),
    ("not json", None),
])
def test_the_local_wheels_folder_is_read_from_pips_report(report, folder):
    result = subprocess.run([sys.executable, str(ROOT / "scripts/local_wheel_folder.py")], capture_output=True, text=True,
                            input=report if isinstance(report, str) else json.dumps(report))
    assert (result.returncode, result.stdout.strip()) == ((0, folder) if folder else (1, ""))

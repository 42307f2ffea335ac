"""code/requirements.txt in the model directory: installed by `serve` before gunicorn
starts, into a private prefix on PYTHONPATH; refused in seconds without network."""

from __future__ import annotations

import importlib.machinery
import io
import importlib.util
import os
import subprocess
import sys
import time
import zipfile

import pytest
import requests
from PIL import Image

from tests.helpers.server import ROOT, ServerProcess
from tests.helpers.models import IMAGE_TEST_SIZE

PIP_VARIABLES = ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL", "PIP_CONSTRAINT", "PIP_NO_INDEX")


def load_serve():
    loader = importlib.machinery.SourceFileLoader("serve_entrypoint", str(ROOT / "container" / "serve"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def make_wheel(directory, name="smserve_tinydep", version="1.0"):
    """A real (if minimal) wheel: one module, made here so no index is needed."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": "ANSWER = 42\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for filename, text in files.items():
            z.writestr(filename, text)
    return path


@pytest.fixture
def clean_pip_env(monkeypatch, tmp_path):
    """No pip configuration of this machine (find-links, local indexes) may help."""
    for name in PIP_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PYTHONPATH", "/already/there")
    monkeypatch.setenv("SMSERVE_CODE_DEPS_DIR", str(tmp_path / "deps"))


def test_no_requirements_changes_nothing(tmp_path, clean_pip_env):
    assert load_serve().install_code_requirements(str(tmp_path)) == 0
    assert os.environ["PYTHONPATH"] == "/already/there"
    assert not (tmp_path / "deps").exists()


def test_requirements_from_code_wheels_install_offline_onto_pythonpath(tmp_path, clean_pip_env, monkeypatch):
    model = tmp_path / "model"
    make_wheel(model / "code" / "wheels")
    (model / "code" / "requirements.txt").write_text("smserve_tinydep==1.0\n")
    # No index at all: only code/wheels can serve it.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    assert load_serve().install_code_requirements(str(model)) == 0

    path = os.environ["PYTHONPATH"].split(os.pathsep)
    assert path[-1] == "/already/there" and str(tmp_path / "deps") in path[0]
    check = subprocess.run([sys.executable, "-c", "import smserve_tinydep; print(smserve_tinydep.ANSWER)"],
                           env={**os.environ}, capture_output=True, text=True, timeout=60)
    assert check.stdout.strip() == "42", check.stderr
    # What the image has already (numpy) is not installed again into the prefix.
    assert not list((tmp_path / "deps").rglob("numpy"))


def test_without_network_serve_refuses_in_seconds_saying_what_to_do(tmp_path, clean_pip_env, monkeypatch, capfd):
    model = tmp_path / "model"
    (model / "code").mkdir(parents=True)
    (model / "code" / "requirements.txt").write_text("smserve-no-such-package==1.0\n")
    # Nothing listens on port 9: what an endpoint with network isolation sees, at once.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    started = time.monotonic()
    assert load_serve().install_code_requirements(str(model)) == 2
    assert time.monotonic() - started < 30
    err = capfd.readouterr().err
    assert "could not be installed" in err and "code/wheels" in err
    assert os.environ["PYTHONPATH"] == "/already/there"


def test_a_worker_imports_the_requirement(tmp_path, example_model_dir, make_server, monkeypatch):
    """The whole path: serve installs, then exec's gunicorn, whose workers import it."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(example_model_dir, model)
    make_wheel(model / "code" / "wheels")
    (model / "code" / "requirements.txt").write_text("smserve_tinydep==1.0\n")
    (model / "code" / "inference.py").write_text(
        "import smserve_tinydep\n\n"
        "def output_fn(prediction, accept):\n"
        "    return str(smserve_tinydep.ANSWER), 'text/plain'\n"
    )
    server = make_server(model, {"SMSERVE_CODE_DEPS_DIR": str(tmp_path / "deps")})
    answer = requests.post(server.url + "/invocations", json={"instances": [[0.0] * 64]}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.text == "42"


def test_starts_reuse_one_requirements_folder_and_leave_nothing_else(image_model_dir, tmp_path):
    """Each start used to leave a new /tmp/smserve-code-deps-* of ~22 MB behind."""
    image = io.BytesIO()
    Image.new("RGB", (IMAGE_TEST_SIZE, IMAGE_TEST_SIZE)).save(image, "JPEG")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    logs = []
    for start in range(2):
        log = tmp_path / f"server-{start}.log"
        server = ServerProcess(image_model_dir, {"TMPDIR": str(tmp)}, log_path=log).start()
        try:
            answer = requests.post(server.url + "/invocations", data=image.getvalue(), timeout=60,
                                   headers={"Content-Type": "image/jpeg"})
            assert answer.status_code == 200, answer.text
        finally:
            assert server.terminate() == 0
        logs.append(log.read_text())
    left = sorted(p.name for p in tmp.iterdir())
    assert len(left) == 1 and left[0].startswith("smserve-code-deps-"), left
    assert "installing" in logs[0] and "reused" not in logs[0]
    assert "already installed" in logs[1] and "reused" in logs[1], logs[1]

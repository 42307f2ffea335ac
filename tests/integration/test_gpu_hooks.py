"""A model's own hooks on a real GPU: what input_fn returns on the CPU reaches the
worker's GPU, batched; the hooks' threads have that GPU as their current device, and
the context names it; the image example answers JPEG there as it does on the CPU.
Skipped without CUDA (bench/gpu.sh runs these on a GPU host; the CPU stand-ins are in
tests/unit/test_hook_batching.py)."""

from __future__ import annotations

import io
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import torch
from PIL import Image

from tests.helpers.server import ServerProcess, passes_and_records, wait_until, logged
from tests.helpers.models import model_dir_with

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bench/gpu.sh runs it)")

DEVICE_HOOKS = '''
import json

import torch


def model_fn(model_dir):
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2).cuda().eval()  # .cuda(): the worker's GPU, current on this thread


def input_fn(body, content_type, context):
    return torch.tensor(json.loads(body)["x"], dtype=torch.float32)  # on the CPU


def predict_fn(data, model):
    if not data.is_cuda:
        raise RuntimeError(f"the batch is on {data.device}")
    with torch.inference_mode():
        return model(data)


def output_fn(prediction, accept, context):
    return json.dumps({"on": str(prediction.device), "context": str(context.device),
                       "current": torch.cuda.current_device(), "y": prediction.cpu().tolist()})
'''


def test_input_fn_tensors_reach_the_workers_gpu_batched_and_the_hooks_see_it(tmp_path):
    model = model_dir_with(tmp_path, DEVICE_HOOKS, "linear")
    (model / "metadata.json").write_text(json.dumps({
        "name": "linear", "max_batch_size": 16, "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}]}))
    torch.manual_seed(0)
    reference = torch.nn.Linear(4, 2).eval()
    env = {"SAGEMAKER_MODEL_SERVER_WORKERS": "2", "SMSERVE_MAX_BATCH_DELAY_MS": "50"}
    with ServerProcess(model, env, log_path=tmp_path / "server.log") as server:
        barrier = threading.Barrier(8)

        def send(i):
            x = [[float(i), 1.0, -1.0, 0.5]]
            barrier.wait()
            return x, requests.post(server.url + "/invocations", json={"x": x}, timeout=60)

        before = passes_and_records(server, "linear")
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(send, range(8)))
        # (Each worker writes its counts once a second: the other's are that late.)
        after = wait_until(lambda: (lambda now: now if now[1] - before[1] == 8 else None)(
            passes_and_records(server, "linear")), timeout=10)
        assert after, passes_and_records(server, "linear")
    for x, answer in answers:
        assert answer.status_code == 200, answer.text
        got = answer.json()
        assert got["on"] == "cuda:0" and got["context"] == "cuda:0" and got["current"] == 0
        with torch.inference_mode():
            np.testing.assert_allclose(got["y"], reference(torch.tensor(x)).tolist(), atol=1e-4)
    assert after[1] - before[1] == 8 and after[0] - before[0] < 8  # shared passes


def test_the_image_example_answers_jpeg_on_the_gpu_as_on_the_cpu(image_model_dir, tmp_path):
    import importlib.util
    import shutil

    model = tmp_path / "image"
    shutil.copytree(image_model_dir, model)
    (model / "code" / "requirements.txt").unlink()  # Pillow is there already; a GPU host may have no index
    spec = importlib.util.spec_from_file_location("image_hooks_gpu", model / "code" / "inference.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    program = torch.export.load(str(model / "model.pt2")).module()
    pictures = []
    for seed in range(6):
        out = io.BytesIO()
        Image.fromarray(np.random.default_rng(seed).integers(0, 256, (70, 90, 3), dtype=np.uint8)).save(out, "JPEG")
        pictures.append(out.getvalue())
    with ServerProcess(model, {"SMSERVE_MAX_BATCH_DELAY_MS": "50"}, log_path=tmp_path / "server.log") as server:
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda body: requests.post(server.url + "/invocations", data=body, timeout=60,
                                                               headers={"Content-Type": "image/jpeg"}), pictures))
        assert logged(server, "on cuda:0"), server.log()
    for body, answer in zip(pictures, answers):
        assert answer.status_code == 200, answer.text
        with torch.inference_mode():
            expected = json.loads(hooks.output_fn(program(hooks.input_fn(body, "image/jpeg")), "application/json")[0])
        got = answer.json()
        assert [c["label"] for c in got[0]] == [c["label"] for c in expected[0]]
        # cuDNN may use TF32 for convolutions: close, not equal.
        np.testing.assert_allclose([c["probability"] for c in got[0]], [c["probability"] for c in expected[0]],
                                   atol=5e-3)

"""The image as a multi-model endpoint: SAGEMAKER_MULTI_MODEL=true, no model at start,
two models loaded from a mounted folder through the model API, each answering."""

from __future__ import annotations

import json
import shutil

import pytest
import requests

from tests.container.support import Container, run

PIXELS = [[float(i % 17) for i in range(64)]]
# The image may be built for this module first (a session fixture).
pytestmark = pytest.mark.timeout(2400)


@pytest.mark.container
def test_the_image_declares_multi_model_support(podman, image):
    labels = json.loads(run([podman, "image", "inspect", image]).stdout)[0]["Config"]["Labels"]
    # Without it SageMaker refuses a MultiModel container for the image.
    assert labels["com.amazonaws.sagemaker.capabilities.multi-models"] == "true"


@pytest.mark.container
def test_the_image_in_multi_model_mode_loads_two_models_and_answers_both(podman, image, example_model_dir, tmp_path):
    models = tmp_path / "models"
    for name in ("alpha", "beta"):
        shutil.copytree(example_model_dir, models / name / "model")  # SageMaker's layout
    env = {"SAGEMAKER_MULTI_MODEL": "true", "SAGEMAKER_MODEL_SERVER_WORKERS": "2"}
    container = Container(podman, image, models, env, mount="/opt/ml/models").start()
    try:
        container.wait_ready()
        r = requests.post(container.url("/models"), json={"model_name": "x", "url": "/opt/program"}, timeout=60)
        assert r.status_code == 400 and "/opt/ml/models" in r.json()["error"], r.text  # only SageMaker's models
        for name in ("alpha", "beta"):
            r = requests.post(container.url("/models"),
                              json={"model_name": name, "url": f"/opt/ml/models/{name}/model"}, timeout=180)
            assert r.status_code == 200, r.text
        listed = requests.get(container.url("/models"), timeout=10).json()["models"]
        assert [m["modelName"] for m in listed] == ["alpha", "beta"]
        for name in ("alpha", "beta"):
            for _ in range(4):  # both workers
                r = requests.post(container.url(f"/models/{name}/invoke"), json={"instances": PIXELS}, timeout=60,
                                  headers={"X-Amzn-SageMaker-Target-Model": f"{name}.tar.gz"})
                assert r.status_code == 200 and len(r.json()["predictions"]) == 1, r.text
        assert requests.delete(container.url("/models/alpha"), timeout=60).status_code == 200
        assert requests.post(container.url("/models/alpha/invoke"), json={"instances": PIXELS},
                             timeout=60).status_code == 404
        assert requests.post(container.url("/models/beta/invoke"), json={"instances": PIXELS},
                             timeout=60).status_code == 200
    finally:
        container.close()

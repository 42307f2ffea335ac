"""The example model is a real classifier, built deterministically, packaged for SageMaker."""

import json
import subprocess
import sys
import tarfile

import numpy as np
import torch

from local_test.server_process import ROOT


def test_held_out_accuracy_is_at_least_0_95(example_model_dir, digits):
    metrics = json.loads((example_model_dir / "metrics.json").read_text())
    assert metrics["held_out_accuracy"] >= 0.95
    # Recomputed from the exported artifact, not only read from what training wrote.
    x, y = digits
    model = torch.export.load(str(example_model_dir / "model.pt2")).module()
    predicted = model(torch.from_numpy(x)).argmax(dim=1).numpy()
    assert (predicted == y).mean() == metrics["held_out_accuracy"]


def test_training_is_deterministic_and_packages_model_tar_gz(tmp_path, example_model_dir):
    result = subprocess.run([sys.executable, "-m", "model.train", "--out", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, check=True, timeout=300)
    assert "held-out accuracy" in result.stdout
    again = json.loads((tmp_path / "model" / "metrics.json").read_text())
    first = json.loads((example_model_dir / "metrics.json").read_text())
    assert again["held_out_accuracy"] == first["held_out_accuracy"]
    with tarfile.open(tmp_path / "model.tar.gz") as tar:
        names = sorted(tar.getnames())
    # Files at the archive's root: SageMaker unpacks it straight into /opt/ml/model.
    assert names == ["metadata.json", "metrics.json", "model.pt2"]


def test_metadata_describes_the_exported_program(example_model_dir):
    metadata = json.loads((example_model_dir / "metadata.json").read_text())
    program = torch.export.load(str(example_model_dir / "model.pt2"))
    assert program.graph_signature.user_inputs[0] == metadata["inputs"][0]["name"]
    out = program.module()(torch.zeros(3, *metadata["inputs"][0]["shape"]))
    assert list(out.shape[1:]) == metadata["outputs"][0]["shape"]
    np.testing.assert_allclose(out.sum(dim=1).detach().numpy(), 1, rtol=1e-5)

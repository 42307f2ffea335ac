"""The example model trains to a real classifier, deterministically, packaged for SageMaker
(a training run: seconds; kept out of the unit suite)."""

import json
import subprocess
import sys
import tarfile

import torch

from tests.helpers.server import ROOT


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

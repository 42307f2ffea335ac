"""The example model's metadata and forward pass (its training: tests/training)."""

import json

import numpy as np
import torch


def test_metadata_describes_the_exported_program(example_model_dir):
    metadata = json.loads((example_model_dir / "metadata.json").read_text())
    program = torch.export.load(str(example_model_dir / "model.pt2"))
    assert program.graph_signature.user_inputs[0] == metadata["inputs"][0]["name"]
    out = program.module()(torch.zeros(3, *metadata["inputs"][0]["shape"]))
    assert list(out.shape[1:]) == metadata["outputs"][0]["shape"]
    np.testing.assert_allclose(out.sum(dim=1).detach().numpy(), 1, rtol=1e-5)

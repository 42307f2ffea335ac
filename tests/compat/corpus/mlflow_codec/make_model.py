"""A scripted linear model over 4 features, seeded, and the same rows as JSON, CSV and .npy."""
import json

import numpy as np
import torch


def build(model_dir, requests_dir):
    torch.manual_seed(5)
    torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Tanh()).eval()).save(str(model_dir / "model.pt"))
    rows = np.random.default_rng(5).normal(size=(3, 4)).astype(np.float32)
    (requests_dir / "rows.json").write_text(json.dumps(rows.tolist()))
    (requests_dir / "rows.csv").write_text("\n".join(",".join(f"{v:.5f}" for v in row) for row in rows) + "\n")
    np.save(requests_dir / "rows.npy", rows)

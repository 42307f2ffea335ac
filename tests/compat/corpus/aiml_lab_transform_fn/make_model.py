"""A scripted MLP over 6 features, seeded, and a float32 .npy batch."""
import numpy as np
import torch


def build(model_dir, requests_dir):
    torch.manual_seed(7)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3), torch.nn.Softmax(dim=1))
    torch.jit.script(net.eval()).save(str(model_dir / "model.pt"))
    np.save(requests_dir / "batch.npy", np.random.default_rng(7).normal(size=(4, 6)).astype(np.float32))

"""A scripted linear layer over 2 features, seeded."""
import torch


def build(model_dir, requests_dir):
    torch.manual_seed(10)
    torch.jit.script(torch.nn.Linear(2, 2).eval()).save(str(model_dir / "model.pt"))

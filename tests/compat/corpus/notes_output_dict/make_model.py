"""A scripted regression over 5 features, seeded."""
import torch


def build(model_dir, requests_dir):
    torch.manual_seed(8)
    torch.jit.script(torch.nn.Linear(5, 1).eval()).save(str(model_dir / "model.pt"))

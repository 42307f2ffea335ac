"""A scripted regression over 4 features to one value, seeded."""
import torch


def build(model_dir, requests_dir):
    torch.manual_seed(11)
    torch.jit.script(torch.nn.Linear(4, 1).eval()).save(str(model_dir / "model.pt"))

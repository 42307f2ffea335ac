"""Seeded weights of the sibling module's Net, saved as a state_dict."""
import torch

from tests.compat.corpus import load_script


def build(model_dir, requests_dir):
    torch.manual_seed(1)
    net = load_script(model_dir, "model.py").Net
    torch.save(torch.nn.DataParallel(net()).state_dict(), model_dir / "model.pth")

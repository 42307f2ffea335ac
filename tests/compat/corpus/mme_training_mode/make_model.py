"""Seeded weights of the sibling module's Net, saved as a state_dict."""
import sys

import torch


def build(model_dir, requests_dir):
    torch.manual_seed(1)
    sys.path.insert(0, str(model_dir / "code"))
    try:
        from model import Net
        torch.save(torch.nn.DataParallel(Net()).state_dict(), model_dir / "model.pth")
    finally:
        sys.path.remove(str(model_dir / "code"))
        sys.modules.pop("model", None)

"""A scripted MLP over 3 features, seeded."""
import torch


def build(model_dir, requests_dir):
    torch.manual_seed(9)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Sigmoid(), torch.nn.Linear(4, 2))
    torch.jit.script(net.eval()).save(str(model_dir / "model.pt"))

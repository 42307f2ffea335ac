"""A scripted CNN over 3x8x8 images (the flower classifier, small), seeded."""
import torch
import torch.nn as nn


class Flowers(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return torch.softmax(self.fc(torch.relu(self.conv(x)).flatten(1)), dim=1)


def build(model_dir, requests_dir):
    torch.manual_seed(2)
    torch.jit.script(Flowers().eval()).save(str(model_dir / "model.scripted.pt"))
    import json
    images = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    (requests_dir / "inputs.json").write_text(json.dumps({"inputs": images.tolist()}))

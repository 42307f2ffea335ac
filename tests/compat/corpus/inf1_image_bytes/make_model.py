"""A scripted CNN over 3x16x16 images, seeded, and a PNG and a JPEG made with Pillow."""
import numpy as np
import torch
import torch.nn as nn
from PIL import Image


class TinyResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def build(model_dir, requests_dir):
    torch.manual_seed(4)
    torch.jit.script(TinyResNet().eval()).save(str(model_dir / "model.pt"))
    pixels = np.random.default_rng(4).integers(0, 256, (24, 24, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(requests_dir / "cat.png")
    Image.fromarray(pixels[::-1]).save(requests_dir / "dog.jpg", quality=90)

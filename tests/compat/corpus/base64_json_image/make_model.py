"""A traced CNN over 1x8x8 images, seeded, and a PNG sent base64 in JSON."""
import base64
import io
import json

import numpy as np
import torch
from PIL import Image


def build(model_dir, requests_dir):
    torch.manual_seed(12)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(3 * 6 * 6, 4))
    torch.jit.trace(net.eval(), torch.zeros(1, 1, 8, 8)).save(str(model_dir / "traced_model.pt"))
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(12).integers(0, 256, (20, 20), dtype=np.uint8)).save(buffer, format="PNG")
    (requests_dir / "digit.json").write_text(json.dumps({"image": base64.b64encode(buffer.getvalue()).decode()}))

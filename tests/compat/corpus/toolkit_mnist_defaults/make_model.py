"""The toolkit's MNIST test model, small: seeded weights saved as a state_dict, and
14x14 images as JSON, CSV and .npy requests."""
import json

import numpy as np
import torch

from tests.compat.corpus import load_script


def build(model_dir, requests_dir):
    torch.manual_seed(0)
    script = load_script(model_dir)
    torch.save(torch.nn.DataParallel(script.Net()).state_dict(), model_dir / "torch_model.pth")
    images = np.random.default_rng(0).random((2, 1, 14, 14), dtype=np.float32)
    (requests_dir / "two_images.json").write_text(json.dumps(images.tolist()))
    np.save(requests_dir / "two_images.npy", images)
    # CSV rows: the toolkit's decoder makes a (rows, 144) array, reshaped by nothing,
    # so each row is one 14x14 image only where the model reshapes: here it does not,
    # and both sides should refuse it alike.
    (requests_dir / "one_row.csv").write_text(",".join(f"{v:.4f}" for v in images[0].ravel()) + "\n")

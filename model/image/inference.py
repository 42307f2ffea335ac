"""The image example's hooks (code/inference.py in its model folder): images in, the top
classes with their labels out.

input_fn takes what the SageMaker Python SDK sends for images (IdentitySerializer or
DataSerializer: the file's bytes, as `image/jpeg`, `image/png` or `application/x-image`)
and several images in one JSON request, `{"instances": [{"b64": "<base64 of a file>"}, ...]}`.
Anything else it hands back to the server's own codecs (`return NotImplemented`): a
`.npy` or JSON tensor of already prepared pixels, [N, 3, S, S], then needs no Pillow.
Its tensor, on the CPU, is batched by the server with other requests' and moved to the
worker's device.

output_fn answers JSON (or JSON Lines: one line per image): each image's top classes,
`[{"label": "cat", "probability": 0.71}, ...]`. Any other Accept (`text/csv`,
`application/x-npy`) it hands back as well: the server writes the raw logits.

The server runs these on its codec threads, two requests' at once and while the model
runs: keep them free of shared state that is not safe across threads.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import os

import numpy as np
import torch
from PIL import Image

MODEL_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(MODEL_DIR, "metadata.json")) as f:
    _METADATA = json.load(f)
SIZE = _METADATA["inputs"][0]["shape"][-1]
LABELS = _METADATA["outputs"][0]["labels"]

IMAGE_TYPES = ("image/jpeg", "image/png", "application/x-image")
# An image takes 3 x SIZE x SIZE floats however small its file: a cap on the images of
# one request bounds what a body of a few KB can make the server allocate.
MAX_IMAGES = 256
# Pillow refuses larger images outright (DecompressionBombError: a 400 here): a file of
# a few KB can declare a picture of gigapixels.
Image.MAX_IMAGE_PIXELS = 64_000_000
TOP_K = 3
# ImageNet's channel statistics, as torchvision's ResNet-18 weights expect.
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def input_fn(body: bytes | str, content_type: str):
    kind = content_type.split(";")[0].strip().lower()
    if kind in IMAGE_TYPES:
        files = [body]
    elif kind == "application/json" and ('"b64"' if isinstance(body, str) else b'"b64"') in body:  # str: as the toolkit hands JSON
        files = _base64_files(body)
    else:
        return NotImplemented  # the server's codecs: .npy, CSV, JSON tensors of prepared pixels
    if not files:
        raise ValueError('no images: send {"instances": [{"b64": "..."}, ...]} with at least one')
    if len(files) > MAX_IMAGES:
        raise ValueError(f"{len(files)} images in one request; at most {MAX_IMAGES}")
    pixels = torch.stack([_pixels(data, i) for i, data in enumerate(files)])
    return (pixels.float().div_(255) - MEAN) / STD


def _base64_files(body: bytes | str) -> list[bytes]:
    document = json.loads(body)
    instances = document.get("instances") if isinstance(document, dict) else None
    if not isinstance(instances, list) or not all(isinstance(i, dict) and isinstance(i.get("b64"), str)
                                                  for i in instances):
        raise ValueError('expected {"instances": [{"b64": "<base64 of an image file>"}, ...]}')
    try:
        return [base64.b64decode(instance["b64"], validate=True) for instance in instances]
    except binascii.Error as e:
        raise ValueError(f"an instance's b64 is not base64: {e}") from None


def _pixels(data: bytes, index: int) -> torch.Tensor:
    """One image file -> uint8 [3, SIZE, SIZE]."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            # A JPEG decodes straight to about the size wanted (libjpeg scales while it
            # decodes): a 4000x3000 photo costs a fraction of decoding it whole.
            image.draft("RGB", (SIZE, SIZE))
            rgb = image.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BILINEAR)
            array = np.asarray(rgb, dtype=np.uint8)
    except (OSError, Image.DecompressionBombError) as e:
        raise ValueError(f"image {index}: {e}") from None
    return torch.from_numpy(array.copy()).permute(2, 0, 1)


def output_fn(prediction: torch.Tensor, accept: str):
    if accept not in ("application/json", "application/jsonlines"):
        return NotImplemented  # the server's encoders: the logits as CSV, .npy
    probabilities = torch.softmax(prediction.float(), dim=1)
    top = probabilities.topk(min(TOP_K, len(LABELS)), dim=1)
    answers = [[{"label": LABELS[c], "probability": round(p, 6)} for p, c in zip(row_p, row_c)]
               for row_p, row_c in zip(top.values.tolist(), top.indices.tolist())]
    if accept == "application/jsonlines":
        return "".join(json.dumps(answer) + "\n" for answer in answers), accept
    return json.dumps(answers), accept

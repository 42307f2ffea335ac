"""Build the image example (ResNet-18 with random weights) and package it the way SageMaker expects.

    python -m model.image.build --out build [--size 224] [--classes 10] [--seed 0]

The weights are random (seeded): the example shows how an image model is served (JPEG in
through input_fn, batched across requests, top-k labels out), not what it sees; put a
trained state_dict in with --weights. Writes build/image/ (model.pt2 exported with a
dynamic batch dimension, metadata.json, code/inference.py, code/requirements.txt) and
build/image.tar.gz (the same files at the archive's root). A few seconds on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tarfile
import time

import torch

from model.image.resnet import ResNet18

HERE = os.path.dirname(os.path.abspath(__file__))
# A pass of 64 images at 224 x 224 holds ~40 MB of input and ~2 GB of activations on the CPU.
MAX_BATCH_SIZE = 64
# Classes of the example (CIFAR-10's names): what the labels of an answer look like.
LABELS = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# What code/requirements.txt asks for: the Pillow the tests and the lock have.
PILLOW = "pillow==13.0.0"


def metadata(size: int, labels: list[str]) -> dict:
    return {
        "name": "image",
        "version": "1",
        "platform": "pytorch_torchexport",
        "max_batch_size": MAX_BATCH_SIZE,
        "inputs": [{"name": "image", "datatype": "FP32", "shape": [3, size, size]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [len(labels)], "labels": labels}],
    }


def resnet18(classes: int) -> tuple[torch.nn.Module, str]:
    """torchvision's ResNet-18 where torchvision imports (beside PyPI's CUDA torch), else
    model/image/resnet.py's: the same layout and state_dict names, so weights load into either."""
    try:
        from torchvision.models import resnet18 as torchvision_resnet18
    except Exception:  # noqa: BLE001 - absent, or built for another torch (PyPI's beside the CPU build fails to import)
        return ResNet18(num_classes=classes).eval(), "model/image/resnet.py (torchvision does not import here)"
    return torchvision_resnet18(num_classes=classes).eval(), "torchvision"


def build(out: str, size: int = 224, classes: int = len(LABELS), seed: int = 0, weights: str | None = None) -> str:
    """The model folder out/image (and out/image.tar.gz); returns the folder."""
    torch.manual_seed(seed)
    model, source = resnet18(classes)
    print(f"image example: ResNet-18 from {source}")
    if weights:
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    labels = list(LABELS[:classes]) + [f"class-{i}" for i in range(len(LABELS), classes)]
    model_dir = os.path.join(out, "image")
    shutil.rmtree(model_dir, ignore_errors=True)
    os.makedirs(os.path.join(model_dir, "code"))
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH_SIZE * 64)
    program = torch.export.export(model, (torch.zeros(2, 3, size, size),), dynamic_shapes=({0: batch},))
    torch.export.save(program, os.path.join(model_dir, "model.pt2"))
    with open(os.path.join(model_dir, "metadata.json"), "w") as f:
        json.dump(metadata(size, labels), f, indent=2)
    shutil.copy(os.path.join(HERE, "inference.py"), os.path.join(model_dir, "code", "inference.py"))
    with open(os.path.join(model_dir, "code", "requirements.txt"), "w") as f:
        f.write(f"# input_fn reads JPEG and PNG with Pillow; serve installs this at start.\n{PILLOW}\n")
    with tarfile.open(os.path.join(out, "image.tar.gz"), "w:gz") as tar:
        for name in sorted(os.listdir(model_dir)):
            tar.add(os.path.join(model_dir, name), arcname=name)
    return model_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build", help="output folder (default: build)")
    parser.add_argument("--size", type=int, default=224, help="image side in pixels (default: 224)")
    parser.add_argument("--classes", type=int, default=len(LABELS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--weights", help="a state_dict (torch.save of model.state_dict()) to load instead")
    args = parser.parse_args(argv)
    started = time.monotonic()
    model_dir = build(args.out, args.size, args.classes, args.seed, args.weights)
    print(f"ResNet-18, {args.classes} classes, {args.size}x{args.size} RGB in, "
          f"{'weights from ' + args.weights if args.weights else 'random weights (seed %d)' % args.seed}; "
          f"wrote {model_dir}/ and {args.out}/image.tar.gz in {time.monotonic() - started:.1f}s")


if __name__ == "__main__":
    main()

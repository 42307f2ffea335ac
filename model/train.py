"""Train the example digits classifier and package it the way SageMaker expects.

    python -m model.train --out build

writes build/model/ (model.pt2, metadata.json, metrics.json) and build/model.tar.gz
(the same files at the archive's root: SageMaker unpacks it into /opt/ml/model), and
prints the held-out accuracy. Deterministic for a given --seed; seconds on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import tarfile
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from model.digits import N_CLASSES, N_PIXELS, DigitsClassifier

MAX_BATCH_SIZE = 256
TEST_FRACTION = 0.25


def load_split(seed: int = 0):
    """(x_train, x_test, y_train, y_test): float32 pixels [n, 64], int64 labels."""
    digits = load_digits()
    x = digits.data.astype(np.float32)
    y = digits.target.astype(np.int64)
    return train_test_split(x, y, test_size=TEST_FRACTION, random_state=seed, stratify=y)


def train(x: np.ndarray, y: np.ndarray, seed: int = 0, epochs: int = 60) -> DigitsClassifier:
    torch.manual_seed(seed)
    model = DigitsClassifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(xt), generator=generator).split(64):
            optimizer.zero_grad()
            loss_fn(model.logits(xt[idx]), yt[idx]).backward()
            optimizer.step()
    return model.eval()


def accuracy(model: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        predicted = model(torch.from_numpy(x)).argmax(dim=1).numpy()
    return float((predicted == y).mean())


def metadata() -> dict:
    return {
        "name": "digits",
        "version": "1",
        "platform": "pytorch_torchexport",
        "max_batch_size": MAX_BATCH_SIZE,
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [N_PIXELS]}],
        "outputs": [
            {
                "name": "probabilities",
                "datatype": "FP32",
                "shape": [N_CLASSES],
                "labels": [str(i) for i in range(N_CLASSES)],
            }
        ],
    }


def export(model: torch.nn.Module, model_dir: str) -> None:
    """model.pt2 via torch.export, with a dynamic batch dimension."""
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH_SIZE * 64)
    example = (torch.zeros(4, N_PIXELS),)
    program = torch.export.export(model, example, dynamic_shapes=({0: batch},))
    torch.export.save(program, os.path.join(model_dir, "model.pt2"))


def package(model_dir: str, tar_path: str) -> None:
    with tarfile.open(tar_path, "w:gz") as tar:
        for name in sorted(os.listdir(model_dir)):
            tar.add(os.path.join(model_dir, name), arcname=name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build", help="output folder (default: build)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=60)
    args = parser.parse_args(argv)

    started = time.monotonic()
    x_train, x_test, y_train, y_test = load_split(args.seed)
    model = train(x_train, y_train, args.seed, args.epochs)
    held_out = accuracy(model, x_test, y_test)

    model_dir = os.path.join(args.out, "model")
    os.makedirs(model_dir, exist_ok=True)
    export(model, model_dir)
    with open(os.path.join(model_dir, "metadata.json"), "w") as f:
        json.dump(metadata(), f, indent=2)
    metrics = {"held_out_accuracy": held_out, "test_records": int(len(y_test)), "seed": args.seed}
    with open(os.path.join(model_dir, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    package(model_dir, os.path.join(args.out, "model.tar.gz"))
    print(
        f"held-out accuracy {held_out:.4f} on {len(y_test)} digits; "
        f"wrote {model_dir}/ and {args.out}/model.tar.gz in {time.monotonic() - started:.1f}s"
    )


if __name__ == "__main__":
    main()

"""Train the textgen example (a character-level GRU) and package it the way SageMaker expects.

    python -m model.textgen.train --out build

The text is the descriptions of scikit-learn's data sets (the `DESCR` of load_iris,
load_digits, ... and of the fetchers, shipped as .rst files inside scikit-learn, so no
download). The last tenth of each description is held out. Writes build/textgen/
(weights.pt, config.json, vocab.json, metrics.json, code/inference.py) and
build/textgen.tar.gz (the same files at the archive's root: SageMaker unpacks it into
/opt/ml/model). Prints the training loss and the held-out perplexity against the uniform
baseline (the vocabulary's size). Bit-identical for a given --seed, torch build and
thread count; about half a minute on two CPU cores.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import math
import os
import shutil
import tarfile
import time

import torch

from model.textgen.inference import CONFIG, START, UNKNOWN, VOCAB, WEIGHTS, CharGRU, Vocabulary

HELD_OUT_FRACTION = 0.1
ARCHITECTURE = {"embedding_dim": 48, "hidden_size": 128, "num_layers": 1}
INFERENCE_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inference.py")


def descriptions() -> dict[str, str]:
    """name -> text of every data set description scikit-learn ships, in name order."""
    folder = importlib.resources.files("sklearn.datasets.descr")
    texts = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".rst"):
            texts[entry.name[: -len(".rst")]] = entry.read_text(encoding="utf-8")
    if not texts:
        raise RuntimeError("found no data set descriptions in sklearn.datasets.descr")
    return texts


def load_corpus() -> tuple[str, str]:
    """(train, held_out): each description split at a line boundary, its last tenth held out."""
    train, held_out = [], []
    for text in descriptions().values():
        cut = text.rfind("\n", 0, int(len(text) * (1 - HELD_OUT_FRACTION))) + 1
        train.append(text[:cut])
        held_out.append(text[cut:])
    return START.join(train), START.join(held_out)


def build_vocabulary(text: str) -> Vocabulary:
    return Vocabulary(sorted(set(text) | {START, UNKNOWN}))


def train(text: str, vocab: Vocabulary, seed: int = 0, steps: int = 400, batch: int = 64, length: int = 64,
          lr: float = 5e-3, log=print) -> tuple[CharGRU, float]:
    """Adam on random windows of the text, the learning rate decaying to a tenth.
    Returns the network (eval mode) and the mean loss of the last tenth of the steps."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(seed)
        windows = torch.Generator().manual_seed(seed)
        ids = torch.tensor(vocab.encode(text), dtype=torch.long)
        network = CharGRU(len(vocab), **ARCHITECTURE)
        optimizer = torch.optim.Adam(network.parameters(), lr=lr)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        loss_fn = torch.nn.CrossEntropyLoss()
        offsets = torch.arange(length + 1)
        network.train()
        recent = []
        for step in range(1, steps + 1):
            starts = torch.randint(0, len(ids) - length - 1, (batch,), generator=windows)
            chunk = ids[starts[:, None] + offsets]
            logits, _ = network(chunk[:, :-1])
            loss = loss_fn(logits.reshape(-1, len(vocab)), chunk[:, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(network.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            recent = (recent + [loss.item()])[-max(1, steps // 10):]
            if log and (step % max(1, steps // 10) == 0 or step == steps):
                mean = sum(recent) / len(recent)
                log(f"step {step:5d}/{steps}  train loss {mean:.3f}  perplexity {math.exp(mean):.2f}")
        return network.eval(), sum(recent) / len(recent)
    finally:
        torch.use_deterministic_algorithms(previous)


@torch.inference_mode()
def perplexity(network: CharGRU, vocab: Vocabulary, text: str) -> float:
    """exp(mean negative log-likelihood) of each character of `text` given those before it,
    reading the text as one stream from the start token."""
    ids = torch.tensor([vocab.encode(START + text)], dtype=torch.long)
    logits, _ = network.eval()(ids[:, :-1])
    nll = torch.nn.functional.cross_entropy(logits[0], ids[0, 1:])
    return math.exp(nll.item())


def save(network: CharGRU, vocab: Vocabulary, metrics: dict, model_dir: str) -> None:
    """The artifact: plain tensors (torch.load(weights_only=True) reads them), JSON, the hooks."""
    os.makedirs(os.path.join(model_dir, "code"), exist_ok=True)
    torch.save(network.state_dict(), os.path.join(model_dir, WEIGHTS))
    with open(os.path.join(model_dir, CONFIG), "w") as f:
        json.dump(ARCHITECTURE, f, indent=2)
    with open(os.path.join(model_dir, VOCAB), "w", encoding="utf-8") as f:
        json.dump({"chars": vocab.chars}, f, indent=1)
    with open(os.path.join(model_dir, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    shutil.copyfile(INFERENCE_SOURCE, os.path.join(model_dir, "code", "inference.py"))


def package(model_dir: str, tar_path: str) -> None:
    """Files at the archive's root, sorted, with fixed owners and times: the same model
    gives the same archive members."""
    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    with tarfile.open(tar_path, "w:gz") as tar:
        for root, dirs, files in os.walk(model_dir):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                path = os.path.join(root, name)
                tar.add(path, arcname=os.path.relpath(path, model_dir), filter=normalise)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build", help="output folder (default: build)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args(argv)

    started = time.monotonic()
    train_text, held_out_text = load_corpus()
    vocab = build_vocabulary(train_text + held_out_text)
    network, train_loss = train(train_text, vocab, args.seed, args.steps)
    trained = time.monotonic() - started
    held_out = perplexity(network, vocab, held_out_text)
    metrics = {
        "train_loss": train_loss,
        "train_perplexity": math.exp(train_loss),
        "held_out_perplexity": held_out,
        "uniform_perplexity": len(vocab),
        "held_out_chars": len(held_out_text),
        "train_chars": len(train_text),
        "steps": args.steps,
        "seed": args.seed,
        "train_seconds": round(trained, 1),
    }
    model_dir = os.path.join(args.out, "textgen")
    save(network, vocab, metrics, model_dir)
    package(model_dir, os.path.join(args.out, "textgen.tar.gz"))
    print(
        f"held-out perplexity {held_out:.2f} on {len(held_out_text)} characters "
        f"(uniform baseline {len(vocab)}); train loss {train_loss:.3f}; trained in {trained:.1f}s; "
        f"wrote {model_dir}/ and {args.out}/textgen.tar.gz"
    )


if __name__ == "__main__":
    main()

"""Genuine torch.export archives changed, each in one way, so that torch.export.load
would run a pickle's code: the code creates a marker file (open(marker, "w"))."""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from pathlib import Path

import torch


class Marker:
    """Unpickled, it creates `path` (open(path, "w")): the proof that a pickle ran."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)
        self.scale = torch.tensor([1.0, 2.0])  # a constant

    def forward(self, x):
        return self.linear(x) * self.scale


def _saved(marker: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save(Marker(marker), buffer)
    return buffer.getvalue()


def _rewrite(source: Path, target: Path, change) -> None:
    """target: source's entries (root folder stripped) through change(entries), stored."""
    with zipfile.ZipFile(source) as archive:
        root = archive.namelist()[0].split("/", 1)[0] + "/"
        entries = {name[len(root):]: archive.read(name) for name in archive.namelist()}
    change(entries)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as archive:
        for name, data in entries.items():
            archive.writestr(root + name, data)


def _config(entries: dict, name: str) -> dict:
    return json.loads(entries[name])


def pickled_weight(entries: dict, marker: Path) -> None:
    """One weight marked use_pickle, its payload a torch.save pickle (torch.load, weights_only=False)."""
    name = "data/weights/model_weights_config.json"
    config = _config(entries, name)
    meta = config["config"]["linear.bias"]
    meta["use_pickle"] = True
    entries["data/weights/" + meta["path_name"]] = _saved(marker)
    entries[name] = json.dumps(config).encode()


def opaque_constant(entries: dict, marker: Path) -> None:
    """A constant stored as an opaque object (pickle.loads)."""
    name = "data/constants/model_constants_config.json"
    config = _config(entries, name)
    meta = config["config"]["scale"]
    meta.update(path_name="opaque_obj_0", use_pickle=True, tensor_meta=None)  # as torch.export.save writes one
    entries["data/constants/opaque_obj_0"] = pickle.dumps(Marker(marker))
    entries[name] = json.dumps(config).encode()


def pickled_sample_inputs(entries: dict, marker: Path) -> None:
    """Example inputs that weights_only refuses (torch then loads them with weights_only=False)."""
    entries["data/sample_inputs/model.pt"] = _saved(marker)


def legacy_weights(entries: dict, marker: Path) -> None:
    """The older layout's one weights file, a torch.save pickle."""
    del entries["data/weights/model_weights_config.json"]
    entries["data/weights/model.pt"] = _saved(marker)


CHANGES = {f.__name__: f for f in (pickled_weight, opaque_constant, pickled_sample_inputs, legacy_weights)}


def unsafe_export(folder: Path, change: str, marker: Path) -> Path:
    """folder/model.pt2: a genuine export of Small, changed by CHANGES[change]."""
    folder.mkdir(parents=True, exist_ok=True)
    clean = folder / "clean.pt2"
    torch.export.save(torch.export.export(Small(), (torch.zeros(1, 3),)), str(clean))
    path = folder / "model.pt2"
    _rewrite(clean, path, lambda entries: CHANGES[change](entries, marker))
    clean.unlink()
    return path

"""Genuine torch.export archives changed, each in one way, so that torch.export.load
would run code, a pickle's or an expression's: it creates a marker file (open(marker,
"w")). foreign_target's graph would run code at its first forward pass instead."""

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


def _graph_values(entries: dict, field: str, change) -> None:
    """Every value of `field` in the graph (models/model.json) through change(value)."""
    def walk(value):
        if isinstance(value, list):
            return [walk(item) for item in value]
        if isinstance(value, dict):
            return {k: change(v) if k == field and isinstance(v, str) else walk(v) for k, v in value.items()}
        return value

    entries["models/model.json"] = json.dumps(walk(json.loads(entries["models/model.json"]))).encode()


def evaluated_shape(entries: dict, marker: Path) -> None:
    """A symbolic shape's expression that is Python (torch reads it with sympy.sympify, an eval)."""
    _graph_values(entries, "expr_str", lambda expr: f"(__import__('builtins').open({str(marker)!r}, 'w') and {expr})")


CHANGES = {f.__name__: f for f in (pickled_weight, opaque_constant, pickled_sample_inputs, legacy_weights,
                                   evaluated_shape)}


def foreign_target(entries: dict, marker: Path) -> None:
    """A graph node calling what torch resolves from its own module's attributes (torch.os.system)."""
    _graph_values(entries, "target", lambda target: "torch.os.system" if target.endswith("linear.default") else target)


def unsafe_export(folder: Path, change: str, marker: Path) -> Path:
    """folder/model.pt2: a genuine export of Small, changed by CHANGES[change]."""
    folder.mkdir(parents=True, exist_ok=True)
    clean = folder / "clean.pt2"
    batch = torch.export.Dim("batch", max=64)  # (a symbolic shape: its expressions are in the graph)
    torch.export.save(torch.export.export(Small(), (torch.zeros(2, 3),), dynamic_shapes=({0: batch},)), str(clean))
    path = folder / "model.pt2"
    _rewrite(clean, path, lambda entries: {**CHANGES, "foreign_target": foreign_target}[change](entries, marker))
    clean.unlink()
    return path

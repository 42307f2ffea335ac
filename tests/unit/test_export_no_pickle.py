"""engine/artifacts.load_exported: a model.pt2 whose loading would unpickle anything, or
evaluate its graph's text as Python, is refused before torch reads it, and torch itself
would have run each of these archives' code."""

from __future__ import annotations

import warnings

import pytest
import torch

from smserve.engine.model import artifacts
from smserve.engine.model.artifacts import ModelLoadError
from tests.helpers.unsafe_archives import CHANGES, Small, unsafe_export


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_an_archive_that_would_unpickle_is_refused_and_runs_nothing(tmp_path, change):
    marker = tmp_path / "ran"
    path = unsafe_export(tmp_path / "model", change, marker)

    with pytest.raises(ModelLoadError, match="never unpickles|not an archive|evaluated as Python"):
        artifacts.load_exported(str(path))
    assert not marker.exists()

    # The archive is genuine: torch's own load runs its pickle.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.export.load(str(path))
        except Exception:  # noqa: BLE001 - what the pickle made is no weight; the code ran first
            pass
    assert marker.exists()


def test_a_plain_export_still_loads(tmp_path):
    model = Small().eval()
    path = tmp_path / "model.pt2"
    batch = torch.export.Dim("batch", max=64)
    torch.export.save(torch.export.export(model, (torch.zeros(2, 3),), dynamic_shapes=({0: batch},)), str(path))
    program = artifacts.load_exported(str(path))
    x = torch.ones(5, 3)
    assert torch.equal(program.module()(x), model(x))


def test_an_entry_the_server_does_not_know_is_refused(tmp_path):
    path = tmp_path / "model.pt2"
    torch.export.save(torch.export.export(Small(), (torch.zeros(1, 3),)), str(path))
    import zipfile

    with zipfile.ZipFile(path, "a") as archive:
        root = archive.namelist()[0].split("/", 1)[0]
        archive.writestr(f"{root}/data/aotinductor/model/model.so", b"\x7fELF")
    with pytest.raises(ModelLoadError, match="data/aotinductor/model/model.so"):
        artifacts.load_exported(str(path))


def test_a_graph_calling_what_torch_export_does_not_write_is_refused(tmp_path):
    path = unsafe_export(tmp_path / "model", "foreign_target", tmp_path / "unused")
    with pytest.raises(ModelLoadError, match="torch.os.system"):
        artifacts.load_exported(str(path))

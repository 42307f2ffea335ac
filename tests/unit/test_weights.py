"""engine/model/weights.py: a torch.export archive's weights read with the GIL released, into
the same tensors torch's own reader makes."""

from __future__ import annotations

import sys
import threading
import warnings
import zipfile

import pytest
import torch

from smserve.engine.model import artifacts
from smserve.engine.model import weights


class Mixed(torch.nn.Module):
    """Weights of several dtypes, a tied pair, a buffer, an empty tensor, a constant."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Linear(16, 16)
        self.b.weight = self.a.weight  # tied: one record, two names
        self.h16 = torch.nn.Parameter(torch.randn(16, dtype=torch.float16))
        self.register_buffer("steps", torch.arange(16, dtype=torch.int64))
        self.register_buffer("mask", torch.arange(16) % 3 == 0)
        self.register_buffer("nothing", torch.zeros(0))
        self.scale = torch.tensor([0.5, 2.0])  # a constant, not a parameter

    def forward(self, x):
        y = self.b(self.a(x)) * self.h16.float() + self.steps * self.mask
        return y * self.scale[0] + self.nothing.sum()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("weights")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(Mixed().eval(), (torch.randn(2, 16),))
    path = folder / "model.pt2"
    torch.export.save(program, str(path))
    return path


def _tensors(program):
    return {**program.state_dict, **program.constants}


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """The records read through os.preadv (read_into), by name."""
    names = []
    real = weights.read_into
    monkeypatch.setattr(weights, "read_into", lambda *a: names.append(a[3]) or real(*a))
    return names


def test_the_same_weights_and_answers_as_torchs_own_reader(saved, reads):
    theirs = torch.export.load(str(saved))
    with weights.gil_free_reads():
        ours = torch.export.load(str(saved))
    assert reads, "no record went through os.preadv"
    assert _tensors(ours).keys() == _tensors(theirs).keys()
    for name, tensor in _tensors(theirs).items():
        mine = _tensors(ours)[name]
        assert mine.dtype == tensor.dtype and mine.shape == tensor.shape and torch.equal(mine, tensor), name
    # Tied weights stay one tensor, as torch's reader keeps them.
    assert ours.state_dict["a.weight"].data_ptr() == ours.state_dict["b.weight"].data_ptr()
    x = torch.randn(2, 16)
    assert torch.equal(ours.module()(x), theirs.module()(x))


def test_the_swap_is_undone_and_nests():
    from torch.export.pt2_archive import _package

    own = _package.PT2ArchiveReader
    with weights.gil_free_reads():
        swapped = _package.PT2ArchiveReader
        assert swapped is not own
        with weights.gil_free_reads():
            assert _package.PT2ArchiveReader is swapped
        assert _package.PT2ArchiveReader is swapped
    assert _package.PT2ArchiveReader is own


def test_pieces_that_split_elements_join_up(saved, monkeypatch):
    monkeypatch.setattr(weights, "PIECE", 1000)  # not a multiple of any element
    with weights.gil_free_reads():
        ours = torch.export.load(str(saved))
    theirs = torch.export.load(str(saved))
    assert all(torch.equal(t, _tensors(ours)[k]) for k, t in _tensors(theirs).items())


def test_a_compressed_record_goes_through_torchs_reader(saved, tmp_path, monkeypatch):
    """An archive re-zipped with deflate (by hand, not torch.export.save) is not read
    raw: its bytes are not the tensor's."""
    deflated = tmp_path / "model.pt2"
    with zipfile.ZipFile(saved) as src, zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    monkeypatch.setattr(weights, "read_into", lambda *a: pytest.fail("a deflated record was read raw"))
    with weights.gil_free_reads():
        ours = torch.export.load(str(deflated))
    theirs = torch.export.load(str(saved))
    assert all(torch.equal(t, _tensors(ours)[k]) for k, t in _tensors(theirs).items())


def test_a_truncated_archive_fails_to_load(saved, tmp_path):
    cut = tmp_path / "model.pt2"
    data = saved.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    with weights.gil_free_reads(), pytest.raises(Exception):  # noqa: B017 - torch's own error for a cut archive
        torch.export.load(str(cut))


# Serial: it times threads. A 32 MB read from the page cache takes a few ms, and with
# the other core busy with the parallel run's servers the counting thread may get no
# slice of it, GIL or not (it failed so twice in full runs, never alone).
@pytest.mark.serial
def test_another_thread_runs_while_one_weight_is_read(tmp_path, monkeypatch):
    """The point of it: a weight's read lets the event loop's thread run (torch's own
    reader holds the GIL through the whole record). One 32 MB weight read in one piece,
    while another thread counts. The switch interval is raised to 100 ms, longer than
    that read takes, so the counter moves inside the read only if the read lets go of
    the GIL (a copy that held it would see the count still)."""
    big = tmp_path / "model.pt2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.export.save(torch.export.export(torch.nn.Linear(2048, 4096, bias=False), (torch.zeros(1, 2048),)), str(big))
    monkeypatch.setattr(weights, "PIECE", 64 << 20)
    during = []
    real = weights.read_into

    def read_into(fd, view, offset, what):
        count, stop = [0], threading.Event()

        def spin():
            while not stop.is_set():
                count[0] += 1

        spinner = threading.Thread(target=spin)
        spinner.start()
        try:
            before = count[0]
            real(fd, view, offset, what)
            during.append((len(view), count[0] - before))
        finally:
            stop.set()
            spinner.join()

    monkeypatch.setattr(weights, "read_into", read_into)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.1)
    try:
        with weights.gil_free_reads():
            torch.export.load(str(big))
    finally:
        sys.setswitchinterval(interval)
    size, moved = max(during)
    assert size == 2048 * 4096 * 4 and moved > 0


def test_artifacts_loads_exported_programs_this_way(saved, reads):
    program = artifacts.load_exported(str(saved))
    assert reads and "a.weight" in program.state_dict

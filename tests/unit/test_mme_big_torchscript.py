"""A multi-model load of a big TorchScript model says what its load costs every worker."""

import logging

from smserve.engine.multimodel import admission


def test_a_big_torchscript_model_is_warned_of_and_an_export_one_is_not(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(admission, "BIG_TORCHSCRIPT_BYTES", 1000)
    script = tmp_path / "script"
    script.mkdir()
    (script / "model.pt").write_bytes(b"x" * 2000)
    small = tmp_path / "small"
    small.mkdir()
    (small / "model.pt").write_bytes(b"x" * 10)
    both = tmp_path / "both"
    both.mkdir()
    (both / "model.pt").write_bytes(b"x" * 2000)
    (both / "model.pt2").write_bytes(b"x" * 2000)  # the export program is the one loaded
    with caplog.at_level(logging.WARNING, logger=admission.__name__):
        for name, folder in (("big", script), ("small", small), ("both", both)):
            admission.warn_of_a_big_torchscript(name, str(folder))
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "'big'" in warned[0] and "torch.export" in warned[0], warned

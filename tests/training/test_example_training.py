"""The example model trains to a real classifier, deterministically, packaged for SageMaker
(a training run: seconds; kept out of the unit suite).

The accuracy is that of the model `make model` trained (build/model, the one the other
tests serve), recomputed from its artifact. Determinism and packaging do not depend on
how long training runs, so they are proven on runs of one or two epochs, not by training
the full 60 again."""

import json
import tarfile

import torch


def test_held_out_accuracy_is_at_least_0_95(example_model_dir, digits):
    metrics = json.loads((example_model_dir / "metrics.json").read_text())
    assert metrics["held_out_accuracy"] >= 0.95
    # Recomputed from the exported artifact, not only read from what training wrote.
    x, y = digits
    model = torch.export.load(str(example_model_dir / "model.pt2")).module()
    predicted = model(torch.from_numpy(x)).argmax(dim=1).numpy()
    assert (predicted == y).mean() == metrics["held_out_accuracy"]


def test_training_is_deterministic_for_a_seed():
    """Bit-identical weights for a seed (the initialisation, the batch order and Adam's
    state over an epoch boundary), other weights for another seed. On 256 of the
    training digits (four batches an epoch): determinism does not depend on how many."""
    from model.train import load_split, train

    x, _, y, _ = load_split(0)
    x, y = x[:256], y[:256]
    first = train(x, y, seed=0, epochs=2).state_dict()
    again = train(x, y, seed=0, epochs=2).state_dict()
    other = train(x, y, seed=1, epochs=2).state_dict()
    assert first.keys() == again.keys() == other.keys()
    for key, value in first.items():
        assert torch.equal(value, again[key]), key
    assert not all(torch.equal(value, other[key]) for key, value in first.items())


def test_training_writes_the_model_folder_and_packages_model_tar_gz(tmp_path, capsys):
    from model.train import main, metadata

    main(["--out", str(tmp_path), "--epochs", "1"])
    assert "held-out accuracy" in capsys.readouterr().out
    model_dir = tmp_path / "model"
    assert json.loads((model_dir / "metadata.json").read_text()) == metadata()
    assert json.loads((model_dir / "metrics.json").read_text())["seed"] == 0
    with tarfile.open(tmp_path / "model.tar.gz") as tar:
        # Files at the archive's root: SageMaker unpacks it straight into /opt/ml/model.
        assert sorted(tar.getnames()) == ["metadata.json", "metrics.json", "model.pt2"]
        for name in tar.getnames():
            assert tar.extractfile(name).read() == (model_dir / name).read_bytes(), name

"""The README's batch-transform example runs as shown (`make batch-example`)."""

from __future__ import annotations

import numpy as np

from local_test import batch_example
from tests.helpers.server import ROOT


def test_batch_example_writes_its_input_and_one_answer_line_per_record(tmp_path, example_model_dir, capsys):
    assert batch_example.main(["--model-dir", str(example_model_dir), "--work", str(tmp_path)]) == 0
    records = np.loadtxt(tmp_path / "in" / "digits.csv", delimiter=",")
    answers = np.loadtxt(tmp_path / "out" / "digits.csv.out", delimiter=",")
    assert records.shape == (450, 64) and answers.shape == (450, 10)
    out = capsys.readouterr().out
    assert "records: 450  requests: 1" in out and "failed mini-batches: 0 (0 records)" in out
    assert float(out.rsplit("accuracy against the labels: ", 1)[1]) > 0.9


def test_readme_documents_the_command_and_the_folder_it_makes():
    readme = (ROOT / "README.md").read_text() + "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    assert "make batch-example" in readme
    assert "build/batch-example/in" in readme
    assert " data/ out/" not in readme, "the old example pointed at a data/ folder that does not exist"

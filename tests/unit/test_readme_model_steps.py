"""README "Your model in three steps": step 1's snippet runs as written, in an empty
folder, and steps 1-2 give a model directory the server reads a batch of records for,
whether the model was exported (model.pt2) or saved as TorchScript (model.pt, the
snippet's commented alternative)."""

from __future__ import annotations

import re

import pytest
import torch

from tests.helpers.server import ROOT
from model import init
from smserve.core.metadata import ModelMetadata
from smserve.protocols.simple import decode_inputs


class MyModel(torch.nn.Module):
    """The user's own model in the snippet: a stand-in taking 64 features."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(64, 3)

    def forward(self, x):
        return self.linear(x).softmax(-1)


def step_one() -> str:
    section = (ROOT / "README.md").read_text().split("## Your model in three steps")[1].split("\n## ")[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    return "\n".join(line[3:] if line.startswith("   ") else line for line in code.splitlines())


@pytest.mark.parametrize("artifact", ["model.pt2", "model.pt"])
def test_step_one_then_two_make_a_model_directory_that_takes_a_batch_of_records(tmp_path, monkeypatch, artifact):
    monkeypatch.chdir(tmp_path)  # a fresh folder, as a user's own: my-model does not exist yet
    code = step_one()
    if artifact == "model.pt":
        # The commented alternative instead of the export's save.
        alternative = re.search(r"^# or TorchScript: (.*)$", code, re.M).group(1)
        code = re.sub(r"^torch\.export\.save\(.*$", alternative, code, flags=re.M)
    exec(compile(code, "README step 1", "exec"), {"MyModel": MyModel})
    assert (tmp_path / "my-model" / artifact).exists()

    assert init.main(["my-model"]) == 0  # step 2: make new-model DIR=my-model
    metadata = ModelMetadata.load(str(tmp_path / "my-model"))
    rows = b"".join(b",".join(b"1" for _ in range(64)) + b"\n" for _ in range(3))
    (array,) = decode_inputs(rows, "text/csv", metadata).values()
    assert array.shape == (3, 64)

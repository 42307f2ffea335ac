"""python -m model.init DIR: metadata.json and a hooks skeleton from an exported model."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from tests.helpers.server import ROOT
from model import init
from smserve.engine.hooks.script import load_hooks
from smserve.core.metadata import ModelMetadata
from smserve.engine.model.derived import from_export


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 3)

    def forward(self, features, mask):
        return self.linear(features).softmax(-1), (mask > 0).sum(-1)


def export_two_heads(directory, dynamic_batch: bool = True):
    directory.mkdir(parents=True, exist_ok=True)
    example = (torch.zeros(4, 8), torch.zeros(4, 5, dtype=torch.int64))
    shapes = None
    if dynamic_batch:
        batch = torch.export.Dim("batch", min=1, max=1024)
        shapes = {"features": {0: batch}, "mask": {0: batch}}
    program = torch.export.export(TwoHeads().eval(), example, dynamic_shapes=shapes)
    torch.export.save(program, str(directory / "model.pt2"))
    return program


def test_exported_model_gets_the_metadata_the_server_would_derive(tmp_path):
    program = export_two_heads(tmp_path / "m")
    assert init.main([str(tmp_path / "m"), "--name", "two-heads"]) == 0

    document = json.loads((tmp_path / "m" / "metadata.json").read_text())
    assert document["_comment"], "the fields are explained"
    written = ModelMetadata.load(str(tmp_path / "m"))
    derived = from_export(program)
    assert written.name == "two-heads"
    assert written.max_batch_size == derived.max_batch_size == 64
    assert written.inputs == derived.inputs
    assert [(s.name, s.datatype, s.shape) for s in written.inputs] == [("features", "FP32", (8,)), ("mask", "INT64", (5,))]
    assert [(s.name, s.datatype, s.shape) for s in written.outputs] == [("output__0", "FP32", (3,)), ("output__1", "INT64", ())]


def test_without_a_dynamic_batch_max_batch_size_is_0_and_the_comment_says_why(tmp_path):
    export_two_heads(tmp_path / "m", dynamic_batch=False)
    init.main([str(tmp_path / "m")])
    document = json.loads((tmp_path / "m" / "metadata.json").read_text())
    assert document["max_batch_size"] == 0
    assert document["inputs"][0]["shape"] == [4, 8]
    assert any("derived: 0" in line for line in document["_comment"])


def test_torchscript_model_gets_argument_names_and_unknown_shapes(tmp_path):
    (tmp_path / "m").mkdir()
    torch.jit.save(torch.jit.script(TwoHeads()), str(tmp_path / "m" / "model.pt"))
    init.main([str(tmp_path / "m")])
    written = ModelMetadata.load(str(tmp_path / "m"))
    assert [s.name for s in written.inputs] == ["features", "mask"]
    # Its tuple of two is two outputs, from forward's return type: no run needed.
    assert [s.name for s in written.outputs] == ["output__0", "output__1"]
    # TorchScript keeps no shapes: null ("not known"), not [-1] (which is a 1-D tensor).
    assert all(s.shape is None for s in (*written.inputs, *written.outputs))
    assert written.max_batch_size == 0
    document = json.loads((tmp_path / "m" / "metadata.json").read_text())
    assert [entry["shape"] for entry in document["inputs"]] == [None, None]
    assert any("unknown" in line for line in document["_comment"])


@pytest.mark.parametrize("save", ["script", "trace"])
def test_every_output_of_a_torchscript_tuple_is_listed_as_the_server_derives_it(tmp_path, save):
    """A traced module keeps its tuple return type too; the server derives the same."""
    from smserve.engine.worker.loaded_model import load

    (tmp_path / "m").mkdir()
    example = (torch.zeros(2, 8), torch.zeros(2, 5, dtype=torch.int64))
    module = torch.jit.script(TwoHeads()) if save == "script" else torch.jit.trace(TwoHeads().eval(), example)
    torch.jit.save(module, str(tmp_path / "m" / "model.pt"))
    served = load(str(tmp_path / "m"), torch.device("cpu")).metadata
    init.main([str(tmp_path / "m")])
    written = ModelMetadata.load(str(tmp_path / "m"))
    assert [s.name for s in written.outputs] == [s.name for s in served.outputs] == ["output__0", "output__1"]
    comment = " ".join(json.loads((tmp_path / "m" / "metadata.json").read_text())["_comment"])
    assert "Tuple[Tensor, Tensor]: 2 outputs" in comment


class ListOut(torch.nn.Module):
    def forward(self, x) -> list[torch.Tensor]:
        return [x, x * 2, x * 3]


def test_a_torchscript_list_says_in_the_file_that_more_outputs_may_exist(tmp_path):
    (tmp_path / "m").mkdir()
    torch.jit.save(torch.jit.script(ListOut()), str(tmp_path / "m" / "model.pt"))
    init.main([str(tmp_path / "m")])
    comment = " ".join(json.loads((tmp_path / "m" / "metadata.json").read_text())["_comment"])
    assert "List[Tensor]" in comment and "known only when it runs" in comment and "list them all here" in comment


def _init_in_a_process(model_dir):
    return subprocess.run([sys.executable, "-m", "model.init", str(model_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("artifact", ["model.pt", "model.pt2"])
def test_a_pickled_module_is_named_so_with_the_saves_that_work(tmp_path, artifact):
    (tmp_path / "m").mkdir()
    torch.save(TwoHeads(), str(tmp_path / "m" / artifact))
    result = _init_in_a_process(tmp_path / "m")
    assert result.returncode != 0
    message = result.stderr
    assert re.search(r"model\.pt2? is a pickled module \([\w.]*TwoHeads\), saved with torch\.save", message)
    assert "torch.export.save(" in message and "torch.jit.save(" in message
    # Not torch's "PytorchStreamReader failed locating file constants.pkl ... corrupted".
    assert "PytorchStreamReader" not in message and "Traceback" not in message and "corrupted" not in message
    assert len(message.strip().splitlines()) == 1
    assert not (tmp_path / "m" / "metadata.json").exists()


def test_a_state_dict_is_named_so_with_where_to_load_it(tmp_path):
    (tmp_path / "m").mkdir()
    torch.save(TwoHeads().state_dict(), str(tmp_path / "m" / "model.pt"))
    result = _init_in_a_process(tmp_path / "m")
    assert result.returncode != 0
    assert "is a state_dict (weights only, no code)" in result.stderr
    assert "model_fn(model_dir)" in result.stderr and "weights_only=True" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_export_program_named_model_pt_is_told_its_name(tmp_path):
    export_two_heads(tmp_path / "m")
    (tmp_path / "m" / "model.pt2").rename(tmp_path / "m" / "model.pt")
    result = _init_in_a_process(tmp_path / "m")
    assert result.returncode != 0
    assert "is a torch.export program (torch.export.save): name it model.pt2, not model.pt" in result.stderr


def test_the_server_refuses_a_pickled_module_with_the_same_words(tmp_path):
    from smserve.engine.worker.loaded_model import ModelLoadError, load

    (tmp_path / "m").mkdir()
    torch.save(TwoHeads(), str(tmp_path / "m" / "model.pt"))
    with pytest.raises(ModelLoadError, match=r"is a pickled module .* torch\.export\.save"):
        load(str(tmp_path / "m"), torch.device("cpu"))


def test_the_metadata_written_for_torchscript_serves_a_batch_of_records(tmp_path):
    from smserve.protocols.simple import decode_inputs

    (tmp_path / "m").mkdir()
    torch.jit.save(torch.jit.script(torch.nn.Linear(4, 2)), str(tmp_path / "m" / "model.pt"))
    init.main([str(tmp_path / "m")])
    inputs = decode_inputs(b"1,2,3,4\n5,6,7,8\n9,10,11,12\n", "text/csv", ModelMetadata.load(str(tmp_path / "m")))
    assert inputs["input"].shape == (3, 4)


def test_skeleton_defines_no_hook_until_one_is_uncommented(tmp_path):
    export_two_heads(tmp_path / "m")
    init.main([str(tmp_path / "m")])
    script = (tmp_path / "m" / "code" / "inference.py").read_text()
    for hook in ("model_fn(model_dir)", "input_fn(body, content_type, context)", "predict_fn(data, model, context)",
                 "output_fn(prediction, accept, context)"):
        assert f"# def {hook}:" in script
    assert "context.response_custom_attributes" in script
    hooks = load_hooks(str(tmp_path / "m"))
    assert (hooks.model_fn, hooks.input_fn, hooks.predict_fn, hooks.output_fn) == (None, None, None, None)


def test_an_uncommented_hook_takes_the_requests_context(tmp_path):
    export_two_heads(tmp_path / "m")
    init.main([str(tmp_path / "m")])
    path = tmp_path / "m" / "code" / "inference.py"
    head, tail = path.read_text().split("# def output_fn", 1)
    # The last hook of the skeleton, uncommented as a user would.
    path.write_text(head + "\n".join(line[2:] for line in ("# def output_fn" + tail).splitlines()) + "\n")
    hooks = load_hooks(str(tmp_path / "m"))
    assert hooks.output_fn is not None and hooks.output_context and not hooks.input_context


def test_existing_files_are_kept_unless_forced(tmp_path):
    export_two_heads(tmp_path / "m")
    (tmp_path / "m" / "metadata.json").write_text('{"name": "mine"}')
    init.main([str(tmp_path / "m")])
    assert json.loads((tmp_path / "m" / "metadata.json").read_text()) == {"name": "mine"}
    init.main([str(tmp_path / "m"), "--force"])
    assert json.loads((tmp_path / "m" / "metadata.json").read_text())["name"] == "model"


def test_a_folder_without_a_model_is_refused_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "model.init", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "holds neither model.pt2" in result.stderr
    assert not (tmp_path / "metadata.json").exists()


@pytest.mark.parametrize("argv", [["--help"]])
def test_cli_help_names_the_make_target(argv, capsys):
    with pytest.raises(SystemExit):
        init.main(argv)
    assert "DIR" in capsys.readouterr().out

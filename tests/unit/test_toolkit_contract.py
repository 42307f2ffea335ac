"""The SageMaker PyTorch toolkit's contract without a server (issue 38): which script,
which hooks take a context (by arity, as sagemaker-inference's transformer calls them),
transform_fn's exclusivity, the default model file rules, and its settings."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from smserve.engine.model import artifacts
from smserve.engine.worker import loaded_model
from smserve import toolkit
from smserve.engine.model.artifacts import ModelLoadError
from smserve.engine.hooks.script import Hooks, load_hooks
from smserve.errors import BadRequest
from smserve.settings import Settings, SettingsError, toolkit_notes


class Double(torch.nn.Module):
    def forward(self, x):
        return x * 2


def write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ---------------------------------------------------------------- the script


def test_sagemaker_program_names_the_script_and_the_module(tmp_path):
    write(tmp_path / "code" / "mnist.py", "def model_fn(model_dir):\n    return 'mnist'\n")
    write(tmp_path / "code" / "inference.py", "def model_fn(model_dir):\n    return 'inference'\n")
    hooks = load_hooks(str(tmp_path), toolkit.Script("mnist.py"))
    assert hooks.model_fn(str(tmp_path)) == "mnist" and hooks.script == "code/mnist.py"
    assert load_hooks(str(tmp_path)).model_fn(str(tmp_path)) == "inference"  # the default


def test_a_local_submit_directory_holds_the_script_for_a_single_model_only(tmp_path):
    model, submit = tmp_path / "model", tmp_path / "submit"
    model.mkdir()
    write(submit / "entry.py", "def model_fn(model_dir):\n    return 'submitted'\n")
    script = toolkit.Script("entry.py", str(submit))
    assert load_hooks(str(model), script).model_fn(str(model)) == "submitted"
    assert load_hooks(str(model), script, single=False).model_fn is None


def test_script_of_reads_the_settings_and_ignores_a_remote_submit_directory(tmp_path):
    settings = Settings.from_env({"SAGEMAKER_PROGRAM": "mnist", "SAGEMAKER_SUBMIT_DIRECTORY": "s3://b/k/source.tar.gz",
                                  "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT": "text/csv"})
    assert toolkit.script_of(settings) == toolkit.Script("mnist.py", None, "text/csv")
    local = Settings.from_env({"SAGEMAKER_SUBMIT_DIRECTORY": str(tmp_path)})
    assert toolkit.script_of(local) == toolkit.Script("inference.py", str(tmp_path), "application/json")


@pytest.mark.parametrize("value", ["../x.py", "code/x.py", ".py"])
def test_a_program_outside_the_code_folder_stops_serve(value):
    with pytest.raises(SettingsError, match="SAGEMAKER_PROGRAM"):
        Settings.from_env({"SAGEMAKER_PROGRAM": value})


def test_a_named_script_that_is_missing_stops_a_single_model_and_only_warns_for_one_of_many(tmp_path):
    write(tmp_path / "code" / "inference.py", "")
    script = toolkit.Script("predictor.py")
    with pytest.raises(ModelLoadError, match=r"SAGEMAKER_PROGRAM=predictor.py .* holds inference.py"):
        load_hooks(str(tmp_path), script)
    assert load_hooks(str(tmp_path), script, single=False).model_fn is None
    assert toolkit.Script().missing(str(tmp_path / "nowhere")) is None  # no script named: a model without hooks


# ---------------------------------------------------------------- the context by arity


def test_a_hook_takes_the_context_by_arity_whatever_its_name():
    def input_fn(body, content_type, ctx):
        return ctx

    def predict_fn(data, model):
        return data

    def output_fn(prediction, accept, extra=None):  # one more: the toolkit passes the context there
        return extra

    hooks = Hooks(input_fn=input_fn, predict_fn=predict_fn, output_fn=output_fn)
    assert (hooks.input_context, hooks.predict_context, hooks.output_context) == (True, False, True)
    assert toolkit.takes_context(lambda model_dir, context: 0, "model_fn")
    assert not toolkit.takes_context(lambda model_dir: 0, "model_fn")
    assert toolkit.takes_context(lambda model_dir, model, c: 0, "model_warmup_fn")
    assert not toolkit.takes_context(lambda model, *args: 0, "transform_fn")


def test_load_hooks_get_a_context_with_system_properties(tmp_path):
    write(tmp_path / "code" / "inference.py", """
SEEN = []
def pre_model_fn(model_dir, context):
    SEEN.append(("pre", context.system_properties))
def model_fn(model_dir, context):
    SEEN.append(("model", context.system_properties))
    return __import__("torch").nn.Identity()
def model_warmup_fn(model_dir, model, context):
    SEEN.append(("warm", type(model).__name__, context.device.type))
""")
    loaded = loaded_model.load(str(tmp_path), torch.device("cpu"))
    import inference

    properties = {"model_dir": str(tmp_path), "gpu_id": None}
    assert inference.SEEN == [("pre", properties), ("model", properties), ("warm", "Identity", "cpu")]
    assert loaded.metadata.platform == "pytorch_custom"



@pytest.mark.parametrize("predict_fn", [False, True])
def test_without_predict_fn_model_fns_model_is_put_in_eval_mode_as_the_toolkits_default_runs_it(tmp_path, predict_fn):
    write(tmp_path / "code" / "inference.py", """
import torch
TRAINING = []
def model_fn(model_dir):
    return torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
def model_warmup_fn(model_dir, model):
    TRAINING.append(model.training)  # as model_fn made it: the toolkit sets the mode per request
""" + ("def predict_fn(data, model):\n    return model(data)\n" if predict_fn else ""))
    loaded = loaded_model.load(str(tmp_path), torch.device("cpu"))
    import inference

    assert inference.TRAINING == [True]
    assert loaded.model.training is predict_fn  # with a predict_fn, the mode is the script's


def test_an_exported_module_from_model_fn_loads_without_a_mode_to_set(tmp_path):
    torch.export.save(torch.export.export(Double(), (torch.zeros(1, 2),)), str(tmp_path / "double.pt2"))
    write(tmp_path / "code" / "inference.py", """
import os, torch
def model_fn(model_dir):
    return torch.export.load(os.path.join(model_dir, "double.pt2")).module()
""")
    loaded = loaded_model.load(str(tmp_path), torch.device("cpu"))
    assert torch.equal(loaded.predict_data(torch.ones(1, 2)), torch.full((1, 2), 2.0))


# ---------------------------------------------------------------- transform_fn


def test_transform_fn_with_any_of_the_other_three_is_refused_as_the_toolkit_does(tmp_path):
    write(tmp_path / "code" / "inference.py", """
def transform_fn(model, data, content_type, accept):
    return data
def output_fn(prediction, accept):
    return prediction
""")
    with pytest.raises(ModelLoadError, match="transform_fn and output_fn"):
        load_hooks(str(tmp_path))


def test_transform_fn_becomes_the_three_steps_and_runs_alone():
    calls = []

    def transform_fn(model, data, content_type, accept):
        calls.append((model, data, content_type, accept))
        return "answer"

    hooks = Hooks(transform_fn=transform_fn, default_accept="text/csv")
    assert hooks.runs_alone and hooks.handles_bytes

    class Context:
        headers = {"Accept": "*/*"}

    # The body as the server hands it (a str for JSON and CSV: text_body), carried over.
    request = hooks.input_fn("[1]", "application/json", Context())
    assert hooks.predict_fn(request, "model", None) == ("answer", "text/csv")
    hooks.predict_fn(hooks.input_fn(b"\x89PNG", "image/png", Context()), "model", None)
    assert calls == [("model", "[1]", "application/json", "text/csv"), ("model", b"\x89PNG", "image/png", "text/csv")]
    assert hooks.output_fn(("answer", "text/csv"), "application/json") == ("answer", "text/csv")
    with pytest.raises(BadRequest, match="transform_fn.*not as KServe v2"):  # decoded tensors have no body
        hooks.predict_fn({"input": torch.zeros(1)}, "model", None)


@pytest.mark.parametrize("content_type", ["application/json", "text/csv", "application/json; charset=utf-8",
                                          "Application/JSON", "text/plain", "application/x-npy", ""])
def test_the_body_is_a_str_exactly_where_the_toolkits_transformer_decodes_it(content_type):
    from sagemaker_inference import content_types

    body = toolkit.text_body(b"[1]", content_type, "input_fn")
    assert body == ("[1]" if content_type in content_types.UTF8_TYPES else b"[1]")
    if content_type in content_types.UTF8_TYPES:
        with pytest.raises(BadRequest, match="not UTF-8.*input_fn"):
            toolkit.text_body(b"\xff", content_type, "input_fn")


@pytest.mark.parametrize("value", [{"a": [1, 2.5]}, [1, "x"], 3.5, 7, True, None, "h\u00e9", b"\x00", bytearray(b"ab"),
                                   torch.arange(3), ("a", "text/csv"), ({"a": 1}, "application/x-custom")])
def test_an_answer_is_written_as_torchserve_writes_it(value):
    from tests.helpers.toolkit_reference import torchserve_body

    body, media = toolkit.written(value, "application/json")
    answer, expected_media = value if isinstance(value, tuple) else (value, "application/json")
    assert media == expected_media
    if isinstance(answer, torch.Tensor):  # torch.save's zip names its folder after nothing fixed: read it back
        assert torch.equal(torch.load(io.BytesIO(body), weights_only=True), answer)
    else:
        assert (200, body) == torchserve_body(answer)


def test_an_answer_neither_json_nor_a_buffer_can_write_says_what_to_return():
    assert toolkit.written(np.arange(3, dtype=np.int32), "application/x-raw") == (
        np.arange(3, dtype=np.int32).tobytes(), "application/x-raw")
    for value in ({1, 2}, ("only",), {"a": np.float32(1)}, ("body", 415)):
        with pytest.raises(ValueError, match="it returned a"):
            toolkit.written(value, "application/json")


# ---------------------------------------------------------------- default loading


def test_a_lone_pt_or_pth_torchscript_file_loads_after_ours(tmp_path):
    torch.jit.save(torch.jit.script(Double()), str(tmp_path / "traced_resnet18.pth"))
    assert artifacts.torchscript_file(str(tmp_path)) == str(tmp_path / "traced_resnet18.pth")
    loaded = loaded_model.load(str(tmp_path), torch.device("cpu"))
    assert loaded.metadata.platform == "pytorch_torchscript"
    torch.jit.save(torch.jit.script(Double()), str(tmp_path / "model.pt"))
    assert artifacts.torchscript_file(str(tmp_path)) == str(tmp_path / "model.pt")  # model.pt first


def test_two_candidate_files_and_no_model_pt_are_refused_naming_both(tmp_path):
    for name in ("a.pt", "b.pth"):
        torch.jit.save(torch.jit.script(Double()), str(tmp_path / name))
    with pytest.raises(ModelLoadError, match=r"a\.pt, b\.pth.*model_fn"):
        loaded_model.load(str(tmp_path), torch.device("cpu"))


def test_a_pickled_pth_is_never_unpickled_and_the_error_names_model_fn(tmp_path):
    torch.save(Double(), str(tmp_path / "model.pth"))
    with pytest.raises(ModelLoadError, match=r"pickled module.*never unpickles.*model_fn"):
        loaded_model.load(str(tmp_path), torch.device("cpu"))
    (tmp_path / "model.pth").unlink()
    torch.save(torch.nn.Linear(2, 2).state_dict(), str(tmp_path / "weights.pth"))
    with pytest.raises(ModelLoadError, match=r"state_dict.*model_fn"):
        loaded_model.load(str(tmp_path), torch.device("cpu"))


# ---------------------------------------------------------------- settings


def test_the_toolkits_batch_settings_are_ours_unless_ours_are_set():
    theirs = {"SAGEMAKER_TS_BATCH_SIZE": "8", "SAGEMAKER_TS_MAX_BATCH_DELAY": "50",
              "SAGEMAKER_TS_RESPONSE_TIMEOUT": "7"}
    settings = Settings.from_env(theirs)
    assert (settings.max_batch_size, settings.max_batch_delay_ms, settings.timeout) == (8, 50.0, 7)
    ours = Settings.from_env({**theirs, "SMSERVE_MAX_BATCH_SIZE": "16", "SMSERVE_MAX_BATCH_DELAY_MS": "5",
                              "SAGEMAKER_MODEL_SERVER_TIMEOUT": "30"})
    assert (ours.max_batch_size, ours.max_batch_delay_ms, ours.timeout) == (16, 5.0, 30)


def test_a_bad_toolkit_setting_stops_serve_naming_it():
    with pytest.raises(SettingsError, match="SAGEMAKER_TS_BATCH_SIZE"):
        Settings.from_env({"SAGEMAKER_TS_BATCH_SIZE": "many"})


def test_every_toolkit_setting_gets_one_line():
    notes = toolkit_notes({"SAGEMAKER_TS_BATCH_SIZE": "8", "SMSERVE_MAX_BATCH_SIZE": "16",
                           "SAGEMAKER_TS_MAX_BATCH_DELAY": "50", "SAGEMAKER_TS_MAX_WORKERS": "4",
                           "SAGEMAKER_TS_SOMETHING_NEW": "x", "SAGEMAKER_TS_EMPTY": " ", "OTHER": "1"})
    assert notes == [
        "SAGEMAKER_TS_BATCH_SIZE=8 is overridden by SMSERVE_MAX_BATCH_SIZE=16 (both are set: SMSERVE_MAX_BATCH_SIZE "
        "wins)",
        "SAGEMAKER_TS_MAX_BATCH_DELAY=50 sets SMSERVE_MAX_BATCH_DELAY_MS's setting (max_batch_delay_ms)",
        "SAGEMAKER_TS_MAX_WORKERS is not used by this server; instead: SAGEMAKER_MODEL_SERVER_WORKERS (a fixed "
        "worker count; default one per GPU)",
        "SAGEMAKER_TS_SOMETHING_NEW is not used by this server; instead: see docs/migrating.md for this server's "
        "settings",
    ]


# ---------------------------------------------------------------- the image example's ResNet


def test_the_image_example_takes_torchvisions_resnet_where_it_imports(monkeypatch):
    import sys
    import types

    from model.image import build
    from model.image.resnet import ResNet18

    monkeypatch.setitem(sys.modules, "torchvision", None)  # as here: it does not import
    model, source = build.resnet18(3)
    assert isinstance(model, ResNet18) and "resnet.py" in source
    fake = types.ModuleType("torchvision.models")
    fake.resnet18 = lambda num_classes: torch.nn.Linear(2, num_classes)
    monkeypatch.setitem(sys.modules, "torchvision", types.ModuleType("torchvision"))
    monkeypatch.setitem(sys.modules, "torchvision.models", fake)
    model, source = build.resnet18(3)
    assert source == "torchvision" and model.out_features == 3 and not model.training


def test_a_script_named_as_a_loaded_module_does_not_replace_it(tmp_path):
    import json
    import sys

    write(tmp_path / "code" / "json.py", "def model_fn(model_dir):\n    return 'mine'\n")
    hooks = load_hooks(str(tmp_path), toolkit.Script("json.py"))
    assert hooks.model_fn(str(tmp_path)) == "mine" and sys.modules["json"] is json

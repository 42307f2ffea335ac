"""The GPU input path on a CPU host: a batch is assembled in one staging buffer per
input (pinned on a GPU; ordinary memory here, the same logic), copied once, and split back."""

import threading

import gevent
import numpy as np
import pytest

from smserve.engine.batching.runner import Runner


class StagingRecorder:
    """A stage hook that concatenates, and says where and on what it ran."""

    def __init__(self):
        self.calls = []
        self.threads = set()

    def __call__(self, name, parts):
        self.threads.add(threading.get_ident())
        self.calls.append((name, [p.shape for p in parts]))
        return np.concatenate(parts)


def test_the_runner_assembles_a_batch_through_the_stage_hook_on_the_inference_thread():
    stage = StagingRecorder()
    seen = []

    def predict(inputs):
        seen.append({name: a.shape for name, a in inputs.items()})
        gevent.sleep(0)  # not a real yield (a real thread), but harmless
        return {"y": inputs["a"] + inputs["b"]}

    runner = Runner()
    runner.start(predict, max_batch_size=64, stage=stage)
    runner.call(lambda: None)  # the inference thread has run before the requests
    hold = runner.model_lock
    hold.acquire()  # the first request's pass waits, so the others queue and batch together
    try:
        jobs = [gevent.spawn(runner.infer, {"a": np.full((i + 1, 2), i, np.float32),
                                            "b": np.ones((i + 1, 2), np.float32)}) for i in range(4)]
        gevent.sleep(0.05)
    finally:
        hold.release()
    gevent.joinall(jobs)
    for i, job in enumerate(jobs):
        np.testing.assert_array_equal(job.value["y"], np.full((i + 1, 2), i + 1, np.float32))
    batched = [c for c in stage.calls if len(c[1]) > 1]
    assert batched, stage.calls
    assert {c[0] for c in batched} == {"a", "b"}
    assert threading.get_ident() not in stage.threads  # never on the event loop


# ---------------------------------------------------------------- the staging buffers

import logging  # noqa: E402

import torch  # noqa: E402

from smserve.engine.model import compiling  # noqa: E402
from smserve.engine.worker import loaded_model as model_module  # noqa: E402
from smserve.engine.hooks.script import Hooks  # noqa: E402
from smserve.core.metadata import ModelMetadata, TensorSpec  # noqa: E402
from smserve.engine.model.staging import MIN_BYTES, HostStaging  # noqa: E402


def address(array):
    return array.__array_interface__["data"][0]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8, np.bool_, np.float64])
def test_staging_concatenates_into_one_buffer_per_input(dtype):
    staging = HostStaging(pin=False)
    parts = [np.arange(i * 6, (i + 1) * 6).reshape(2, 3).astype(dtype) for i in range(3)]
    out = staging.stage("x", parts)
    np.testing.assert_array_equal(out, np.concatenate(parts))
    assert out.dtype == np.dtype(dtype) and out.shape == (6, 3)
    assert staging.holds("x", out) and not staging.holds("y", out) and staging.holds_any(out)
    assert not any(staging.holds("x", p) for p in parts)


def test_staging_reuses_its_buffer_and_grows_it_by_powers_of_two():
    staging = HostStaging(pin=False)
    first = staging.stage("x", [np.ones((4, 8), np.float32), np.zeros((4, 8), np.float32)])
    assert staging.capacity("x") == MIN_BYTES
    again = staging.stage("x", [np.full((3, 8), 2, np.float32)])
    assert address(again) == address(first)  # the same memory, pass after pass
    np.testing.assert_array_equal(again, np.full((3, 8), 2, np.float32))
    big = [np.full((1000, 64), i, np.float32) for i in range(3)]  # 768,000 bytes
    grown = staging.stage("x", big)
    assert staging.capacity("x") == 1 << 20
    np.testing.assert_array_equal(grown, np.concatenate(big))
    # Other inputs have buffers of their own; a smaller pass fits the grown one.
    other = staging.stage("mask", [np.ones((2, 2), np.int64)])
    assert not np.may_share_memory(other, grown)
    small = staging.stage("x", [np.full((2, 64), 7, np.float32)])
    assert address(small) == address(grown) and staging.capacity("x") == 1 << 20


def test_staging_keeps_shapes_and_takes_native_byte_order():
    staging = HostStaging(pin=False)
    scalar = staging.stage("s", [np.array(3.5, np.float32)])
    assert scalar.shape == () and scalar == 3.5
    empty = staging.stage("e", [np.zeros((0, 5), np.float32), np.zeros((0, 5), np.float32)])
    assert empty.shape == (0, 5)
    images = [np.random.default_rng(i).random((2, 3, 4, 4)).astype(np.float32) for i in range(2)]
    np.testing.assert_array_equal(staging.stage("img", images), np.concatenate(images))
    big_endian = np.arange(6, dtype=">f4").reshape(3, 2)
    native = staging.stage("be", [big_endian])
    assert native.dtype.isnative and torch.from_numpy(native).tolist() == big_endian.tolist()
    read_only = np.frombuffer(np.arange(4, dtype=np.float32).tobytes(), np.float32)
    assert not read_only.flags.writeable and staging.stage("ro", [read_only]).flags.writeable


def test_staging_leaves_bytes_and_oversized_inputs_alone():
    staging = HostStaging(pin=False, max_bytes=1000)
    assert staging.takes([np.zeros(250, np.float32)])
    assert not staging.takes([np.zeros(200, np.float32), np.zeros(51, np.float32)])
    assert not staging.takes([np.array([b"a", b"b"], dtype=object)])


# ---------------------------------------------------------------- a model fed from staging buffers


class Doubler(torch.nn.Module):
    """y = 2x + mask, and the input's identity (an output that is a view of its input)."""

    def forward(self, x, mask):
        return x * 2 + mask, x


def staged_model(**fields) -> model_module.LoadedModel:
    metadata = ModelMetadata(
        max_batch_size=64,
        inputs=(TensorSpec("x", "FP32", (3,)), TensorSpec("mask", "INT64", (3,))),
        outputs=(TensorSpec("y", "FP32", (3,)), TensorSpec("same", "FP32", (3,))),
    )
    fields.setdefault("staging", HostStaging(pin=False))
    return model_module.LoadedModel(model=Doubler().eval(), metadata=metadata, hooks=Hooks(),
                                    device=torch.device("cpu"), **fields)


def test_batched_requests_go_through_the_staging_buffer_and_split_back():
    loaded = staged_model()
    staged = []
    real_stage = loaded.stage

    def stage(name, parts):
        out = real_stage(name, parts)
        staged.append((name, loaded.staging.holds(name, out)))
        return out

    runner = Runner()
    runner.start(loaded.predict, max_batch_size=64, stage=stage)
    runner.call(lambda: None)
    requests = [{"x": np.full((i + 1, 3), i, np.float32), "mask": np.full((i + 1, 3), 10 * i, np.int64)}
                for i in range(6)]
    runner.model_lock.acquire()  # hold the first pass so the rest queue up and batch
    try:
        jobs = [gevent.spawn(runner.infer, r) for r in requests]
        gevent.sleep(0.05)
    finally:
        runner.model_lock.release()
    gevent.joinall(jobs)
    answers = [job.value for job in jobs]
    # Another pass through the same buffers must not change answers already given.
    runner.infer({"x": np.full((21, 3), -1, np.float32), "mask": np.zeros((21, 3), np.int64)})
    for request, answer in zip(requests, answers):
        np.testing.assert_array_equal(answer["y"], request["x"] * 2 + request["mask"])
        np.testing.assert_array_equal(answer["same"], request["x"])
        assert not loaded.staging.holds_any(answer["same"])
    assert ("x", True) in staged and ("mask", True) in staged


def test_a_lone_request_is_copied_into_the_buffer_once():
    loaded = staged_model()
    body = np.arange(6, dtype=np.float32).tobytes()
    x = np.frombuffer(body, np.float32).reshape(2, 3)  # read-only, as decoded from a body
    out = loaded.predict({"x": x, "mask": np.ones((2, 3), np.int64)})
    np.testing.assert_array_equal(out["y"], x * 2 + 1)
    assert loaded.staging.capacity("x") == MIN_BYTES and loaded.staging.capacity("mask") == MIN_BYTES


def test_on_the_cpu_nothing_is_staged(example_model_dir):
    assert model_module.load(str(example_model_dir), torch.device("cpu")).staging is None
    loaded = staged_model(staging=None)
    parts = [np.ones((1, 3), np.float32), np.zeros((2, 3), np.float32)]
    np.testing.assert_array_equal(loaded.stage("x", parts), np.concatenate(parts))
    assert loaded.stage("x", parts[:1]) is parts[0]


# ---------------------------------------------------------------- autocast


class Probe(torch.nn.Module):
    """A linear layer that records the autocast state its forward pass ran under."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(16, 4)
        self.seen = []

    def forward(self, x):
        self.seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return self.linear(x)


def probe_model(autocast=None, outputs=(TensorSpec("y", "FP32", (4,)),), **fields):
    metadata = ModelMetadata(max_batch_size=8, inputs=(TensorSpec("x", "FP32", (16,)),), outputs=outputs)
    return model_module.LoadedModel(model=Probe().eval(), metadata=metadata, hooks=fields.pop("hooks", Hooks()),
                                    device=torch.device("cpu"), autocast=autocast, **fields)


X = np.random.default_rng(1).standard_normal((5, 16)).astype(np.float32)


@pytest.mark.parametrize("setting, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_autocast_runs_the_forward_pass_in_half_precision_and_answers_fp32(setting, dtype):
    exact = probe_model().predict({"x": X})["y"]
    loaded = probe_model(model_module.AUTOCAST_DTYPES[setting])
    out = loaded.predict({"x": X})["y"]
    assert loaded.model.seen == [dtype]
    assert out.dtype == np.float32  # declared FP32: the half-precision result is widened
    np.testing.assert_allclose(out, exact, atol=0.05)
    assert not np.array_equal(out, exact)  # it did run in lower precision


def test_without_autocast_the_forward_pass_is_fp32():
    loaded = probe_model()
    loaded.predict({"x": X})
    assert loaded.model.seen == [None]


def test_autocast_covers_a_predict_fn():
    seen = []

    def predict_fn(data, model):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return model(data)

    loaded = probe_model(torch.bfloat16, hooks=Hooks(predict_fn=predict_fn))
    out = loaded.predict({"x": X})["y"]
    assert seen == [torch.bfloat16] and out.dtype == np.float32


def test_half_outputs_become_fp32_only_where_declared_or_made_by_autocast():
    half = torch.ones(2, 4, dtype=torch.float16)
    declared_fp16 = probe_model(outputs=(TensorSpec("y", "FP16", (4,)),))
    assert declared_fp16.outputs_to_numpy(half)["y"].dtype == np.float16
    declared_fp32 = probe_model(outputs=(TensorSpec("y", "FP32", (4,)),))
    assert declared_fp32.outputs_to_numpy({"y": half})["y"].dtype == np.float32
    undeclared = probe_model(outputs=())
    assert undeclared.outputs_to_numpy(half)["output__0"].dtype == np.float16  # the model's own choice
    undeclared_autocast = probe_model(torch.float16, outputs=())
    assert undeclared_autocast.outputs_to_numpy(half)["output__0"].dtype == np.float32
    assert undeclared_autocast.outputs_to_numpy(torch.ones(2, dtype=torch.int64))["output__0"].dtype == np.int64


# ---------------------------------------------------------------- torch.compile


@pytest.fixture
def dynamo_errors():
    """A compiled model sets torch._dynamo's suppress_errors: undo it after the test."""
    import torch._dynamo  # here, not at the top: every process that collects would pay its import

    with torch._dynamo.config.patch(suppress_errors=False):
        yield
    torch._dynamo.reset()


def compiled_probe(backend):
    loaded = probe_model()
    eager = loaded.model = torch.nn.Linear(16, 4).eval()  # no side effects: no guards on them
    loaded.model = compiling.compile_model(eager, "default", backend=backend)
    loaded.uncompiled, loaded.compiled = eager, "default"
    return loaded, eager


def test_a_compiled_model_is_warmed_at_batch_1_2_and_the_max(dynamo_errors):
    graphs = []

    def backend(graph, example_inputs):
        graphs.append([tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in example_inputs])
        return graph.forward

    loaded, eager = compiled_probe(backend)
    assert loaded.warm_up()
    assert loaded.compiled == "default" and loaded.model is not eager and loaded.uncompiled is None
    # Batch 1 gets its own graph; batch 2 one with a symbolic batch size, which batch 8
    # (the max) and every other size then reuse: serving compiles nothing more.
    assert len(graphs) == 2 and "SymInt" in graphs[1], graphs
    out = loaded.predict({"x": X})["y"]
    assert len(graphs) == 2
    np.testing.assert_allclose(out, X @ eager.weight.detach().numpy().T + eager.bias.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert torch._dynamo.config.suppress_errors  # a later recompile falls back, never a 500


def test_a_compiled_model_is_warmed_at_the_served_max_batch_not_only_the_metadatas():
    loaded = probe_model()  # metadata: max_batch_size 8
    loaded.compiled = "default"
    assert [b["x"].shape[0] for b in compiling.warm_up_inputs(loaded)] == [1, 2, 8]
    # SMSERVE_MAX_BATCH_SIZE (or SAGEMAKER_TS_BATCH_SIZE) is what passes are cut at: its peak memory is paid now
    assert [b["x"].shape[0] for b in compiling.warm_up_inputs(loaded, 32)] == [1, 2, 32]


def test_the_worker_warms_a_compiled_model_at_smserve_max_batch_size_not_the_metadatas(
        monkeypatch, example_model_dir, dynamo_errors):
    """metadata.json says 256; SMSERVE_MAX_BATCH_SIZE=32 is what the worker cuts passes
    at, so its compiled warm-up runs at 32 (and pays that size's peak memory)."""
    import dataclasses

    from smserve.engine.worker.server import ModelServer
    from smserve.settings import Settings

    settings = dataclasses.replace(Settings.from_env({"SMSERVE_MAX_BATCH_SIZE": "32", "SMSERVE_COMPILE": "default"}),
                                   model_dir=str(example_model_dir))
    sizes = []
    monkeypatch.setattr(compiling, "compile_model", lambda model, mode: model)  # compiled, as the warm-up sees it
    monkeypatch.setattr(compiling, "_run", lambda loaded, batches: sizes.extend(
        next(iter(b.values())).shape[0] for b in batches))
    server = ModelServer(settings, worker_index=0, workers=1)
    server.load()
    try:
        assert server.status == "ready", server.error
        assert server.model.metadata.max_batch_size == 256 and server.runner.max_batch_size == 32
        assert sizes == [1, 2, 32]
    finally:
        server.close()


def test_a_compile_failure_is_a_warning_and_the_model_serves_uncompiled(dynamo_errors, caplog):
    def broken_backend(graph, example_inputs):
        raise RuntimeError("no C compiler here\nline 2\nline 3\nline 4 of a long log")

    loaded, eager = compiled_probe(broken_backend)
    with caplog.at_level(logging.WARNING, logger="smserve.engine.model.compiling"):
        assert loaded.warm_up()
    assert loaded.compiled == "failed" and loaded.model is eager
    warning = next(r for r in caplog.records if r.name == "smserve.engine.model.compiling" and r.levelno == logging.WARNING)
    assert "SMSERVE_COMPILE=default failed, serving the model uncompiled" in warning.getMessage()
    assert "no C compiler here" in warning.getMessage() and "line 4" not in warning.getMessage()
    with torch.no_grad():
        np.testing.assert_allclose(loaded.predict({"x": X})["y"], eager(torch.from_numpy(X)).numpy(), rtol=1e-6)


def test_a_model_that_fails_uncompiled_too_is_a_load_error(dynamo_errors):
    loaded, eager = compiled_probe("eager")
    loaded.metadata = ModelMetadata(max_batch_size=8, inputs=(TensorSpec("x", "FP32", (15,)),))  # wrong width
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        loaded.warm_up()


def test_torchscript_and_non_modules_are_not_compiled(caplog):
    scripted = torch.jit.trace(torch.nn.Linear(2, 2), torch.zeros(1, 2))
    with caplog.at_level(logging.WARNING, logger="smserve.engine.model.compiling"):
        assert compiling.compile_model(scripted, "max-autotune") is None
        assert compiling.compile_model(object(), "default") is None
    messages = [r.getMessage() for r in caplog.records]
    assert any("TorchScript" in m for m in messages) and any("not a torch.nn.Module" in m for m in messages)


def test_compile_is_skipped_where_gevent_would_deadlock_its_subprocesses(monkeypatch, caplog):
    from gevent import monkey

    monkeypatch.setattr(monkey, "is_object_patched", lambda module, name: (module, name) == ("os", "close"))
    with caplog.at_level(logging.WARNING, logger="smserve.engine.model.compiling"):
        assert compiling.compile_model(torch.nn.Linear(2, 2), "default") is None
    assert "SMSERVE_COMPILE=default ignored, serving the model uncompiled" in caplog.text
    assert "os.close" in caplog.text


class FakeEvent:
    """torch.cuda.Event's part staging uses, logging the order of calls."""

    log: list = []

    def record(self, stream):
        self.log.append(("record", stream))

    def synchronize(self):
        self.log.append(("wait",))


def test_a_buffer_is_rewritten_only_after_the_gpu_has_read_it(monkeypatch):
    FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: f"stream of {device}")
    staging = HostStaging(pin=False)
    cuda = torch.device("cuda", 1)
    staging.stage("x", [np.ones((2, 2), np.float32)])
    staging.copied("x", cuda)  # the model queued a non-blocking copy out of it
    assert FakeEvent.log == [("record", "stream of cuda:1")]
    staging.stage("x", [np.zeros((2, 2), np.float32)])
    assert FakeEvent.log[-1] == ("wait",)  # waited before overwriting
    staging.copied("x", cuda)
    staging.stage("x", [np.zeros((100_000,), np.float32)])  # grows: the old buffer is waited on too
    assert FakeEvent.log[-1] == ("wait",) and staging.capacity("x") == 1 << 19
    staging.copied("x", torch.device("cpu"))  # nothing to wait for on the CPU
    assert FakeEvent.log[-1] == ("wait",)

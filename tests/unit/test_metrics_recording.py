"""The metrics in one process (no PROMETHEUS_MULTIPROC_DIR: the single-process registry):
what the runner counts per forward pass, the route label of a request no route took,
the GPU memory path with a stand-in torch, and the settings that steer logs and metrics."""

from __future__ import annotations

import gevent
import numpy as np
import pytest

from smserve import metrics
from smserve.engine.batching.passes import records_in
from smserve.engine.batching.runner import Runner
from smserve.http import access
from prometheus_client import CollectorRegistry, Histogram

from smserve.metrics import exposition, process, tally
from smserve.settings import Settings, SettingsError


@pytest.fixture(scope="module")
def registry():
    metrics.enable()
    return metrics.registry()


def sample(registry, name, **labels):
    metrics.flush()  # what a scrape does first
    return registry.get_sample_value(name, labels) or 0.0


def test_the_batcher_counts_records_passes_and_queue_waits(registry):
    passes = []

    def model(inputs):
        passes.append(len(inputs["x"]))
        gevent.sleep(0)  # (a real thread: no effect on the loop)
        return {"y": inputs["x"] * 2}

    runner = Runner()
    runner.start(model, max_batch_size=8, name="unit-batched")
    requests = [np.ones((rows, 2), dtype=np.float32) for rows in (1, 2, 3, 5, 11)]
    jobs = [gevent.spawn(runner.infer, {"x": r}) for r in requests]
    gevent.joinall(jobs, raise_error=True)
    assert sample(registry, "smserve_inferences_total", model="unit-batched") == sum(len(r) for r in requests)
    assert sample(registry, "smserve_batches_total", model="unit-batched") == len(passes)
    # One wait per pass-sized part: the 11-row request is two parts of at most 8.
    assert sample(registry, "smserve_queue_duration_seconds_count", model="unit-batched") == len(requests) + 1
    assert sample(registry, "smserve_pending_requests", model="unit-batched") == 0
    assert sample(registry, "smserve_model_ready", model="unit-batched") == 1
    runner.stats.ready(False)  # an unload: the series stays, at 0; the counters keep their counts
    assert sample(registry, "smserve_model_ready", model="unit-batched") == 0
    assert sample(registry, "smserve_inferences_total", model="unit-batched") == sum(len(r) for r in requests)


def test_an_unbatched_model_counts_each_pass_and_a_failed_pass_counts_nothing(registry):
    def model(inputs):
        if np.any(inputs["x"] < 0):
            raise ValueError("negative")
        return {"y": inputs["x"]}

    runner = Runner()
    runner.start(model, max_batch_size=0, name="unit-whole")
    runner.infer({"x": np.ones((4, 3), dtype=np.float32)})
    with pytest.raises(Exception):  # noqa: B017 - the model's failure, whatever its type: only the counts matter
        runner.infer({"x": -np.ones((2, 3), dtype=np.float32)})
    assert sample(registry, "smserve_inferences_total", model="unit-whole") == 4
    assert sample(registry, "smserve_batches_total", model="unit-whole") == 1
    assert sample(registry, "smserve_pending_requests", model="unit-whole") == 0


def test_tallied_observations_flush_as_observe_writes_them():
    # tally writes through the histogram's own bucket and sum values (private to
    # prometheus_client): an upgrade that renames them fails here, not in production.
    buckets = (0.001, 0.01, 0.1, 1.0)
    values = [0.0, 0.001, 0.0011, 0.05, 0.1, 0.5, 1.0, 7.0, 7.0]
    direct, tallied = CollectorRegistry(), CollectorRegistry()
    observed = Histogram("h", "h", ("route",), buckets=buckets, registry=direct).labels("/x")
    counted = tally.Observations(Histogram("h", "h", ("route",), buckets=buckets, registry=tallied).labels("/x"))
    for v in values:
        observed.observe(v)
        counted.observe(v)
    assert tallied.get_sample_value("h_count", {"route": "/x"}) == 0  # nothing written before the flush
    tally.flush()
    for le in ("0.001", "0.01", "0.1", "1.0", "+Inf"):
        assert (tallied.get_sample_value("h_bucket", {"route": "/x", "le": le})
                == direct.get_sample_value("h_bucket", {"route": "/x", "le": le})), le
    assert tallied.get_sample_value("h_sum", {"route": "/x"}) == pytest.approx(sum(values))
    tally.flush()  # nothing new: nothing written twice
    assert tallied.get_sample_value("h_count", {"route": "/x"}) == len(values)


def test_records_in_a_hooks_input():
    assert records_in(np.zeros((3, 64))) == 3
    assert records_in({"x": [[1], [2]], "sleep": 0}) == 2
    assert records_in(np.float32(1.0)) == 1
    assert records_in("a string") == 1


def test_requests_no_route_took_are_one_series_never_their_path(registry):
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/any/thing/12345", "REMOTE_ADDR": "127.0.0.1"}
    before = sample(registry, "smserve_requests_total", route="unmatched", code="404")
    access.log_request(environ, 404, 10, 0.0)
    assert sample(registry, "smserve_requests_total", route="unmatched", code="404") == before + 1
    assert not [s for m in registry.collect() for s in m.samples if "/any/thing" in str(s.labels)]


def test_a_route_added_to_the_flask_app_is_labelled_by_its_rule(registry):
    class Rule:
        rule = "/custom/<name>"

    class FlaskRequest:
        url_rule = Rule()

    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/custom/abc", "werkzeug.request": FlaskRequest()}
    access.log_request(environ, 200, 1, 0.0)
    assert sample(registry, "smserve_requests_total", route="/custom/<name>", code="200") == 1


class FakeCuda:
    """Two devices; CUDA initialised (by the inference thread, in a real worker)."""

    def __init__(self, initialized=True):
        self.initialized = initialized

    def is_available(self):
        return True

    def is_initialized(self):
        return self.initialized

    def device_count(self):
        return 2

    def memory_allocated(self, i):
        return 1000 * (i + 1)

    def memory_reserved(self, i):
        return 4096 * (i + 1)


class FakeTorch:
    def __init__(self, initialized=True):
        self.cuda = FakeCuda(initialized)


def test_gpu_memory_per_device_from_torch_cuda(registry):
    process.sample(torch=FakeTorch())
    assert sample(registry, "smserve_gpu_memory_allocated_bytes", device="0") == 1000
    assert sample(registry, "smserve_gpu_memory_allocated_bytes", device="1") == 2000
    assert sample(registry, "smserve_gpu_memory_reserved_bytes", device="1") == 8192
    assert process.gpu_memory(FakeTorch(initialized=False)) == []  # never initialises CUDA itself
    assert sample(registry, "smserve_process_resident_memory_bytes") > 0
    assert sample(registry, "smserve_process_cpu_seconds_total") > 0


def test_exposition_negotiates_openmetrics(registry):
    metrics.flush()
    body, content_type = exposition.collect("application/openmetrics-text; version=1.0.0", registry)
    assert content_type.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
    body, content_type = exposition.collect(None, registry)
    assert content_type.startswith("text/plain; version=0.0.4") and b"smserve_requests_total" in body


@pytest.mark.parametrize(("raw", "level"), [("10", "debug"), ("20", "info"), ("30", "warning"), ("40", "error"),
                                            ("50", "critical"), ("WARNING", "warning"), ("Debug", "debug"),
                                            ("warn", "warning")])
def test_sagemaker_container_log_level(raw, level):
    assert Settings.from_env({"SAGEMAKER_CONTAINER_LOG_LEVEL": raw}).log_level == level


def test_smserve_log_level_wins_over_sagemakers():
    # The SDK always sets SAGEMAKER_CONTAINER_LOG_LEVEL (20 by default): the project's
    # own, set on purpose, must still win.
    env = {"SAGEMAKER_CONTAINER_LOG_LEVEL": "20", "SMSERVE_LOG_LEVEL": "debug"}
    assert Settings.from_env(env).log_level == "debug"
    assert Settings.from_env({}).log_level == "info"


@pytest.mark.parametrize("raw", ["15", "verbose", "-1"])
def test_a_bad_log_level_names_the_variable(raw):
    with pytest.raises(SettingsError, match="SAGEMAKER_CONTAINER_LOG_LEVEL"):
        Settings.from_env({"SAGEMAKER_CONTAINER_LOG_LEVEL": raw})


def test_smserve_metrics_setting():
    assert Settings.from_env({}).metrics is True
    assert Settings.from_env({"SMSERVE_METRICS": "false"}).metrics is False
    with pytest.raises(SettingsError, match="SMSERVE_METRICS"):
        Settings.from_env({"SMSERVE_METRICS": "maybe"})

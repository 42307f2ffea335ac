"""A multi-model endpoint loads and unloads thousands of distinct models: what each one
left behind for good (prometheus values, torch's caches of the export deserialiser, the
source of torch.fx's generated code) grew the worker and every later collection, which
runs on the event loop. Each is let go of at the unload."""

from __future__ import annotations

import gc
import json
import linecache
import os
import subprocess
import sys
import textwrap

import torch

from tests.helpers.server import ROOT
from smserve.engine.worker import loaded_model
from smserve.engine.model import torch_caches


def test_an_unloaded_models_metrics_go_and_their_sums_stay(tmp_path):
    """In multiprocess mode (as `serve` runs workers), in a process of its own:
    prometheus_client picks its value class when first imported."""
    script = textwrap.dedent("""
        import json, os, sys
        from smserve import metrics
        from smserve.metrics import recording
        from prometheus_client import values
        metrics.enable(os.environ["PROMETHEUS_MULTIPROC_DIR"])
        listed = dict(zip(values.ValueClass.__init__.__code__.co_freevars,
                          values.ValueClass.__init__.__closure__))["values"].cell_contents
        start = len(listed)
        for i in range(200):
            for user in range(2):  # two generations of it at once: one forget leaves them
                stats = metrics.model(f"m{i}")
            stats.ran(3)
            stats.waited(0.0, 0.001)
            metrics.forget_model(f"m{i}")
            assert f"m{i}" in recording._models
            metrics.forget_model(f"m{i}")
        grown = len(listed) - start
        again = metrics.model("m7")  # a later load of a name counts on from its sums
        again.ran(2)
        metrics.flush()
        from prometheus_client import CollectorRegistry
        from prometheus_client.multiprocess import MultiProcessCollector
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        print(json.dumps({"grown": grown, "m7": registry.get_sample_value("smserve_inferences_total", {"model": "m7"}),
                          "m150": registry.get_sample_value("smserve_inferences_total", {"model": "m150"}),
                          "kept": len(recording._models)}))
    """)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(ROOT / "container")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["grown"] == 0, found  # ~20 values a model before
    assert found["kept"] == 1  # m7, loaded again
    assert found["m7"] == 5.0 and found["m150"] == 3.0


def test_torchs_caches_of_a_load_go_with_the_model(example_model_dir):
    def cycle():
        model = loaded_model.load_and_warm(str(example_model_dir), torch.device("cpu"))
        generated = torch_caches.generated_code(model.model)
        assert generated and all(name in linecache.cache for name in generated)
        del model
        torch_caches.clear_torch_caches(generated)
        gc.collect()
        assert not any(name in linecache.cache for name in generated)

    for _ in range(3):
        cycle()
    before = len(gc.get_objects())
    for _ in range(8):  # what stays is the same each load (15 here): 8 average it
        cycle()
    grown = (len(gc.get_objects()) - before) / 8
    # ~85 objects a load stayed before (a ShapeEnv, fake tensor cache entries, fx's
    # source entries); what is left is a few weakrefs and builtins torch keeps.
    assert grown < 30, f"{grown:.0f} objects a load stayed"

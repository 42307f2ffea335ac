"""What the logs say during a normal start and normal traffic: no ERROR lines (a model
still loading is not an error), one access line per request with fields CloudWatch can
filter on, and SageMaker's frequent successful pings only at DEBUG."""

from __future__ import annotations

import json
import time

import pytest
import requests

from tests.helpers.server import ServerProcess
from tests.helpers.models import echo_hooks

# An echo model whose model_fn takes 3 s: /ping answers 503 meanwhile.
SLOW_LOADING = echo_hooks(load_s=3)


def _start_and_use(model_dir, log_path, env):
    server = ServerProcess(model_dir, env, log_path=log_path)
    server.start(wait=False)
    pings = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                status = requests.get(server.url + "/ping", timeout=2).status_code
            except requests.RequestException:
                status = None
            pings.append(status)
            if status == 200:
                break
            time.sleep(0.2)
        assert pings[-1] == 200, server.log()
        answer = requests.post(server.url + "/invocations", json={"x": [1.5]}, timeout=30,
                               headers={"X-Amzn-RequestId": "req-123"})
        assert answer.status_code == 200
        for _ in range(3):
            assert requests.get(server.url + "/ping", timeout=5).status_code == 200
    finally:
        assert server.terminate() == 0
    return pings


@pytest.fixture
def slow_model(tmp_path):
    folder = tmp_path / "slow"
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "inference.py").write_text(SLOW_LOADING)
    return folder


@pytest.mark.slow
def test_a_normal_start_and_traffic_log_no_error_and_json_access_lines(slow_model, tmp_path):
    log_path = tmp_path / "server.log"
    pings = _start_and_use(slow_model, log_path, {"SMSERVE_LOG_FORMAT": "json"})
    assert 503 in pings, "the model loaded before any ping: the test saw no loading"
    entries = []
    for line in log_path.read_text().splitlines():
        if line.startswith("{"):
            entries.append(json.loads(line))
    assert entries, log_path.read_text()
    errors = [e for e in entries if e["level"] in ("ERROR", "CRITICAL")]
    assert not errors, errors
    access = [e for e in entries if e["logger"] == "smserve.access"]
    loading = [e for e in access if e["path"] == "/ping" and e["status"] == 503]
    assert loading and all(e["level"] == "INFO" for e in loading)
    (invocation,) = [e for e in access if e["path"] == "/invocations"]
    assert invocation["level"] == "INFO"
    assert invocation["method"] == "POST" and invocation["status"] == 200 and invocation["bytes"] > 0
    assert invocation["request_id"] == "req-123" and invocation["worker"] > 0
    assert invocation["latency_ms"] >= 0 and invocation["remote"] == "127.0.0.1"
    # Successful pings (SageMaker sends one every few seconds) are not logged at INFO.
    assert not [e for e in access if e["path"] == "/ping" and e["status"] == 200]


@pytest.mark.slow
def test_successful_pings_are_logged_at_debug(slow_model, tmp_path):
    log_path = tmp_path / "server.log"
    _start_and_use(slow_model, log_path, {"SMSERVE_LOG_LEVEL": "debug"})
    ok_pings = [line for line in log_path.read_text().splitlines()
                if "smserve.access" in line and '"GET /ping" 200' in line]
    assert len(ok_pings) >= 4 and all(" DEBUG " in line for line in ok_pings)

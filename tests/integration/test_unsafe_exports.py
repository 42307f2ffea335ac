"""A model.pt2 whose loading would unpickle (a weight marked use_pickle) in a real
gunicorn: the load fails with a clear log line, /ping answers 500, the pickle never ran."""

from __future__ import annotations

import requests

from tests.helpers.server import wait_until
from tests.helpers.unsafe_archives import unsafe_export


def _ping(server) -> int | None:
    try:
        return requests.get(server.url + "/ping", timeout=5).status_code
    except requests.RequestException:
        return None


def test_a_pickled_weight_fails_the_load_and_runs_nothing(tmp_path, make_server):
    marker = tmp_path / "ran"
    unsafe_export(tmp_path / "model", "pickled_weight", marker)
    server = make_server(tmp_path / "model", wait=False)
    assert wait_until(lambda: _ping(server) == 500, timeout=120)
    def logged() -> str:  # /ping may say 500 before the worker's log writer has written the line
        text = server.log()
        return text if "model failed to load" in text else ""

    log = wait_until(logged)
    assert "model failed to load" in log and "'linear.bias'" in log and "never unpickles" in log, log
    assert not marker.exists()

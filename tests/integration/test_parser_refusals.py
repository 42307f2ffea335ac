"""Requests gunicorn's parser refuses (400, 408, 414, 431) are answered, counted in
smserve_requests_total and logged like every other answer. A real gunicorn server."""

from __future__ import annotations

import json

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.server import ServerProcess, wait_until
from tests.integration.http_raw import Reader, connect

# What each refusal sends: a head the parser cannot read, a target over the request
# line's limit, a field over a field's limit, and a head that stops half-way.
REFUSED = {
    400: b"NOT A REQUEST\r\n\r\n",
    414: b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    431: b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n",
    408: b"GET /ping HTTP/1.1\r\nHost: x\r\n",
}


@pytest.fixture(params=["text", "json"])
def server(request, tmp_path, echo_model_dir):
    model = echo_model_dir
    env = {"SAGEMAKER_MODEL_SERVER_WORKERS": "1", "SMSERVE_HEADER_TIMEOUT": "1", "SMSERVE_LOG_FORMAT": request.param}
    server = ServerProcess(model, env, log_path=tmp_path / "log").start()
    yield server
    server.terminate()


def refusals_counted(server: ServerProcess) -> dict[str, float]:
    text = requests.get(server.url + "/metrics", timeout=10).text
    return {sample.labels["code"]: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "smserve_requests_total" and sample.labels.get("route") == "unmatched"}


def refusal_lines(server: ServerProcess) -> list[int]:
    statuses = []
    for line in server.log().splitlines():
        if '"smserve.access"' in line:
            entry = json.loads(line)
            if entry["path"] == "-":
                assert (entry["method"], entry["route"], entry["bytes"]) == ("-", "unmatched", 0)
                statuses.append(entry["status"])
        elif "smserve.access: 127.0.0.1 \"- -\" " in line:
            statuses.append(int(line.split('"- -" ')[1].split()[0]))
    return sorted(statuses)


def test_every_parser_refusal_is_counted_and_logged(server):
    for status, head in REFUSED.items():
        with connect(server.port) as sock:
            sock.sendall(head)
            assert Reader(sock).response().status == status
    assert wait_until(lambda: refusal_lines(server) == sorted(REFUSED), timeout=5), server.log()[-3000:]
    counted = refusals_counted(server)
    assert {code: counted.get(str(code)) for code in REFUSED} == {code: 1.0 for code in REFUSED}

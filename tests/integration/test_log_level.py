"""SAGEMAKER_CONTAINER_LOG_LEVEL (as the SageMaker SDK sets it: "10".."40" or a name)
sets the server's level: at WARNING no access line and no start-up INFO line (CloudWatch
bills each line). Access lines carry the inference id, in text and JSON. SMSERVE_METRICS
=false leaves /metrics out. Real gunicorn servers of one worker each (a level is every
worker's alike), each started when a test first asks for it."""

from __future__ import annotations

import json

import pytest
import requests

from tests.helpers.lazy_servers import LazyServers, started
from tests.helpers.server import ServerProcess, wait_until
from tests.integration.http_raw import Reader, connect, request_bytes

INFERENCE_ID = "X-Amzn-SageMaker-Inference-Id"


@pytest.fixture(scope="module")
def servers(tmp_path_factory, echo_model_dir):
    model = echo_model_dir
    logs = tmp_path_factory.mktemp("log-level-logs")
    envs = {
        "warning": {"SAGEMAKER_CONTAINER_LOG_LEVEL": "30", "SMSERVE_METRICS": "false"},
        "debug": {"SAGEMAKER_CONTAINER_LOG_LEVEL": "10"},
        "json": {"SAGEMAKER_CONTAINER_LOG_LEVEL": "INFO", "SMSERVE_LOG_FORMAT": "json"},
    }
    servers = LazyServers({name: lambda name=name, env=env: started(ServerProcess(model, env, log_path=logs / name))
                           for name, env in envs.items()})
    yield servers
    servers.stop()


def traffic(server) -> None:
    ok = requests.post(server.url + "/invocations", json={"x": [1.5]}, timeout=30,
                       headers={INFERENCE_ID: "inf-42", "X-Amzn-RequestId": "req-7"})
    assert ok.status_code == 200
    only_request_id = requests.post(server.url + "/invocations", json={"x": [1.5]}, timeout=30,
                                    headers={"X-Amzn-RequestId": "req-8"})
    assert only_request_id.status_code == 200
    spaced = requests.post(server.url + "/invocations", json={"x": [1.5]}, timeout=30,
                           headers={INFERENCE_ID: 'a b" 200 0'})
    assert spaced.status_code == 200
    assert requests.post(server.url + "/invocations", json={"fail": True, "x": [1]}, timeout=30).status_code == 500
    assert requests.get(server.url + "/ping", timeout=10).status_code == 200


def test_at_warning_no_access_line_and_no_info_line(servers):
    server = servers["warning"]
    traffic(server)
    assert requests.get(server.url + "/metrics", timeout=10).status_code == 404  # SMSERVE_METRICS=false
    server.terminate()
    lines = server.log().splitlines()
    assert not [line for line in lines if " INFO " in line or " DEBUG " in line], lines
    assert not [line for line in lines if "smserve.access" in line], lines
    # The model's failure is an ERROR, still written.
    assert [line for line in lines if " ERROR " in line and "asked to fail" in line], lines


def access_lines_of_traffic(server) -> list[str]:
    """The log's lines once the traffic's 4 invocations' access lines are out (a worker
    writes them up to logs.ACCESS_FLUSH_S late)."""
    def invocations() -> int:
        text = server.log()
        return text.count('"POST /invocations"') + text.count('"path": "/invocations"')

    before = invocations()
    traffic(server)
    wait_until(lambda: invocations() >= before + 4)
    return server.log().splitlines()


def test_at_debug_successful_pings_are_logged_and_ids_are_in_text_lines(servers):
    server = servers["debug"]
    lines = access_lines_of_traffic(server)
    access = [line for line in lines if "smserve.access" in line]
    assert [line for line in access if " DEBUG " in line and '"GET /ping" 200' in line], access
    invocations = [line for line in access if '"POST /invocations"' in line]
    assert [line for line in invocations if line.endswith(" id=inf-42")], invocations
    assert [line for line in invocations if line.endswith(" id=req-8")], invocations
    # A caller's id that holds spaces and quotes is quoted: it cannot forge the line's fields.
    assert [line for line in invocations if line.endswith(' id="a b\\" 200 0"')], invocations
    assert [line for line in invocations if " 500 " in line and line.endswith(" id=-")], invocations


def test_a_quote_in_the_request_target_is_escaped_in_the_text_line(servers):
    server = servers["debug"]
    with connect(server.port) as sock:
        sock.sendall(request_bytes("GET", '/x"_200_0_0.1ms_id=forged"'))
        assert Reader(sock).response().status == 404
    escaped = '"GET /x\\"_200_0_0.1ms_id=forged\\"" 404 '
    assert wait_until(lambda: escaped in server.log(), timeout=10), server.log()[-2000:]


def test_json_access_lines_carry_the_inference_id_and_route(servers):
    server = servers["json"]
    entries = [json.loads(line) for line in access_lines_of_traffic(server) if line.startswith("{")]
    access = [e for e in entries if e["logger"] == "smserve.access" and e["path"] == "/invocations"]
    by_id = {e.get("inference_id"): e for e in access}
    assert by_id["inf-42"]["request_id"] == "req-7" and by_id["inf-42"]["route"] == "/invocations"
    assert by_id["req-8"]["status"] == 200
    assert 'a b" 200 0' in by_id
    assert by_id[None]["status"] == 500
    # INFO: successful pings stay at DEBUG, so they are not written.
    assert not [e for e in entries if e["logger"] == "smserve.access" and e["path"] == "/ping"
                and e["status"] == 200]

"""GET /metrics from a real gunicorn with 2 workers: exact counts after N requests of
each kind (200, 4xx, 5xx, streamed, WebSocket) summed over both workers, histograms
whose buckets agree with their counts, OpenMetrics on request, and counters that never
go backwards when a worker is killed with SIGKILL and replaced."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from tests.helpers.server import ServerProcess, wait_until, worker_pids, ws_url
from tests.helpers.models import model_dir_with

# {"x": rows} is answered rows * 2 (len(rows) records); {"stream": n} streams n items;
# {"fail": true} is the model's failure (500); {"bad": true} is refused by input_fn (400).
HOOKS = '''
import json

import numpy as np


def model_fn(model_dir):
    return "counted"


def input_fn(body, content_type):
    data = json.loads(body)
    if data.get("bad"):
        raise ValueError("a bad body")
    return data


def predict_fn(data, model):
    if data.get("fail"):
        raise RuntimeError("asked to fail")
    if "stream" in data:
        return ({"i": i} for i in range(int(data["stream"])))
    return np.asarray(data["x"], dtype=np.float32) * 2
'''

N = 12  # requests of each kind
ROWS = 3  # records in each successful request
STREAM_ITEMS = 4
WS_MESSAGES = 5
INVOKE = "/invocations"
WS_ROUTE = "/invocations-bidirectional-stream"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = model_dir_with(tmp_path_factory.mktemp("metrics"), HOOKS, "counted")
    log_path = tmp_path_factory.mktemp("metrics-log") / "server.log"
    with ServerProcess(model, {"SAGEMAKER_MODEL_SERVER_WORKERS": "2"}, log_path=log_path) as s:
        yield s


def scrape(server, accept: str | None = None) -> tuple[dict, requests.Response]:
    """{(name, sorted labels): value} of every sample, and the answer."""
    answer = requests.get(server.url + "/metrics", headers={"Accept": accept} if accept else {}, timeout=10)
    assert answer.status_code == 200, answer.text
    samples = {}
    for family in text_string_to_metric_families(answer.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, answer


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def post(server, body) -> requests.Response:
    # A new connection each: gunicorn spreads them over both workers.
    return requests.post(server.url + INVOKE, data=json.dumps(body), timeout=30,
                         headers={"Content-Type": "application/json", "Connection": "close"})


def model_name(samples: dict) -> str:
    (name,) = {dict(labels)["model"] for (metric, labels) in samples if metric == "smserve_model_ready"}
    return name


def test_counts_are_exact_over_both_workers(server):
    before, _ = scrape(server)
    for _ in range(N):
        assert post(server, {"x": [[1.0]] * ROWS}).status_code == 200
        assert post(server, {"x": [[1.0]], "bad": True}).status_code == 400
        assert post(server, {"x": [[1.0]], "fail": True}).status_code == 500
        assert requests.get(server.url + "/no/such/route", timeout=10).status_code == 404
        streamed = requests.post(server.url + INVOKE, data=json.dumps({"stream": STREAM_ITEMS}), timeout=30,
                                 headers={"Content-Type": "application/json", "Accept": "application/jsonlines"})
        assert streamed.status_code == 200 and len(streamed.text.splitlines()) == STREAM_ITEMS
    with connect(ws_url(server)) as ws:
        for i in range(WS_MESSAGES):
            ws.send(json.dumps({"x": [[float(i)]]}))
            assert json.loads(ws.recv())
    # A worker writes its counts once a second (the one answering the scrape, at once):
    # scrape until both workers' are in.
    expected = {("smserve_requests_total", INVOKE, "200"): 2 * N, ("smserve_requests_total", INVOKE, "400"): N,
                ("smserve_requests_total", INVOKE, "500"): N, ("smserve_requests_total", "unmatched", "404"): N,
                ("smserve_requests_total", WS_ROUTE, "101"): 1}

    def delta(metric, **labels):
        return value(after, metric, **labels) - value(before, metric, **labels)

    def settled():
        now = scrape(server)[0]
        done = all(value(now, m, route=r, code=c) - value(before, m, route=r, code=c) >= n
                   for (m, r, c), n in expected.items())
        return now if done and value(now, "smserve_websocket_sessions_open") == 0 else None

    after = wait_until(settled, timeout=10, interval=0.2)
    assert after, scrape(server)[1].text
    name = model_name(after)

    assert delta("smserve_requests_total", route=INVOKE, code="200") == 2 * N
    assert delta("smserve_requests_total", route=INVOKE, code="400") == N
    assert delta("smserve_requests_total", route=INVOKE, code="500") == N
    # Never the raw path: what no route took is one series.
    assert delta("smserve_requests_total", route="unmatched", code="404") == N
    assert not [labels for (metric, labels) in after if metric == "smserve_requests_total"
                and "/no/such/route" in dict(labels)["route"]]
    assert delta("smserve_requests_total", route=WS_ROUTE, code="101") == 1
    assert delta("smserve_requests_total", route="/metrics", code="200") >= 1  # the first scrape
    assert delta("smserve_request_duration_seconds_count", route=INVOKE) == 4 * N
    # Records: ROWS per plain request, one per stream and per WebSocket message.
    assert delta("smserve_inferences_total", model=name) == ROWS * N + N + WS_MESSAGES
    assert delta("smserve_batches_total", model=name) == 2 * N + WS_MESSAGES
    assert delta("smserve_queue_duration_seconds_count", model=name) == 2 * N + WS_MESSAGES
    assert delta("smserve_streamed_responses_total") == N
    assert delta("smserve_stream_chunks_total") == N * STREAM_ITEMS
    assert delta("smserve_websocket_sessions_total") == 1
    assert delta("smserve_websocket_messages_total") == WS_MESSAGES
    assert value(after, "smserve_websocket_sessions_open") == 0
    assert value(after, "smserve_pending_requests", model=name) == 0
    assert value(after, "smserve_model_ready", model=name) == 1
    assert value(after, "smserve_workers") == 2
    assert value(after, "smserve_process_resident_memory_bytes") > 50e6
    assert value(after, "smserve_process_cpu_seconds_total") > 0
    # Both workers answered: the sums above are over two processes' files.
    # Read once both workers' access lines are out: each writes them up to 0.1 s late.
    def answering() -> set[str]:
        return set(re.findall(r"\[(\d+)\] INFO smserve\.access: .*\"POST /invocations\"", server.log()))

    wait_until(lambda: len(answering()) == 2)
    assert len(answering()) == 2, answering()


def test_histogram_buckets_are_cumulative_and_end_at_the_count(server):
    for _ in range(3):
        assert post(server, {"x": [[1.0]]}).status_code == 200
    # A route's histogram count is its requests, whatever their status, once both workers
    # have written their last second's counts.
    samples = wait_until(lambda: _consistent(scrape(server)[0]), timeout=10, interval=0.2)
    assert samples, scrape(server)[1].text
    checked = 0
    for histogram, label in (("smserve_request_duration_seconds", "route"), ("smserve_queue_duration_seconds", "model")):
        series = {dict(labels)[label] for (metric, labels) in samples if metric == histogram + "_count"}
        assert series
        for key in series:
            buckets = sorted(((float(dict(labels)["le"]), v) for (metric, labels), v in samples.items()
                              if metric == histogram + "_bucket" and dict(labels)[label] == key))
            counts = [v for _, v in buckets]
            assert counts == sorted(counts), (histogram, key, buckets)  # cumulative
            assert buckets[-1][0] == float("inf")
            assert buckets[-1][1] == value(samples, histogram + "_count", **{label: key})
            assert value(samples, histogram + "_sum", **{label: key}) >= 0
            checked += 1
    assert checked >= 3


def _consistent(samples):
    total = sum(v for (metric, labels), v in samples.items()
                if metric == "smserve_requests_total" and dict(labels)["route"] == INVOKE)
    return samples if value(samples, "smserve_request_duration_seconds_count", route=INVOKE) == total else None


def test_openmetrics_when_the_scraper_asks_for_it(server):
    _, plain = scrape(server)
    assert plain.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    _, om = scrape(server, "application/openmetrics-text; version=1.0.0,text/plain;version=0.0.4;q=0.5")
    assert om.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert om.text.endswith("# EOF\n")
    assert "# TYPE smserve_requests counter" in om.text


def test_counters_never_go_backwards_across_a_killed_worker(server):
    for _ in range(4):
        assert post(server, {"x": [[1.0]] * ROWS}).status_code == 200
    before, _ = scrape(server)
    pids = worker_pids(server)
    assert len(pids) == 2
    victim = min(pids)
    os.kill(victim, signal.SIGKILL)
    # The master replaces it; the newcomer takes connections once its model is loaded.
    assert wait_until(lambda: len(worker_pids(server) - {victim}) == 2, timeout=60)
    after, _ = wait_until(lambda: _with_workers(scrape(server), 2), timeout=60)
    counters = [key for key in before if key[0].endswith(("_total", "_count", "_sum", "_bucket"))]
    assert counters
    backwards = {key: (before[key], after.get(key)) for key in counters if after.get(key, 0.0) < before[key]}
    assert not backwards, backwards
    # And they go on counting exactly, both workers' files summed.
    name = model_name(after)
    for _ in range(N):
        assert post(server, {"x": [[1.0]] * ROWS}).status_code == 200
    later = wait_until(lambda: _grown(scrape(server)[0], after, name, ROWS * N), timeout=10, interval=0.2)
    assert later, "the counts did not grow by exactly what was sent"
    assert value(later, "smserve_requests_total", route=INVOKE, code="200") - value(
        after, "smserve_requests_total", route=INVOKE, code="200") == N
    # The dead worker's live gauges went with it: 2 workers, not 3; the model ready, once.
    assert value(later, "smserve_workers") == 2
    assert value(later, "smserve_model_ready", model=name) == 1


def _grown(samples, since, name, records):
    grown = value(samples, "smserve_inferences_total", model=name) - value(since, "smserve_inferences_total",
                                                                           model=name)
    assert grown <= records, grown  # never more than was sent
    return samples if grown == records else None


def _with_workers(scraped, n):
    samples, answer = scraped
    return scraped if value(samples, "smserve_workers") == n else None


def test_a_scrape_is_quick_with_two_workers(server):
    scrape(server)
    took = []
    for _ in range(10):
        started = time.perf_counter()
        scrape(server)
        took.append(time.perf_counter() - started)
    took.sort()
    # The bound is 100 ms; this machine's 2 shared cores get a generous margin.
    assert took[len(took) // 2] < 0.1, took

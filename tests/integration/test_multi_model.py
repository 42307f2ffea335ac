"""Multi-model endpoints (SAGEMAKER_MULTI_MODEL=true) in a real gunicorn with 2 workers:
SageMaker's model API, every worker in step, room measured (507), memory given back
after unloads, races of loads, invokes and unloads, and SIGTERM in MME mode.

One server for the API, the races and the 507 cases: its room is small (the 507 cases'
big models need that), and the other tests' models are small ones, each unloaded after
its test, so that each test finds the server holding no model."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import pytest
import requests
import torch

from tests.helpers.server import ServerProcess, log_lines, pending_requests, wait_until, worker_pids
from tests.helpers.models import echo_hooks, model_dir_with
from tests.helpers.unsafe_archives import unsafe_export

PIXELS = [[float(i % 17) for i in range(64)]]
MME = {"SAGEMAKER_MULTI_MODEL": "true", "SAGEMAKER_MODEL_SERVER_WORKERS": "2"}
# The server's room: the small model and one big model (~155 MB a worker) fit and a
# second big one does not; after an unload it does. (What every model's first load
# imports, ~100 MB a worker, comes at the worker's start: no model's footprint holds it.)
SMALL_ROOM_MB = 480


@pytest.fixture(scope="module")
def models(tmp_path_factory, example_model_dir) -> Path:
    root = tmp_path_factory.mktemp("mme")
    for name in ("a", "b", "c", "cycle", "race", "drain"):
        shutil.copytree(example_model_dir, root / name)
    for name in ("big1", "big2"):
        (root / name).mkdir()
        torch.jit.save(torch.jit.script(torch.nn.Linear(6400, 6144)), str(root / name / "model.pt"))
    (root / "broken").mkdir()
    (root / "broken" / "model.pt").write_bytes(b"this is not a model")
    model_dir_with(root, echo_hooks(), "echo")
    return root


def mme(models: Path) -> dict[str, str]:
    """Multi-model mode loading from `models` (SageMaker's root is /opt/ml/models)."""
    return {**MME, "SMSERVE_MODELS_ROOT": str(models)}


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    logs = tmp_path_factory.mktemp("mme-logs")
    with ServerProcess(models / "none", {**mme(models), "SMSERVE_MODELS_MEMORY_MB": str(SMALL_ROOM_MB)},
                       log_path=logs / "server.log") as started:
        yield started


def load(server, name, url, timeout=120):
    return requests.post(server.url + "/models", json={"model_name": name, "url": str(url)}, timeout=timeout)


def invoke(server, name, body=None, **kwargs):
    # A new connection each time: gunicorn's workers take turns at the listening socket.
    with requests.Session() as s:
        return s.post(f"{server.url}/models/{name}/invoke", json=body or {"instances": PIXELS}, timeout=60, **kwargs)


def test_ping_is_200_with_no_model_and_invocations_points_to_the_model_api(server):
    assert requests.get(server.url + "/ping").status_code == 200
    r = requests.post(server.url + "/invocations", json={"instances": PIXELS})
    assert r.status_code == 404 and "/models/" in r.json()["error"]


def test_the_whole_model_api(server, models):
    r = load(server, "a", models / "a")
    assert r.status_code == 200, r.text
    # Loaded through every worker the moment the 200 came: never a 404 from a sibling.
    codes = [invoke(server, "a").status_code for _ in range(30)]
    assert codes == [200] * 30
    assert len(invoke(server, "a").json()["predictions"]) == 1
    assert load(server, "a", models / "a").status_code == 409
    assert requests.get(server.url + "/models/a").json() == {"modelName": "a", "modelUrl": str(models / "a")}
    assert requests.get(server.url + "/models/nope").status_code == 404
    assert invoke(server, "nope").status_code == 404
    # Every content type and Accept, as /invocations answers them.
    csv = requests.post(server.url + "/models/a/invoke", data="1," * 63 + "1\n", timeout=30,
                        headers={"Content-Type": "text/csv", "Accept": "text/csv",
                                 "X-Amzn-SageMaker-Target-Model": "a.tar.gz"})
    assert csv.status_code == 200 and csv.headers["Content-Type"].startswith("text/csv")
    v2 = requests.get(server.url + "/v2/models/a")
    assert v2.status_code == 200 and v2.json()["inputs"][0]["name"] == "pixels"
    r = requests.delete(server.url + "/models/a")
    assert r.status_code == 200
    # Unloaded from every worker before the 200.
    assert [invoke(server, "a").status_code for _ in range(10)] == [404] * 10
    assert requests.delete(server.url + "/models/a").status_code == 404
    assert requests.get(server.url + "/v2/models/a").status_code == 404


def test_list_is_the_same_on_every_worker_and_pages(server, models):
    for name in ("b", "c", "echo"):
        assert load(server, name, models / name).status_code == 200
    try:
        seen = {requests.get(server.url + "/models", timeout=10).text for _ in range(10)}
        assert len(seen) == 1
        listed = json.loads(seen.pop())["models"]
        assert [m["modelName"] for m in listed] == ["b", "c", "echo"]
        first = requests.get(server.url + "/models", params={"limit": 2}).json()
        assert [m["modelName"] for m in first["models"]] == ["b", "c"]
        rest = requests.get(server.url + "/models", params={"limit": 2, "next_page_token": first["nextPageToken"]}).json()
        assert [m["modelName"] for m in rest["models"]] == ["echo"] and "nextPageToken" not in rest
        assert requests.get(server.url + "/models", params={"limit": 0}).status_code == 400
        assert requests.get(server.url + "/models", params={"next_page_token": "x"}).status_code == 400
        # Each model its own hooks: echo doubles, the digits models classify.
        assert invoke(server, "echo", {"x": [1, 2]}).json() == [2.0, 4.0]  # input_fn read it: bare
        assert "predictions" in invoke(server, "b").json()
    finally:
        for name in ("b", "c", "echo"):
            requests.delete(server.url + f"/models/{name}")


@pytest.mark.parametrize("body, status", [
    ({"model_name": "x", "url": "/does/not/exist"}, 400),
    ({"model_name": "x"}, 400),
    ({"url": "/tmp"}, 400),
    ("not json", 400),
])
def test_a_bad_load_request_is_a_json_4xx(server, body, status):
    r = requests.post(server.url + "/models", data=body if isinstance(body, str) else json.dumps(body))
    assert r.status_code == status and "error" in r.json()
    assert requests.get(server.url + "/models/x").status_code == 404


def listed(server) -> list[str]:
    return [m["modelName"] for m in requests.get(server.url + "/models", timeout=10).json()["models"]]


@pytest.mark.parametrize("name", ["a" * 1025, "x" * 4100, "caf\u00e9", "tab\there", " leading-space", "nul\x00",
                                  "del\x7f"],
                         ids=["1025", "4100", "non-ascii", "tab", "space", "nul", "del"])
def test_a_name_sagemaker_could_not_send_is_400_and_nothing_is_registered(server, models, name):
    """SageMaker's TargetModel is 1-1,024 printable ASCII characters. A name of ~4,080+
    could never be addressed again (414s), each name is a label of ~20 /metrics series,
    and all were loaded before."""
    r = load(server, name, models / "a")
    assert r.status_code == 400 and "model_name must be 1 to 1024 characters" in r.json()["error"], r.text
    assert listed(server) == []


def test_a_name_of_1024_characters_that_each_need_escaping_works_end_to_end(server, models):
    """The longest name SageMaker may send, every character percent-encoded in its paths
    (3,072 bytes of path): loaded, described, invoked, listed and unloaded."""
    name = "/% ?#\"&+"[:1] + "".join("/% ?#\"&+"[i % 8] for i in range(1, 1024))
    assert len(name) == 1024
    path = "/models/" + quote(name, safe="")
    assert len(path) > 3000
    assert load(server, name, models / "b").status_code == 200
    try:
        assert requests.get(server.url + path, timeout=10).json()["modelName"] == name
        for _ in range(4):  # both workers
            r = requests.post(server.url + path + "/invoke", json={"instances": PIXELS}, timeout=30)
            assert r.status_code == 200 and len(r.json()["predictions"]) == 1, r.text
        assert listed(server) == [name]
        label = name.replace("\\", "\\\\").replace('"', '\\"')  # as Prometheus text escapes it
        assert f'smserve_model_ready{{model="{label}"}} 1.0' in requests.get(server.url + "/metrics", timeout=10).text
    finally:
        assert requests.delete(server.url + path, timeout=60).status_code == 200
    assert listed(server) == []


def test_a_folder_outside_the_models_root_is_400(server, models, tmp_path, example_model_dir):
    """Loading runs the folder's code/inference.py: only folders under SMSERVE_MODELS_ROOT
    (SageMaker's /opt/ml/models) are loaded, '..' resolved first."""
    outside = shutil.copytree(example_model_dir, tmp_path / "elsewhere")
    for url in (str(outside), str(models / "a" / ".." / ".." / outside.parent.name / "elsewhere"), "a",
                str(models) + "-sibling"):
        r = load(server, "x", url)
        assert r.status_code == 400 and "not a folder under" in r.json()["error"], (url, r.text)
    assert listed(server) == []


def test_a_broken_model_is_400_and_the_others_go_on(server, models):
    assert load(server, "c", models / "c").status_code == 200
    try:
        r = load(server, "broken", models / "broken")
        assert r.status_code == 400 and "broken" in r.json()["error"]
        assert requests.get(server.url + "/models/broken").status_code == 404
        assert requests.get(server.url + "/ping").status_code == 200
        assert [invoke(server, "c").status_code for _ in range(6)] == [200] * 6
        # The name is free again: a fixed folder loads under it.
        assert load(server, "broken", models / "b").status_code == 200
        requests.delete(server.url + "/models/broken")
    finally:
        requests.delete(server.url + "/models/c")


def test_a_model_pt2_that_would_unpickle_is_400_and_runs_nothing(server, models):
    marker = models / "pickled-ran"
    unsafe_export(models / "pickled", "pickled_weight", marker)
    r = load(server, "pickled", models / "pickled")
    assert r.status_code == 400 and "never unpickles" in r.json()["error"], r.text
    assert not marker.exists()
    assert requests.get(server.url + "/models/pickled").status_code == 404
    assert requests.get(server.url + "/ping").status_code == 200


def test_no_room_is_507_and_a_load_that_fits_after_an_unload(server, models):
    try:
        assert load(server, "a", models / "a").status_code == 200
        assert load(server, "big1", models / "big1").status_code == 200
        r = load(server, "big2", models / "big2")
        assert r.status_code == 507, r.text
        assert "room" in r.json()["error"]
        # What the refused load took is given back, everywhere: it is not listed, not answered.
        assert [m["modelName"] for m in requests.get(server.url + "/models").json()["models"]] == ["a", "big1"]
        assert requests.post(server.url + "/models/big2/invoke", json={}).status_code == 404
        assert requests.delete(server.url + "/models/big1").status_code == 200
        assert load(server, "big2", models / "big2").status_code == 200
        assert [invoke(server, "a").status_code for _ in range(4)] == [200] * 4
        for name in ("a", "big2"):
            assert requests.delete(server.url + f"/models/{name}").status_code == 200
    finally:
        for name in ("a", "big1", "big2"):  # (after a failure: the next test finds none loaded)
            requests.delete(server.url + f"/models/{name}", timeout=60)


def _rss(pids) -> int:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/statm") as f:
            total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return total


def test_memory_returns_after_unloads_over_many_cycles(server, models):
    """50 load/unload cycles of one model: the workers' resident memory after the last
    is within noise of after the fifth (the first loads bring what every load needs)."""
    pids = worker_pids(server)
    samples = {}
    for cycle in range(1, 51):
        assert load(server, "cycle", models / "cycle").status_code == 200
        assert invoke(server, "cycle").status_code == 200
        assert requests.delete(server.url + "/models/cycle").status_code == 200
        if cycle in (5, 50):
            samples[cycle] = _rss(pids)
    assert worker_pids(server) == pids
    growth_mb = (samples[50] - samples[5]) / 2 ** 20
    assert growth_mb < 20, f"workers grew {growth_mb:.1f} MB over 45 load/unload cycles"


def test_loads_racing_invokes_and_unloads_of_one_name(server, models):
    """Loaders, unloaders and invokers of one name at once: only the contract's answers
    (200, 404, 409), never a 5xx, and /ping keeps answering: two threads of each call,
    for 5 s."""
    stop = time.monotonic() + 5
    seen: dict[str, set] = {"load": set(), "unload": set(), "invoke": set(), "ping": set()}
    lock = threading.Lock()

    def loop(kind, call):
        while time.monotonic() < stop:
            status = call().status_code
            with lock:
                seen[kind].add(status)
            if kind == "unload":
                # Room for a load to finish now and then (an unload waits for a load under
                # way): until the model serves, or a while, when the next unload lands mid-load.
                wait_until(lambda: requests.get(server.url + "/models/race", timeout=10).status_code == 200,
                           timeout=2)

    calls = {
        "load": lambda: load(server, "race", models / "race"),
        "unload": lambda: requests.delete(server.url + "/models/race", timeout=60),
        "invoke": lambda: invoke(server, "race"),
        "ping": lambda: requests.get(server.url + "/ping", timeout=2),
    }
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(loop, kind, call) for kind, call in calls.items() for _ in range(2)]
        for future in futures:
            future.result()
    assert seen["load"] <= {200, 409} and 200 in seen["load"], seen
    assert seen["unload"] <= {200, 404} and 200 in seen["unload"], seen
    assert seen["invoke"] <= {200, 404}, seen
    assert seen["ping"] == {200}, seen
    requests.delete(server.url + "/models/race")
    assert requests.get(server.url + "/models/race").status_code == 404


def test_a_restarted_worker_loads_every_model_before_it_serves(server, models):
    assert load(server, "a", models / "a").status_code == 200
    try:
        before = worker_pids(server)
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        successor = wait_until(lambda: (worker_pids(server) - before), timeout=30).pop()
        # The successor loads 'a' before it takes a connection; from then on both answer.
        assert wait_until(lambda: any(f"[{successor}]" in line
                                      for line in log_lines(server.log(), "INFO", "multi-model: 'a' loaded")), timeout=60)
        codes = [invoke(server, "a").status_code for _ in range(40)]
        assert codes == [200] * 40
        r = requests.delete(server.url + "/models/a", timeout=30)
        assert r.status_code == 200, r.text
    finally:
        requests.delete(server.url + "/models/a")


def first_ping(server) -> requests.Response:
    """The first answer /ping gives after the server starts listening."""
    while True:
        assert server.proc.poll() is None, server.log()
        try:
            return requests.get(server.url + "/ping", timeout=60)
        except requests.ConnectionError:
            time.sleep(0.05)


def test_the_first_answer_to_ping_is_200(models, tmp_path):
    """At the start no worker takes a connection until every one has torch in and follows
    the model registry: a client that connects early waits, and its first answer is 200,
    when a load can start at once. The PyTorch containers' model server listens only once
    started, and AWS's toolkit's multi-model test asserts 200 on the first /ping that
    answers (a 503 there failed it)."""
    server = ServerProcess(models / "none", mme(models), log_path=tmp_path / "start.log").start(wait=False)
    try:
        first = first_ping(server)
        assert first.status_code == 200, first.text
        assert load(server, "echo", models / "echo").status_code == 200
        assert invoke(server, "echo", {"x": [1]}).status_code == 200
    finally:
        server.terminate()


def test_sigterm_drains_invokes_in_flight(models, tmp_path):
    server = ServerProcess(models / "none", mme(models), log_path=tmp_path / "drain.log").start(wait=False)
    try:
        assert first_ping(server).status_code == 200
        assert load(server, "echo", models / "echo").status_code == 200
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(invoke, server, "echo", {"x": [i], "sleep": 1.5}) for i in range(4)]
            assert wait_until(lambda: pending_requests(server) == 4, timeout=10)  # all four in flight
            os.kill(server.proc.pid, signal.SIGTERM)
            answers = [f.result() for f in futures]
        assert [a.status_code for a in answers] == [200] * 4
        assert sorted(a.json()[0] for a in answers) == [0.0, 2.0, 4.0, 6.0]
        assert server.proc.wait(timeout=30) == 0
    finally:
        server.terminate()

"""The local multi-model driver (`python -m local_test.multi_model`, local_test/multi_model.py)
against a real gunicorn with 2 workers in multi-model mode: it unpacks archives to a
cache (safely), loads, invokes, reloads after a 404, and on 507 unloads the least
recently used model and retries.

One server, with a small room (500 MB), emptied after each test. A warm-up load and
unload first brings what every worker's first load needs (~100 MB a worker, ~205 MB over
both with the digits model: it fits), so that each later load's measured footprint is
the model's own: a big model (a zero-filled Linear(6400, 6144) in TorchScript, 157 MB of
weights, a tiny archive) takes ~315 MB over both workers, a digits model ~1.4 MB. The
room holds one big model and digits models, never two big ones; only the 507 test loads
big ones."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import requests
import torch

from local_test.multi_model import DriverError, LocalMultiModel, unpack
from tests.helpers.server import ROOT, ServerProcess

MME = {"SAGEMAKER_MULTI_MODEL": "true", "SAGEMAKER_MODEL_SERVER_WORKERS": "2"}
SMALL_ROOM_MB = 500
BIG_IN, BIG_OUT = 6400, 6144
PIXELS = json.dumps({"instances": [[float(i % 17) for i in range(64)]]}).encode()
BIG_BODY = json.dumps({"instances": [[0.0] * BIG_IN]}).encode()


def _tar_folder(folder: Path, archive: Path) -> Path:
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False)
    return archive


@pytest.fixture(scope="module")
def archives(tmp_path_factory, example_model_dir) -> Path:
    """a, b, nested/c: the digits model; big1, big2: zero-filled TorchScript models
    (tiny archives, 157 MB loaded); warm: a small TorchScript model; broken: not a model."""
    root = tmp_path_factory.mktemp("archives")
    folders = tmp_path_factory.mktemp("folders")
    digits = ROOT / "build" / "model.tar.gz"
    for name in ("a", "b", "nested/c"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(digits, root / f"{name}.tar.gz")
    for name, (n_in, n_out) in {"big1": (BIG_IN, BIG_OUT), "big2": (BIG_IN, BIG_OUT), "warm": (8, 8)}.items():
        (folders / name).mkdir()
        layer = torch.nn.Linear(n_in, n_out)
        torch.nn.init.zeros_(layer.weight)
        torch.nn.init.zeros_(layer.bias)
        torch.jit.save(torch.jit.script(layer), str(folders / name / "model.pt"))
        _tar_folder(folders / name, root / f"{name}.tar.gz")
    (folders / "broken").mkdir()
    (folders / "broken" / "model.pt").write_bytes(b"this is not a model")
    _tar_folder(folders / "broken", root / "broken.tar.gz")
    return root


@pytest.fixture(scope="module")
def server(archives, tmp_path_factory):
    logs = tmp_path_factory.mktemp("mme-driver-logs")
    # The driver unpacks into each test's own temporary folder: all under the base one.
    env = {**MME, "SMSERVE_MODELS_ROOT": str(tmp_path_factory.getbasetemp()),
           "SMSERVE_MODELS_MEMORY_MB": str(SMALL_ROOM_MB)}
    with ServerProcess(archives / "none", env, log_path=logs / "server.log") as started:
        # The warm-up: what every first load brings stays, unattributed.
        warm = LocalMultiModel(archives, started.url, tmp_path_factory.mktemp("warm-cache"), remember=False)
        for target in ("a.tar.gz", "warm.tar.gz"):
            warm.load(target)
        assert sorted(warm.unload_all()) == ["a.tar.gz", "warm.tar.gz"]
        yield started


@pytest.fixture
def api(server, archives, tmp_path):
    """The server, emptied after each test."""
    yield server
    LocalMultiModel(archives, server.url, tmp_path / "cleanup", remember=False).unload_all()


def listed(server) -> list[str]:
    return [m["modelName"] for m in requests.get(server.url + "/models", timeout=10).json()["models"]]


def cli(*args: str, body: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "local_test.multi_model", *args], cwd=ROOT, input=body,
                          capture_output=True, timeout=300)


def test_the_command_unpacks_loads_and_invokes_then_reuses_all_of_it(api, archives, tmp_path):
    cache = tmp_path / "cache"
    body = tmp_path / "body.json"
    body.write_bytes(PIXELS)
    first = cli(str(archives), "--target", "a.tar.gz", "--url", api.url, "--body", str(body), "--cache-dir", str(cache))
    assert first.returncode == 0, first.stderr.decode()
    assert len(json.loads(first.stdout)["predictions"]) == 1
    progress = first.stderr.decode()
    for step in ("unpack  a.tar.gz", "load    a.tar.gz", "invoke  a.tar.gz: 200", "total   unpack"):
        assert step in progress, progress
    # The model's folder is the cache's copy; loaded through every worker.
    [described] = requests.get(api.url + "/models").json()["models"]
    assert described["modelName"] == "a.tar.gz" and Path(described["modelUrl"]).parent == cache
    assert (Path(described["modelUrl"]) / "model.pt2").is_file()
    for _ in range(10):
        with requests.Session() as s:
            assert s.post(api.url + "/models/a.tar.gz/invoke", data=PIXELS, timeout=30,
                          headers={"Content-Type": "application/json"}).status_code == 200

    # Again, CSV from stdin: nothing unpacked or loaded, the answer in CSV.
    again = cli(str(archives), "-t", "a.tar.gz", "--url", api.url, "--cache-dir", str(cache),
                "-c", "text/csv", "-a", "text/csv", body=("1," * 63 + "1\n").encode())
    assert again.returncode == 0, again.stderr.decode()
    assert len(again.stdout.decode().strip().split(",")) == 10
    progress = again.stderr.decode()
    assert "(cached)" in progress and "(loaded already)" in progress and "unpack  " not in progress

    listing = cli(str(archives), "--list", "--url", api.url, "--cache-dir", str(cache))
    lines = listing.stdout.decode().splitlines()
    assert "loaded  a.tar.gz" in lines and "        nested/c.tar.gz" in lines


def test_the_command_says_what_went_wrong(api, archives, tmp_path):
    missing = cli(str(archives), "-t", "nope.tar.gz", "--url", api.url, "--cache-dir", str(tmp_path), body=PIXELS)
    assert missing.returncode == 2 and b"no model archive 'nope.tar.gz'" in missing.stderr
    broken = cli(str(archives), "-t", "broken.tar.gz", "--url", api.url, "--cache-dir", str(tmp_path), body=PIXELS)
    assert broken.returncode == 2 and b"POST /models 'broken.tar.gz': 400" in broken.stderr
    bad_body = cli(str(archives), "-t", "a.tar.gz", "--url", api.url, "--cache-dir", str(tmp_path), body=b"{")
    assert bad_body.returncode == 1 and b"error" in bad_body.stdout
    # The server went on: ping, and the model the bad body went to, answer.
    assert requests.get(api.url + "/ping").status_code == 200
    assert listed(api) == ["a.tar.gz"]


def test_a_name_with_a_slash_and_a_reload_after_an_unload_behind_its_back(api, archives, tmp_path):
    mme = LocalMultiModel(archives, api.url, tmp_path)
    answer, timings = mme.invoke("nested/c.tar.gz", PIXELS)
    assert answer.status_code == 200 and timings.loaded and timings.unpacked
    assert requests.get(api.url + "/models/nested%2Fc.tar.gz").json()["modelName"] == "nested/c.tar.gz"
    # Someone else unloads it: the next invoke is a 404, loads it again and answers.
    assert requests.delete(api.url + "/models/nested%2Fc.tar.gz").status_code == 200
    answer, timings = mme.invoke("nested/c.tar.gz", PIXELS)
    assert answer.status_code == 200 and timings.reloads == 1 and timings.loaded and not timings.unpacked


def test_max_models_unloads_the_least_recently_used(api, archives, tmp_path):
    mme = LocalMultiModel(archives, api.url, tmp_path, max_models=2)
    for target in ("a.tar.gz", "b.tar.gz", "a.tar.gz"):  # b is now the least recent
        assert mme.invoke(target, PIXELS)[0].status_code == 200
    answer, timings = mme.invoke("nested/c.tar.gz", PIXELS)
    assert answer.status_code == 200 and timings.evicted == ["b.tar.gz"]
    assert mme.loaded == ["a.tar.gz", "nested/c.tar.gz"] and listed(api) == ["a.tar.gz", "nested/c.tar.gz"]


def test_the_order_of_use_outlives_the_driver(api, archives, tmp_path):
    """A later command knows which model was used least recently, and counts models the
    server holds that no driver used as older still."""
    stranger = shutil.copytree(ROOT / "build" / "model", tmp_path / "stranger")
    requests.post(api.url + "/models", json={"model_name": "stranger", "url": str(stranger)},
                  timeout=120).raise_for_status()
    first = LocalMultiModel(archives, api.url, tmp_path)
    for target in ("b.tar.gz", "a.tar.gz", "b.tar.gz"):
        first.invoke(target, PIXELS)
    later = LocalMultiModel(archives, api.url, tmp_path)
    assert later.loaded == ["stranger", "a.tar.gz", "b.tar.gz"]


def test_507_unloads_the_least_recently_used_until_the_model_fits(api, archives, tmp_path):
    small = api
    mme = LocalMultiModel(archives, small.url, tmp_path)
    try:
        for target, body in (("big1.tar.gz", BIG_BODY), ("a.tar.gz", PIXELS)):
            answer, timings = mme.invoke(target, body)
            assert answer.status_code == 200 and not timings.evicted, answer.text
        assert len(mme.invoke("big1.tar.gz", BIG_BODY)[0].json()["predictions"][0]) == BIG_OUT
        # Now a is the least recent, but the 507 is for big2: unloading a is not enough
        # room, so big1 goes too; they go in order of use.
        answer, timings = mme.invoke("big2.tar.gz", BIG_BODY)
        assert answer.status_code == 200, answer.text
        assert timings.evicted == ["a.tar.gz", "big1.tar.gz"]
        assert listed(small) == ["big2.tar.gz"]
        # A digits model fits beside one big model: no eviction.
        answer, timings = mme.invoke("b.tar.gz", PIXELS)
        assert answer.status_code == 200 and not timings.evicted
        # big1 again: the least recent (big2) goes, b stays.
        answer, timings = mme.invoke("big1.tar.gz", BIG_BODY)
        assert answer.status_code == 200 and timings.evicted == ["big2.tar.gz"]
        assert listed(small) == ["b.tar.gz", "big1.tar.gz"] and mme.loaded == ["b.tar.gz", "big1.tar.gz"]
    finally:
        mme.unload_all()


def test_the_make_target_runs_the_driver():
    out = subprocess.run(["make", "--no-print-directory", "-n", "-B", "mme-local", "TARGET=x/y.tar.gz",
                          "ACCEPT=text/csv", "VENV=/nonexistent-venv"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60).stdout
    assert "-m local_test.multi_model build --target x/y.tar.gz --url http://127.0.0.1:8080" in out
    assert "--accept text/csv" in out


# ---------------------------------------------------------------- unpacking safely (no server)


def _evil(tmp_path: Path, name: str, kind: str = "file", link: str = "") -> Path:
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        good = tarfile.TarInfo("model.pt")
        good.size = 3
        tar.addfile(good, io.BytesIO(b"abc"))
        info = tarfile.TarInfo(name)
        if kind == "file":
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
        else:
            info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
            info.linkname = link
            tar.addfile(info)
    return archive


@pytest.mark.parametrize("name, kind, link", [
    ("../escaped", "file", ""),
    ("code/../../escaped", "file", ""),
    ("code/link", "symlink", "../../escaped"),
    ("code/link", "symlink", "/etc/passwd"),
    ("code/hard", "hardlink", "../escaped"),
])
def test_an_archive_that_reaches_outside_the_cache_is_refused(tmp_path, name, kind, link):
    archive = _evil(tmp_path, name, kind, link)
    cache = tmp_path / "cache"
    cache.mkdir()
    with pytest.raises(DriverError, match="refused to unpack"):
        unpack(archive, cache / "model")
    assert list(cache.iterdir()) == []  # no half-unpacked folder either
    assert not (tmp_path / "escaped").exists()


def test_an_unsafe_target_name_is_refused(tmp_path):
    (tmp_path / "models").mkdir()
    outside = _evil(tmp_path, "x")  # tmp_path/evil.tar.gz, beside the models folder
    mme = LocalMultiModel.__new__(LocalMultiModel)
    mme.models_dir, mme.cache_dir = (tmp_path / "models").resolve(), (tmp_path / "cache").resolve()
    with pytest.raises(DriverError, match="no model archive"):
        mme.archive("../" + outside.name)


def test_an_absolute_name_lands_inside_the_cache(tmp_path):
    """As tarfile's "data" filter does: the leading / is dropped, never written there."""
    outside = tmp_path / "absolute-escaped"
    archive = _evil(tmp_path, str(outside))
    (tmp_path / "cache").mkdir()
    unpack(archive, tmp_path / "cache" / "model")
    assert not outside.exists()
    assert (tmp_path / "cache" / "model" / str(outside).lstrip("/")).read_bytes() == b"evil"

"""SageMaker's part of a multi-model endpoint, on a laptop: `python -m local_test.multi_model`.

    # terminal 1: a server in multi-model mode (no model in it yet)
    SAGEMAKER_MULTI_MODEL=true make serve
    # terminal 2: invoke build/model.tar.gz as the target model
    python -m local_test.multi_model build --target model.tar.gz \\
        --body local_test/payloads/digits.json --content-type application/json

On an endpoint, SageMaker keeps the artifacts (`model.tar.gz` files under one S3
prefix) and, for an InvokeEndpoint naming a TargetModel, does what this does with a
folder of `*.tar.gz` files:

1. unpacks the target's archive on first use into a cache folder (here
   `build/mme-cache` unless --cache-dir; safely: nothing outside the cache, no links
   or devices, as tarfile's "data" filter);
2. asks the container to load it: `POST /models {"model_name", "url"}`; on 507 (no
   room) it unloads the model used least recently (`DELETE /models/<name>`) and
   retries, until the target fits or nothing is left to unload;
3. invokes it: `POST /models/<name>/invoke` with the body, Content-Type and Accept
   given, and `X-Amzn-SageMaker-Target-Model`. A 404 (the model went away behind the
   driver's back) loads it again and retries once.

The model's name is the archive's path under the folder (`model.tar.gz`,
`customers/acme.tar.gz`), as SageMaker's TargetModel is. Progress and timings (unpack,
load, evictions, invoke) go to stderr, the answer to stdout; the exit status is 1 for
an answer of 4xx/5xx.

Between runs the order of use is kept in the cache folder (one file per server URL),
so the least recently used model is the same across separate commands; models the
server holds that this driver never used count as the least recent.

As a library (the bench drives it so):

    mme = LocalMultiModel("models/", url="http://127.0.0.1:8080", max_models=20)
    answer, timings = mme.invoke("a.tar.gz", body, "application/json")

`max_models` caps how many models stay loaded (the LRU unloads past it, before the
load), a stand-in for an instance's room when the server's own room (507) is larger.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import requests

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_CACHE = ROOT / "build" / "mme-cache"
TARGET_MODEL_HEADER = "X-Amzn-SageMaker-Target-Model"
ARCHIVE_SUFFIX = ".tar.gz"


class DriverError(RuntimeError):
    """A model the driver cannot bring to the server (no archive, an unsafe archive, a
    load refused for a reason other than room, no room even with nothing else loaded)."""


@dataclass
class Timings:
    """What one call took, in seconds; `evicted` the models unloaded to make room."""

    unpack_s: float = 0.0
    unpacked: bool = False  # False: the cache already held it
    load_s: float = 0.0
    loaded: bool = False  # False: the server held it already
    evicted: list[str] = field(default_factory=list)
    invoke_s: float = 0.0
    reloads: int = 0  # invokes answered 404 and retried after a new load


def unpack(archive: Path, dest: Path) -> None:
    """Unpacks a tar.gz into dest (which must not exist), refusing anything that would
    land outside it: absolute names, `..`, links pointing out, devices (tarfile's
    "data" filter). Atomic: a failed or interrupted unpack leaves no dest."""
    dest = Path(dest)
    temp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
    try:
        with tarfile.open(archive, "r:*") as tar:
            try:
                tar.extractall(temp, filter="data")
            except tarfile.FilterError as e:
                raise DriverError(f"{archive}: refused to unpack: {e}") from None
        os.replace(temp, dest)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise


class LocalMultiModel:
    """SageMaker's side of a multi-model endpoint against one server: archives in
    `models_dir`, unpacked to `cache_dir`, loaded on use, least recently used unloaded
    on 507 (or past `max_models`). Thread-safe: loads and evictions take one lock,
    invokes run in parallel."""

    def __init__(self, models_dir: Path | str, url: str = DEFAULT_URL, cache_dir: Path | str | None = None,
                 max_models: int | None = None, timeout: float = 300, log=None, remember: bool = True):
        """log: a function taking one line of progress (None: quiet). remember: keep the
        order of use in the cache folder between runs."""
        self.models_dir = Path(models_dir).resolve()
        self.url = url.rstrip("/")
        self.cache_dir = Path(cache_dir or DEFAULT_CACHE).resolve()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.max_models = max_models
        self.timeout = timeout
        self.log = log or (lambda line: None)
        self._order_file = self.cache_dir / f"lru-{hashlib.sha256(self.url.encode()).hexdigest()[:12]}.json" \
            if remember else None
        self._lock = threading.RLock()
        self._http = threading.local()
        self.lru: OrderedDict[str, float] = OrderedDict()  # name -> last use, least recent first
        self.sync()

    # ------------------------------------------------------------ what there is

    def targets(self) -> list[str]:
        """The archives under models_dir, by name (their path under it), sorted."""
        found = []
        for path in self.models_dir.rglob("*" + ARCHIVE_SUFFIX):
            if path.is_file() and self.cache_dir not in path.resolve().parents:
                found.append(path.relative_to(self.models_dir).as_posix())
        return sorted(found)

    def archive(self, target: str) -> Path:
        path = (self.models_dir / target).resolve()
        if self.models_dir not in path.parents or not path.name.endswith(ARCHIVE_SUFFIX) or not path.is_file():
            raise DriverError(f"no model archive {target!r} under {self.models_dir} (its *{ARCHIVE_SUFFIX} files: "
                              f"{', '.join(self.targets()[:10]) or 'none'})")
        return path

    def sync(self) -> None:
        """Learn what the server holds now (GET /models, every page), in the order of use
        kept from earlier runs; a model this driver never used is the least recent."""
        held, token = [], None
        while True:
            params = {"limit": 1000, **({"next_page_token": token} if token else {})}
            r = self._session().get(self.url + "/models", params=params, timeout=30)
            _raise_for(r, "GET /models")
            page = r.json()
            held += [m["modelName"] for m in page.get("models", [])]
            token = page.get("nextPageToken") or page.get("next_page_token")
            if not token:
                break
        remembered = self._read_order()
        with self._lock:
            self.lru = OrderedDict(sorted(((name, remembered.get(name, 0.0)) for name in held),
                                          key=lambda item: item[1]))

    @property
    def loaded(self) -> list[str]:
        """The models loaded as this driver knows them, least recently used first."""
        with self._lock:
            return list(self.lru)

    # ------------------------------------------------------------ SageMaker's steps

    def prepare(self, target: str, timings: Timings | None = None) -> Path:
        """The target unpacked in the cache (unpacked now unless it is there already, from
        this very archive: a changed archive gets a folder of its own)."""
        timings = timings or Timings()
        archive = self.archive(target)
        stat = archive.stat()
        stamp = hashlib.sha256(f"{archive}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:16]
        dest = self.cache_dir / f"{_slug(target)}-{stamp}"
        if not dest.is_dir():
            started = time.perf_counter()
            try:
                unpack(archive, dest)
            except OSError as e:
                if not dest.is_dir():  # another driver may have unpacked it meanwhile
                    raise DriverError(f"{archive}: cannot unpack: {e}") from e
            timings.unpack_s = time.perf_counter() - started
            timings.unpacked = True
            self.log(f"unpack  {target}: {timings.unpack_s * 1000:.0f} ms -> {dest}")
        return dest

    def load(self, target: str, timings: Timings | None = None) -> Timings:
        """Loads the target unless the server holds it already, unloading the least
        recently used models while the server answers 507 (or while more than
        max_models would be loaded)."""
        timings = timings or Timings()
        with self._lock:
            if target in self.lru:
                self._touch(target)
                return timings
            folder = self.prepare(target, timings)
            started = time.perf_counter()
            if self.max_models is not None:
                while len(self.lru) >= self.max_models:
                    self._evict(target, timings, f"{self.max_models} models loaded (max_models)")
            while True:
                r = self._session().post(self.url + "/models", json={"model_name": target, "url": str(folder)},
                                         timeout=self.timeout)
                if r.status_code in (200, 409):  # 409: loaded already (by another driver, or before a restart)
                    break
                if r.status_code == 507:
                    if not any(name != target for name in self.lru):
                        raise DriverError(f"no room for {target!r} even with no other model loaded: "
                                          f"{_error(r)}")
                    self._evict(target, timings, "507 no room")
                    continue
                raise DriverError(f"POST /models {target!r}: {r.status_code} {_error(r)}")
            timings.load_s = time.perf_counter() - started
            timings.loaded = r.status_code == 200
            self._touch(target)
            if timings.loaded:
                self.log(f"load    {target}: {timings.load_s * 1000:.0f} ms"
                         + (f" (unloaded {', '.join(timings.evicted)} first)" if timings.evicted else ""))
            return timings

    def invoke(self, target: str, body: bytes, content_type: str = "application/json",
               accept: str | None = None) -> tuple[requests.Response, Timings]:
        """Loads the target if needed, then invokes it: (the answer, what each step took)."""
        timings = Timings()
        self.load(target, timings)
        headers = {"Content-Type": content_type, TARGET_MODEL_HEADER: target}
        if accept:
            headers["Accept"] = accept
        while True:
            started = time.perf_counter()
            r = self._session().post(f"{self.url}/models/{quote(target, safe='')}/invoke", data=body,
                                     headers=headers, timeout=self.timeout)
            timings.invoke_s = time.perf_counter() - started
            if r.status_code != 404 or timings.reloads:
                break
            # Not loaded after all (unloaded by someone else, or the server restarted): load it again.
            timings.reloads += 1
            with self._lock:
                self.lru.pop(target, None)
            self.log(f"invoke  {target}: 404, loading it again")
            self.load(target, timings)
        with self._lock:
            if target in self.lru:
                self._touch(target)
        self.log(f"invoke  {target}: {r.status_code} in {timings.invoke_s * 1000:.1f} ms")
        return r, timings

    def unload(self, target: str) -> bool:
        """DELETE /models/<name>: True if it was loaded."""
        with self._lock:
            r = self._session().delete(f"{self.url}/models/{quote(target, safe='')}", timeout=self.timeout)
            self.lru.pop(target, None)
            self._save_order()
            if r.status_code not in (200, 404):
                raise DriverError(f"DELETE /models/{target}: {r.status_code} {_error(r)}")
            return r.status_code == 200

    def unload_all(self) -> list[str]:
        self.sync()
        return [name for name in self.loaded if self.unload(name)]

    # ------------------------------------------------------------ helpers

    def _evict(self, target: str, timings: Timings, why: str) -> None:
        victim = next(name for name in self.lru if name != target)
        started = time.perf_counter()
        self.unload(victim)
        timings.evicted.append(victim)
        self.log(f"unload  {victim}: {(time.perf_counter() - started) * 1000:.0f} ms ({why}; least recently used)")

    def _touch(self, target: str) -> None:
        self.lru[target] = time.time()
        self.lru.move_to_end(target)
        self._save_order()

    def _read_order(self) -> dict[str, float]:
        if self._order_file is None:
            return {}
        try:
            value = json.loads(self._order_file.read_text())
            return {k: float(v) for k, v in value.items()} if isinstance(value, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save_order(self) -> None:
        if self._order_file is None:
            return
        temp = self._order_file.with_name(self._order_file.name + f".{os.getpid()}.tmp")
        temp.write_text(json.dumps(dict(self.lru)))
        os.replace(temp, self._order_file)

    def _session(self) -> requests.Session:
        session = getattr(self._http, "session", None)
        if session is None:
            session = self._http.session = requests.Session()
        return session


def _slug(target: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in target[: -len(ARCHIVE_SUFFIX)])[:80]


def _error(r: requests.Response) -> str:
    try:
        return str(r.json().get("error", r.text))
    except ValueError:
        return r.text[:500]


def _raise_for(r: requests.Response, what: str) -> None:
    if r.status_code == 404:
        raise DriverError(f"{what}: 404: is the server in multi-model mode (SAGEMAKER_MULTI_MODEL=true)?")
    if r.status_code != 200:
        raise DriverError(f"{what}: {r.status_code} {_error(r)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m local_test.multi_model",
        description="Play SageMaker's part of a multi-model endpoint: unpack, load (unloading the least "
                    "recently used model on 507), invoke.")
    parser.add_argument("models_dir", type=Path, help="folder of model archives (*.tar.gz, in subfolders too)")
    parser.add_argument("--target", "-t", help="the archive to invoke, by its path under models_dir "
                                                "(SageMaker's TargetModel), e.g. model.tar.gz")
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the server (default {DEFAULT_URL})")
    parser.add_argument("--body", "-b", default="-", help="file holding the request body; - (default): stdin")
    parser.add_argument("--content-type", "-c", default="application/json", help="default application/json")
    parser.add_argument("--accept", "-a", help="the Accept header (default: none, the server's default)")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE,
                        help=f"where archives are unpacked (default {DEFAULT_CACHE.relative_to(ROOT)})")
    parser.add_argument("--max-models", type=int, help="at most this many models loaded (unload the least "
                                                       "recently used past it); default: as the server's room allows")
    parser.add_argument("--load-only", action="store_true", help="load the target, do not invoke it")
    parser.add_argument("--list", action="store_true", help="list the archives and what the server holds, then exit")
    parser.add_argument("--unload-all", action="store_true", help="unload every model the server holds, then exit")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        mme = LocalMultiModel(args.models_dir, args.url, args.cache_dir, args.max_models,
                              log=None if args.quiet else progress)
        if args.list:
            loaded = set(mme.loaded)
            for target in mme.targets():
                print(f"{'loaded ' if target in loaded else '       '} {target}")
            for name in mme.loaded:
                if name not in mme.targets():
                    print(f"loaded  {name} (not in {args.models_dir})")
            return 0
        if args.unload_all:
            for name in mme.unload_all():
                progress(f"unload  {name}")
            return 0
        if not args.target:
            parser.error("--target is required (or --list / --unload-all)")
        if args.load_only:
            t = mme.load(args.target)
            progress(f"total   unpack {t.unpack_s * 1000:.0f} ms, load {t.load_s * 1000:.0f} ms")
            return 0
        body = sys.stdin.buffer.read() if args.body == "-" else Path(args.body).read_bytes()
        answer, t = mme.invoke(args.target, body, args.content_type, args.accept)
    except (DriverError, requests.RequestException, OSError) as e:
        print(f"multi_model: {e}", file=sys.stderr)
        return 2
    sys.stdout.buffer.write(answer.content)
    if answer.content and not answer.content.endswith(b"\n"):
        sys.stdout.buffer.write(b"\n")
    sys.stdout.flush()
    if not args.quiet:
        progress(f"total   unpack {t.unpack_s * 1000:.0f} ms{'' if t.unpacked else ' (cached)'}, "
                 f"load {t.load_s * 1000:.0f} ms{'' if t.loaded else ' (loaded already)'}, "
                 f"invoke {t.invoke_s * 1000:.1f} ms -> {answer.status_code}")
    return 0 if answer.status_code < 400 else 1


if __name__ == "__main__":
    sys.exit(main())

"""The models of a multi-model endpoint, as every worker sees them: files in a folder.

Each gunicorn worker is its own process with its own copy of each model (its own
inference thread and device), and SageMaker's model API reaches whichever worker its
connection lands on. So what is loaded is not one worker's memory but this folder
(`serve` makes it for the workers: SMSERVE_STATE_DIR/models):

- `<key>.model`: one per model name: its name, folder, generation and state
  (loading -> ready -> unloading). Created exclusively, so two loads of one name
  cannot both win.
- `<key>.<generation>.w<N>`: worker N holds it: loading it (`{"loading": true}`), or
  loaded (with what that took, or why it failed). Removed when worker N has let it go.

Every worker follows the folder (engine/multimodel/server.py); the worker that took the API
call answers only once every worker has acted, so a 200 means the same everywhere. An
unloading model is forgotten by whoever sees the last worker let it go (release): the
caller, or, when the caller gave up waiting, that last worker.
Writes are a temporary file renamed into place: a reader never sees half a file. A
state change is a compare-and-set under the folder's lock file (flock): it applies only
to the generation it names, in a state it allows, so an unload racing a load or
another unload can neither overwrite a newer generation nor revive a removed one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass

from smserve import files
from smserve.errors import BadRequest, Conflict

LOADING, READY, UNLOADING = "loading", "ready", "unloading"
# A model name is what SageMaker can send. POST /models's model_name is SageMaker's own
# key for a model, documented as opaque and not bounded; the one bound SageMaker states
# is its source's, InvokeEndpoint's TargetModel: 1 to 1,024 characters of
# `\A\S[\p{Print}]*\z` (botocore's sagemaker-runtime model), read here as printable
# ASCII, the first not a space. A longer name could never be addressed again (its path
# past the request line's limit: gunicorn_conf.limit_request_line), and each name labels
# a model's /metrics series: this bounds what they cost.
MAX_NAME_CHARS = 1024
_NAME = re.compile(rf"[!-~][ -~]{{0,{MAX_NAME_CHARS - 1}}}")
# Longer than a file-time tick (jiffies: up to 10 ms), with room to spare.
_TICK_NS = 50_000_000


@dataclass(frozen=True)
class Entry:
    name: str
    url: str
    generation: str
    state: str

    @property
    def key(self) -> str:
        return key(self.name)


def check_name(name: str) -> None:
    """A 400 for a name SageMaker could not send (MAX_NAME_CHARS)."""
    if not _NAME.fullmatch(name):
        shown = repr(name[:80]) + (f"... ({len(name)} characters)" if len(name) > 80 else "")
        raise BadRequest(f"model_name must be 1 to {MAX_NAME_CHARS} characters of printable ASCII, the first not "
                         f"a space, as SageMaker's TargetModel is; got {shown}")


def key(name: str) -> str:
    """A file name for any model name (SageMaker's names may hold '/' and dots)."""
    return hashlib.sha256(name.encode()).hexdigest()[:32]


class SharedRegistry:
    def __init__(self, root: str):
        self.root = root
        os.makedirs(root, exist_ok=True)

    def version(self) -> int | None:
        """A mark that changes whenever a file is added, replaced or removed here (the
        folder's mtime), or None while a change may still be hidden: file times tick
        coarsely (a few ms), so a change made in the same tick as the last look would
        leave the mtime as it was. A follower skips reading the folder while the mark it
        last read is the one it gets again."""
        mtime = os.stat(self.root).st_mtime_ns
        return mtime if time.time_ns() - mtime > _TICK_NS else None

    def claim(self, name: str, url: str) -> Entry:
        """Register a new model, loading; 409 if the name is taken (loaded, or loading now)."""
        entry = Entry(name, url, uuid.uuid4().hex[:12], LOADING)
        temp = self._write_temp(asdict(entry))
        try:
            os.link(temp, self._model_path(entry.name))  # fails if the name exists: the exclusive part
        except FileExistsError:
            raise Conflict(f"Model {name!r} is already loaded") from None
        finally:
            os.unlink(temp)
        return entry

    def get(self, name: str) -> Entry | None:
        return self._read_entry(self._model_path(name))

    def entries(self) -> list[Entry]:
        found = []
        with os.scandir(self.root) as names:
            for item in names:
                if item.name.endswith(".model"):
                    entry = self._read_entry(item.path)
                    if entry is not None:
                        found.append(entry)
        return found

    def set_state(self, entry: Entry, state: str, only_from: tuple[str, ...]) -> Entry | None:
        """Move this generation to `state` if it is still registered in one of
        `only_from`; None (nothing written) otherwise."""
        with self._locked():
            current = self.get(entry.name)
            if current is None or current.generation != entry.generation or current.state not in only_from:
                return None
            changed = Entry(entry.name, entry.url, entry.generation, state)
            os.replace(self._write_temp(asdict(changed)), self._model_path(entry.name))
            return changed

    def remove(self, entry: Entry) -> None:
        """Forget the model (every worker has unloaded it), if this generation is still the one registered."""
        with self._locked():
            current = self.get(entry.name)
            if current is not None and current.generation == entry.generation:
                files.remove(self._model_path(entry.name))
        for worker in self.acks(entry):
            files.remove(self._ack_path(entry, worker))

    def release(self, entry: Entry) -> bool:
        """Forget this generation once it is unloading and no worker holds it; True when
        it is gone (now or before), False while a worker still holds it."""
        with self._locked():
            current = self.get(entry.name)
            if current is None or current.generation != entry.generation:
                return True
            if current.state != UNLOADING or self.acks(entry):
                return False
            files.remove(self._model_path(entry.name))
            return True

    def ack(self, entry: Entry, worker: int, outcome: dict) -> None:
        os.replace(self._write_temp(outcome), self._ack_path(entry, worker))

    def unack(self, entry: Entry, worker: int) -> None:
        files.remove(self._ack_path(entry, worker))

    def forget_worker(self, worker: int) -> None:
        """A worker (re)starts holding nothing: what its predecessor had done is void."""
        suffix = f".w{worker}"
        with os.scandir(self.root) as names:
            for item in names:
                if item.name.endswith(suffix) and not item.name.endswith(".model"):
                    files.remove(item.path)

    def acks(self, entry: Entry) -> dict[int, dict]:
        prefix = f"{entry.key}.{entry.generation}.w"
        found = {}
        with os.scandir(self.root) as names:
            for item in names:
                if item.name.startswith(prefix):
                    outcome = _read_json(item.path)
                    if outcome is not None:
                        found[int(item.name[len(prefix):])] = outcome
        return found

    def all_acks(self) -> dict[tuple[str, str], dict[int, dict]]:
        """(key, generation) -> worker -> outcome, for every model: one pass over the folder."""
        found: dict[tuple[str, str], dict[int, dict]] = {}
        with os.scandir(self.root) as names:
            for item in names:
                parts = item.name.split(".")
                if len(parts) == 3 and parts[2].startswith("w") and parts[2][1:].isdigit():
                    outcome = _read_json(item.path)
                    if outcome is not None:
                        found.setdefault((parts[0], parts[1]), {})[int(parts[2][1:])] = outcome
        return found

    def read_value(self, name: str) -> dict | None:
        return _read_json(os.path.join(self.root, name))

    def write_value_once(self, name: str, value: dict) -> dict:
        """Store value under name unless a value is there already; the stored one."""
        temp = self._write_temp(value)
        try:
            os.link(temp, os.path.join(self.root, name))
        except FileExistsError:
            pass
        finally:
            os.unlink(temp)
        return self.read_value(name) or value

    @contextlib.contextmanager
    def _locked(self):
        """The folder's lock, across the workers: held for one read and one rename."""
        fd = os.open(os.path.join(self.root, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _model_path(self, name: str) -> str:
        return os.path.join(self.root, key(name) + ".model")

    def _ack_path(self, entry: Entry, worker: int) -> str:
        return os.path.join(self.root, f"{entry.key}.{entry.generation}.w{worker}")

    def _read_entry(self, path: str) -> Entry | None:
        value = _read_json(path)
        return None if value is None else Entry(**value)

    def _write_temp(self, value: dict) -> str:
        fd, temp = tempfile.mkstemp(dir=self.root, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump(value, f)
        return temp


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None

"""Whether a model may come into a multi-model endpoint: its folder (under the models
root, holding a model), a warning for a load that stalls every worker, and room.

Room: each worker measures what a model's load added to its resident memory (and to
each GPU's allocated memory); the sum over models and workers may not pass the room,
SMSERVE_MODELS_MEMORY_MB or, unset, ROOM_SHARE of what the container's memory limit
(cgroup, else the host's memory) left free when the first model came. A load past it
is undone and answered 507; a room already full refuses before anything loads.
"""

from __future__ import annotations

import logging
import os

from smserve.toolkit import CODE_DIR, DEFAULT_PROGRAM, LONE_SUFFIXES
from smserve.engine.model.artifacts import EXPORTED, TORCHSCRIPT
from smserve.engine.multimodel.registry import SharedRegistry
from smserve.engine.runtime import memory
from smserve.errors import BadRequest, InsufficientStorage, NotFound

log = logging.getLogger(__name__)

ROOM_FILE = "room.json"
ROOM_SHARE = 0.9  # of the memory left free when the first model came
MODEL_FILES = (EXPORTED, TORCHSCRIPT)
# A TorchScript model this big stalls every worker noticeably while it loads.
BIG_TORCHSCRIPT_BYTES = 256 * 1024 * 1024
# How long torch.jit.load holds the GIL per GB of weights, as the warning tells it.
TORCHSCRIPT_GIL_S_PER_GB = 0.7


class Room:
    """The memory the models may hold, and what they hold, over every worker."""

    def __init__(self, shared: SharedRegistry, models_memory_mb: int | None):
        self.shared = shared
        self.models_memory_mb = models_memory_mb

    def used(self) -> dict[str, int]:
        """kind ("host", "cuda:N") -> bytes the loaded models' loads added, summed."""
        used: dict[str, int] = {}
        for outcomes in self.shared.all_acks().values():
            for outcome in outcomes.values():
                for kind, size in outcome.get("footprint", {}).items():
                    used[kind] = used.get(kind, 0) + size
        return used

    def limits(self) -> dict[str, int]:
        """kind ("host", "cuda:N") -> bytes the models may hold, fixed at the first load."""
        if self.models_memory_mb:
            return {"host": self.models_memory_mb * memory.MB}
        stored = self.shared.read_value(ROOM_FILE)
        if stored is not None:
            return stored
        room = {"host": int(max(0, memory.container_limit() - memory.container_usage()) * ROOM_SHARE)}
        for device, free in memory.gpu_room().items():
            room[f"cuda:{device}"] = int(free * ROOM_SHARE)
        return self.shared.write_value_once(ROOM_FILE, room)

    def check_before(self) -> None:
        """A room already full refuses at once, before anything is loaded."""
        used, room = self.used(), self.limits()
        if any(used.get(kind, 0) >= limit for kind, limit in room.items()):
            raise InsufficientStorage("no room for another model: the loaded ones fill the room "
                                      f"({room['host'] / memory.MB:.0f} MB of host memory); unload one first")

    def check_after(self, name: str) -> None:
        """507 when the model just loaded everywhere took the models past the room."""
        used, room = self.used(), self.limits()
        over = [kind for kind, limit in room.items() if used.get(kind, 0) > limit]
        if over:
            raise InsufficientStorage(
                f"no room for model {name!r}: with it the models would hold "
                + ", ".join(f"{used[k] / memory.MB:.0f} MB of {k} memory (room: {room[k] / memory.MB:.0f} MB)"
                            for k in over)
                + "; unload a model, or set SMSERVE_MODELS_MEMORY_MB")


def memory_now() -> tuple[int, dict[int, int]]:
    """This worker's resident memory and each GPU's allocated memory, before a load."""
    return memory.rss_bytes(), memory.gpu_allocated()


def footprint(before: tuple[int, dict[int, int]]) -> dict[str, int]:
    """What a load added since memory_now() was `before`: kind -> bytes."""
    host, gpus = before
    added = {"host": max(0, memory.rss_bytes() - host)}
    for device, used in memory.gpu_allocated().items():
        added[f"cuda:{device}"] = max(0, used - gpus.get(device, 0))
    return added


def check_model_folder(url: str, root: str, program: str = DEFAULT_PROGRAM) -> None:
    """The folder must be under the models root (SMSERVE_MODELS_ROOT): loading a model
    runs its code/inference.py, so the container trusts whoever may call POST /models
    (SageMaker, which copies models there) only as far as that folder. The path is
    checked as written, '..' resolved, symbolic links not: what lies under the root,
    links included, is SageMaker's to place."""
    if not isinstance(url, str) or not url:
        raise BadRequest("'url' must be the model's folder")
    path, root = os.path.normpath(url), os.path.normpath(root)
    if not os.path.isabs(url) or not (root == os.sep or path == root or path.startswith(root + os.sep)):
        raise BadRequest(f"{url[:200]!r} is not a folder under {root}: models are loaded from there only "
                         "(SMSERVE_MODELS_ROOT)")
    if not os.path.isdir(url):
        # 404, as the toolkit's model server answers it (the url names nothing there).
        raise NotFound(f"no model folder at {url}")
    if not any(os.path.isfile(os.path.join(url, f)) for f in MODEL_FILES) \
            and not any(f.endswith(LONE_SUFFIXES) for f in os.listdir(url)) \
            and not os.path.isfile(os.path.join(url, CODE_DIR, program)):
        raise BadRequest(f"{url} holds no model: expected {' or '.join(MODEL_FILES)} (or one *.pt/*.pth TorchScript "
                         f"file), or {CODE_DIR}/{program} with a model_fn")


def warn_of_a_big_torchscript(name: str, url: str) -> None:
    """torch.jit.load reads a TorchScript model's weights holding the GIL, and every
    worker answers nothing meanwhile, /ping included; a torch.export model's are read
    with it released (engine/model/weights.py)."""
    path = os.path.join(url, TORCHSCRIPT)
    if os.path.isfile(os.path.join(url, EXPORTED)) or not os.path.isfile(path):
        return
    size = os.path.getsize(path)
    if size >= BIG_TORCHSCRIPT_BYTES:
        log.warning("multi-model: %r is a %.0f MB TorchScript model: torch.jit.load holds the GIL while it reads "
                    "the weights, and each worker answers nothing (/ping included) for that long, about %.1f s "
                    "per GB; save it with torch.export (%s), whose weights load with the GIL released",
                    name, size / memory.MB, TORCHSCRIPT_GIL_S_PER_GB, EXPORTED)

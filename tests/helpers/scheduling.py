"""How `make test` hands tests to its pytest-xdist processes (`--dist loadscope`).

A whole module to one process: its shared servers (module-scoped fixtures) then start
once, not once in each process that runs some of its tests. The image's tests
(tests/container) go as one unit: they share one build, which the first of them makes,
and three processes each waiting on that build would leave the cores idle. Modules go
out in the order pytest collects them, not most tests first (xdist's default): the
costly modules are the integration ones with few tests each, and the many small unit
modules are what best fills the end of a run.

The tests marked `serial` time the server, so they run last and alone: one process
keeps them until every other process has ended, then runs them one after another. The
controller never sees a test's marks, only its id, so each process, once it has
collected, writes the ids of the serial ones to a folder the controller named as it
started the processes (`hand_over_serial_ids`, `write_serial_ids`), and the scheduler
reads them before it hands anything out.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from xdist.scheduler import LoadScopeScheduling

CONTAINER_TESTS = "tests/container/"
SERIAL = "serial"  # the unit of the serial tests, wherever they live
SERIAL_IDS_DIR = "serial_ids_dir"  # the key of workerinput that names the folder
SERIAL_IDS_FOLDER = pytest.StashKey[str]()  # in the controller's config


class ModuleScheduling(LoadScopeScheduling):
    def __init__(self, config, log=None):
        config.option.loadscopereorder = False
        super().__init__(config, log)
        self.serial: frozenset[str] | None = None  # read once every process has collected
        self.keeper = None  # the process that runs the serial tests

    def schedule(self) -> None:
        if self.serial is None:
            folder = self.config.stash.get(SERIAL_IDS_FOLDER, None)
            self.serial = read_serial_ids(folder) if folder else frozenset()
        super().schedule()

    def _split_scope(self, nodeid: str) -> str:
        if self.serial and nodeid in self.serial:
            return SERIAL
        if nodeid.startswith(CONTAINER_TESTS):
            return CONTAINER_TESTS
        return nodeid.split("::", 1)[0]

    def _assign_work_unit(self, node) -> None:
        # A crashed process's units come back whole, those it had finished too.
        for scope in [scope for scope, unit in self.workqueue.items() if all(unit.values())]:
            del self.workqueue[scope]
        if not self.workqueue:
            node.shutdown()
        elif SERIAL not in self.workqueue:
            super()._assign_work_unit(node)
        elif len(self.workqueue) > 1:
            self.workqueue.move_to_end(SERIAL)  # every other unit first
            super()._assign_work_unit(node)
        else:
            # Only the serial tests are left: the first process to ask keeps them, the
            # others end once they have run what they hold.
            if self.keeper is None:
                self.keeper = node
            elif node is not self.keeper:
                node.shutdown()
            self._release_serial()

    def remove_node(self, node):
        if node is self.keeper:
            self.keeper = None  # (a crash): another process keeps them
        crashed = super().remove_node(node)
        self._release_serial()
        return crashed

    def _release_serial(self) -> None:
        """The serial tests to their keeper once it is the only process left."""
        if self.keeper is not None and self.nodes == [self.keeper] and list(self.workqueue) == [SERIAL]:
            super()._assign_work_unit(self.keeper)


def hand_over_serial_ids(node) -> None:
    """Controller side (pytest_configure_node, before the scheduler exists): tell a
    process where to write its ids."""
    config = node.config
    if config.getvalue("dist") != "loadscope":
        return
    if SERIAL_IDS_FOLDER not in config.stash:
        folder = config.stash[SERIAL_IDS_FOLDER] = tempfile.mkdtemp(prefix="pytest-serial-ids-")
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))  # (a run that ends early)
    node.workerinput[SERIAL_IDS_DIR] = config.stash[SERIAL_IDS_FOLDER]


def write_serial_ids(config, items) -> None:
    """Process side (pytest_collection_modifyitems): the ids of the serial tests."""
    folder = getattr(config, "workerinput", {}).get(SERIAL_IDS_DIR)
    if folder is None:
        return
    ids = "".join(f"{item.nodeid}\n" for item in items if item.get_closest_marker("serial"))
    path = os.path.join(folder, config.workerinput["workerid"])
    with open(path + ".partial", "w") as f:
        f.write(ids)
    os.replace(path + ".partial", path)


def read_serial_ids(folder: str) -> frozenset[str]:
    """Every process collected the same tests (xdist checks that), so their files agree."""
    ids: set[str] = set()
    for name in os.listdir(folder):
        if not name.endswith(".partial"):
            with open(os.path.join(folder, name)) as f:
                ids.update(line for line in f.read().splitlines() if line)
    return frozenset(ids)

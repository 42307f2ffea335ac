"""How `make test` hands tests to its pytest-xdist processes (`--dist loadscope`).

A whole module to one process: its shared servers (module-scoped fixtures) then start
once, not once in each process that runs some of its tests. The image's tests
(tests/container) go as one unit: they share one build, which the first of them makes,
and three processes each waiting on that build would leave the cores idle. Modules go
out in the order pytest collects them, not most tests first (xdist's default): the
costly modules are the integration ones with few tests each, and the many small unit
modules are what best fills the end of a run.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

CONTAINER_TESTS = "tests/container/"


class ModuleScheduling(LoadScopeScheduling):
    def __init__(self, config, log=None):
        config.option.loadscopereorder = False
        super().__init__(config, log)

    def _split_scope(self, nodeid: str) -> str:
        if nodeid.startswith(CONTAINER_TESTS):
            return CONTAINER_TESTS
        return nodeid.split("::", 1)[0]

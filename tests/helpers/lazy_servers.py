"""Servers a test module shares, each started the first time one of its tests asks for it.

A module fixture that starts all of a module's servers at once starts every one of them
even where the tests that run use only some: a `-k` selection, or pytest-xdist spreading
the module's tests over its processes (`--dist load`; `make test` hands out whole
modules). Each costs its workers' start (torch's import, seconds of CPU). LazyServers
starts a server when a test first asks for it, and stops those it started when the
module is done.
"""

from __future__ import annotations

from typing import Any, Callable

from tests.helpers.server import ServerProcess


class LazyServers:
    """servers[name]: the server makers[name]() made (a started, ready server), made the
    first time a test asks for that name; values[name] as it is, for the names of things
    that are not servers (a models folder, say). stop() stops every server made."""

    def __init__(self, makers: dict[str, Callable[[], ServerProcess]], **values: Any):
        self._makers, self._values = makers, values
        self._made: dict[str, ServerProcess] = {}

    def __getitem__(self, name: str) -> Any:
        if name in self._values:
            return self._values[name]
        if name not in self._made:
            self._made[name] = self._makers[name]()
        return self._made[name]

    def stop(self) -> None:
        for server in self._made.values():
            server.terminate()


def started(server: ServerProcess, then: Callable[[ServerProcess], None] | None = None) -> ServerProcess:
    """The server, started and ready, and then(server) done (loading its models, say); if
    anything fails on the way, it is stopped before the error propagates."""
    server.start()
    try:
        if then is not None:
            then(server)
    except BaseException:
        server.terminate(timeout=10)
        raise
    return server

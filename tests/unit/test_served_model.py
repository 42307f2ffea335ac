"""ModelServer is the worker's served model: lifecycle plus infer, under fifteen public
methods, and what routes, protocols and streaming ask of it is the typed Protocol
engine/worker/served.py states (they name no concrete server class)."""

from __future__ import annotations

import ast
import inspect
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from smserve.engine.multimodel.server import MultiModelServer
from smserve.engine.runtime.threads import Slots
from smserve.engine.worker.served import ServedModel, Serving
from smserve.engine.worker.server import ModelServer
from smserve.settings import Settings
from smserve.streaming.handlers import open_session
from smserve.streaming.session import CloseReason, Closing, SessionContext

PACKAGE = Path(__file__).resolve().parents[2] / "container" / "smserve"
MOST_PUBLIC_METHODS = 15


def public_methods(cls) -> list[str]:
    """Methods and properties the class itself defines whose names are public."""
    return sorted(name for name, value in vars(cls).items()
                  if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)))


def members(protocol) -> set[str]:
    """The Protocol's attributes and methods, its bases' included."""
    found: set[str] = set()
    for cls in protocol.__mro__:
        if cls.__module__ != protocol.__module__:
            continue
        found.update(getattr(cls, "__annotations__", {}))
        found.update(name for name, value in vars(cls).items()
                     if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)))
    return found


def missing(instance, protocol) -> list[str]:
    """The Protocol's members the instance lacks (looked up without running a property,
    as a not-ready server's metadata raises)."""
    return sorted(name for name in members(protocol)
                  if name not in vars(instance) and not any(name in vars(cls) for cls in type(instance).__mro__))


def test_model_server_has_fewer_than_fifteen_public_methods():
    methods = public_methods(ModelServer)
    assert len(methods) < MOST_PUBLIC_METHODS, methods


def test_model_server_satisfies_the_served_model_protocol():
    server = ModelServer(Settings(), workers=1)
    assert missing(server, ServedModel) == []
    assert "infer" in members(ServedModel) and "settings" in members(ServedModel)  # (the walk finds members)


def test_a_multi_model_server_is_what_a_worker_serves(tmp_path):
    server = MultiModelServer(Settings(), workers=1, state_dir=str(tmp_path))
    assert missing(server, Serving) == []
    assert isinstance(server, Serving)


def test_routes_protocols_and_streaming_name_no_concrete_server():
    """They annotate with the Protocols; only routes/app.py, which builds the server, names one."""
    for folder in ("routes", "protocols", "streaming"):
        for path in (PACKAGE / folder).glob("*.py"):
            if path.name == "app.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module in ("smserve.engine.worker.server",
                                                                        "smserve.engine.multimodel.server"):
                    raise AssertionError(f"{folder}/{path.name} imports {node.module}")


def test_v2_infer_and_invocations_take_one_data_plane(tmp_path):
    """/v2/models/<m>/infer takes the path /invocations takes (the body inflated within
    the worker's ledger, the answer's deadline): one DataPlane, the worker's."""
    from smserve.routes import endpoints

    for multi in (False, True):
        settings = Settings(multi_model=multi)
        server = (MultiModelServer(settings, workers=1, state_dir=str(tmp_path)) if multi
                  else ModelServer(settings, workers=1))
        table = endpoints.build(server, settings)
        planes = {route.pattern: route.handler.__self__.plane for route in table.routes
                  if route.pattern.endswith(("/invocations", "/infer", "/invoke"))}
        assert len(planes) == (4 if multi else 3), planes
        assert len({id(plane) for plane in planes.values()}) == 1, planes


def test_stream_fn_sessions_past_the_cap_are_told_to_come_back_and_a_closed_one_frees_its_slot():
    """The served model's stream_sessions bound the worker's stream_fn sessions
    (SMSERVE_MAX_SESSIONS): past it a new one closes with 1013; one released, one opens."""
    settings = Settings(max_sessions=1)
    hooks = SimpleNamespace(stream_fn=lambda messages, model, context: iter(()))
    server = SimpleNamespace(check_ready=lambda: None, model=SimpleNamespace(hooks=hooks, model=None),
                             stream_sessions=Slots(settings.max_sessions), hook_contexts=lambda context: context,
                             model_lock=threading.Lock())
    first = open_session(server, settings, SessionContext({}))
    with pytest.raises(Closing) as refused:
        open_session(server, settings, SessionContext({}))
    assert refused.value.code == CloseReason.TRY_AGAIN_LATER and "SMSERVE_MAX_SESSIONS" in refused.value.reason
    first.release()
    open_session(server, settings, SessionContext({})).release()
    assert server.stream_sessions.held == 0

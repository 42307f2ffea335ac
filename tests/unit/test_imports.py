"""The server package's modules import one another without a cycle, and only downwards:
each layer (a folder, or one of engine/'s concept packages) from itself or the layers
below it (docs/architecture.md). Imports made inside functions count too: such an import
only hides a cycle or an upward arrow until the function first runs."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "container" / "smserve"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules this one imports, wherever in it the import is. `from
    package import submodule` is an import of the submodule, not of the package's face."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in modules else base)
    return (found & modules.keys()) - {name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_module_of_the_server_imports_itself_back():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert "smserve.routes.endpoints" in graph["smserve.routes.app"]  # (the walk finds imports)
    assert _cycles(graph) == []


# Each layer's rank: a module may import its own layer's modules and those of lower ranks.
# Layers of one rank do not import each other (settings, logs and metrics are the base
# modules; routes and streaming sit side by side).
LAYERS = {
    "errors": 0, "files": 0, "memo": 0, "": 0,
    "core": 1,
    "settings": 2, "variables": 2, "toolkit": 2, "logs": 2, "metrics": 2,
    "codecs": 3,
    "engine": 4, "engine.runtime": 4,
    "engine.model": 5,
    "engine.batching": 6,
    "engine.hooks": 7,
    "engine.sessions": 8,
    "engine.worker": 9,
    "engine.multimodel": 10,
    "protocols": 11,
    "routes": 12, "streaming": 12,
    "http": 13,
}


def _layer(module: str) -> str:
    parts = module.split(".")[1:]
    if parts[:1] == ["engine"]:
        return ".".join(parts[:2])
    return parts[0] if parts else ""


_BASE = {"", "errors", "files", "memo", "settings", "logs", "metrics"}


def _upward(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        here = _layer(module)
        for target in sorted(targets):
            there = _layer(target)
            beside = LAYERS[there] == LAYERS[here] and there != here and here not in _BASE
            apart = here.startswith("engine") and there == "codecs"  # the engine works on arrays, never bytes
            if LAYERS[there] > LAYERS[here] or beside or apart:
                found.append(f"{module} ({here}) imports {target} ({there})")
    return found


# A module longer than this holds more than one idea (issue 46): split it by concept.
MOST_LINES = 400


def test_no_module_is_longer_than_a_reader_holds_at_once():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MOST_LINES}
    assert long == {}


def test_every_module_sits_in_a_layer_with_a_docstring_that_says_what_it_holds():
    modules = _modules()
    layers = {_layer(name) for name in modules}
    assert layers == LAYERS.keys(), "a new folder needs its rank in LAYERS"
    for name, path in modules.items():
        if path.name == "__init__.py" and name.count(".") >= 1:
            doc = ast.get_docstring(ast.parse(path.read_text()))
            assert doc and "import" in doc, f"{name}'s __init__ says what it holds and what it may import"


def test_imports_go_only_downwards():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert "smserve.engine.runtime.main_lane" in graph["smserve.engine.batching.runner"]  # (the walk finds imports)
    assert _upward(graph) == []


def test_an_upward_import_is_found():
    graph = {"smserve.engine.batching.runner": {"smserve.engine.hooks.script"},
             "smserve.routes.app": {"smserve.streaming.session"},
             "smserve.engine.worker.server": {"smserve.codecs.simple"}}
    assert len(_upward(graph)) == 3


def test_the_metrics_face_hands_on_what_callers_use():
    from smserve import metrics
    from smserve.metrics import recording, tally

    for name in ("enable", "enabled", "families", "registry", "request", "model", "forget_model", "ModelStats",
                 "websocket_session", "websocket_message", "stream_started", "stream_chunk"):
        assert getattr(metrics, name) is getattr(recording, name)
    assert metrics.flush is tally.flush

"""Fixtures shared by every test folder: the example model and real server processes."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The suite runs more processes than the machine has cores (pytest-xdist's, the servers
# they start): an OpenMP thread that spins while it waits for work burns the core another
# process needs (training the digits model took 13 times the CPU so on a busy machine).
# Set before torch loads, and inherited by every process the tests start; thread counts
# stay as they are.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from tests.helpers.server import EXAMPLE_MODEL, ROOT, ServerProcess, copy_model
from tests.helpers.models import ECHO_HOOKS, IMAGE_TEST_SIZE, model_dir_with
from tests.helpers import fork_server

# Test servers fork from a process that imported torch once (tests/helpers/fork_server.py
# says when one starts as a new interpreter instead); TEST_FORK_SERVER=0: each does.
if os.environ.get(fork_server.DISABLE) != "0":
    ServerProcess.forker = fork_server.ForkServer(os.environ).start


@pytest.hookimpl(optionalhook=True)  # (pytest -p no:xdist has no such hook)
def pytest_xdist_make_scheduler(config, log):
    """`make test`'s --dist loadscope: whole modules, the image's tests as one unit, the
    serial ones last and alone (tests/helpers/scheduling.py)."""
    if config.getvalue("dist") == "loadscope":
        from tests.helpers.scheduling import ModuleScheduling

        return ModuleScheduling(config, log)
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    from tests.helpers.scheduling import hand_over_serial_ids

    hand_over_serial_ids(node)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    from tests.helpers.scheduling import write_serial_ids

    write_serial_ids(config, items)


@pytest.fixture(autouse=True)
def _sys_path_restored():
    """Scripts loaded in the test process put their code/ folders on sys.path: each test
    starts from the path it found, so that one test's code/json.py is no other's json."""
    saved = list(sys.path)
    yield
    sys.path[:] = saved


@pytest.fixture(scope="session")
def example_model_dir() -> Path:
    if not (EXAMPLE_MODEL / "metadata.json").exists():
        # `make test` builds it first; a bare `pytest` builds it here.
        subprocess.run([sys.executable, "-m", "model.train", "--out", str(EXAMPLE_MODEL.parent)], cwd=ROOT, check=True)
    return EXAMPLE_MODEL


TEXTGEN_BUILT = ROOT / "build" / "textgen"
TEXTGEN_SOURCE = ROOT / "model" / "textgen" / "inference.py"
TEXTGEN_FILES = ["code/inference.py", "config.json", "metrics.json", "vocab.json", "weights.pt"]


@pytest.fixture(scope="session")
def textgen_dir(tmp_path_factory) -> Path:
    """build/textgen when `make model-textgen` made it from today's hooks; else trained here."""
    if all((TEXTGEN_BUILT / f).exists() for f in TEXTGEN_FILES) and (TEXTGEN_BUILT / "code/inference.py").read_bytes() == TEXTGEN_SOURCE.read_bytes():
        return TEXTGEN_BUILT
    out = tmp_path_factory.mktemp("textgen-build")
    result = subprocess.run([sys.executable, "-m", "model.textgen.train", "--out", str(out)], cwd=ROOT,
                            capture_output=True, text=True, check=True, timeout=300)
    assert "held-out perplexity" in result.stdout and "train loss" in result.stdout
    return out / "textgen"


@pytest.fixture(scope="session")
def textgen_hooks(textgen_dir):
    """textgen's packaged code/inference.py, loaded by path as the server loads it."""
    spec = importlib.util.spec_from_file_location("textgen_packaged_inference", textgen_dir / "code" / "inference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def image_model_dir(tmp_path_factory) -> Path:
    """The image example, at IMAGE_TEST_SIZE pixels."""
    from model.image.build import build

    return Path(build(str(tmp_path_factory.mktemp("image-build")), size=IMAGE_TEST_SIZE))


@pytest.fixture(scope="session")
def digits():
    """The held-out split the example model was scored on: (x_test, y_test)."""
    from model.train import load_split

    _, x_test, _, y_test = load_split()
    return x_test, y_test


@pytest.fixture(params=["forked", "new interpreter"])
def started_how(request, monkeypatch) -> str:
    """The test runs twice: its servers forked by the fork server, then each started as a
    new interpreter (as benchmarks and compat-check start theirs)."""
    if request.param == "new interpreter":
        monkeypatch.setattr(ServerProcess, "forker", None)
    elif ServerProcess.forker is None:
        pytest.skip(f"{fork_server.DISABLE}=0: no fork server")
    return request.param


@pytest.fixture
def make_server(tmp_path):
    """Start real servers with a model dir and extra environment; stopped after the test."""
    started: list[ServerProcess] = []

    def make(model_dir, env: dict[str, str] | None = None, wait: bool = True) -> ServerProcess:
        server = ServerProcess(model_dir, env, log_path=tmp_path / f"server-{len(started)}.log")
        started.append(server)
        return server.start(wait=wait)

    yield make
    for server in started:
        server.terminate()


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory):
    """shared_server(model_dir, env=None) -> a running server for that model folder and
    environment, started the first time a test asks for it and kept for the session
    (for each xdist worker): every test asking for the same pair gets the same server.
    For tests that only send it requests: a test that signals, stops or starves a server,
    or needs its log to itself, starts its own (make_server)."""
    servers: dict[tuple, ServerProcess] = {}

    def get(model_dir, env: dict[str, str] | None = None) -> ServerProcess:
        key = (str(model_dir), tuple(sorted((env or {}).items())))
        if key not in servers:
            server = ServerProcess(model_dir, env, log_path=tmp_path_factory.mktemp("shared") / "server.log")
            servers[key] = server.start()
        return servers[key]

    yield get
    for server in servers.values():
        server.terminate()


@pytest.fixture(scope="session")
def example_server(shared_server, example_model_dir):
    """One real gunicorn serving the example model with the default settings, shared by
    the whole session (one per xdist worker)."""
    return shared_server(example_model_dir)


@pytest.fixture
def model_copy(tmp_path, example_model_dir):
    """make(inference_py=None, name='model') -> a copy of the example model, with hooks."""

    def make(inference_py: str | None = None, name: str = "model") -> Path:
        return copy_model(example_model_dir, tmp_path / name, inference_py)

    return make


@pytest.fixture(scope="session")
def echo_model_dir(tmp_path_factory) -> Path:
    """The echo model (tests/helpers/hooks/echo.py): hooks alone, answering x * 2."""
    return model_dir_with(tmp_path_factory.mktemp("echo"), ECHO_HOOKS, "echo")


@pytest.fixture(scope="session")
def echo_server(shared_server, echo_model_dir):
    """The echo model with the default settings, shared by the tests that only send it
    requests and messages."""
    return shared_server(echo_model_dir)

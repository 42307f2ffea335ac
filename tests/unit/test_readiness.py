"""/ping is 200 only when every worker has its model: SageMaker routes after one 200."""

import pytest

from smserve.errors import ServerError, Unavailable
from smserve.engine.worker.server import FAILED, READY, ModelServer
from smserve.settings import Settings


def test_ready_only_when_every_worker_left_its_marker(tmp_path):
    servers = [ModelServer(Settings(), worker_index=i, workers=2, state_dir=str(tmp_path)) for i in range(2)]
    first, second = servers
    first.status = READY
    (tmp_path / "worker-0.ready").touch()
    with pytest.raises(Unavailable, match="worker\\(s\\) 1 of 2"):
        first.check_all_ready()
    with pytest.raises(Unavailable, match="loading"):
        second.check_all_ready()
    (tmp_path / "worker-1.ready").touch()
    first.check_all_ready()


def test_a_restarted_worker_clears_its_predecessors_marker(tmp_path, monkeypatch):
    (tmp_path / "worker-0.ready").touch()
    server = ModelServer(Settings(model_dir=str(tmp_path / "missing")), worker_index=0, workers=1, state_dir=str(tmp_path))
    monkeypatch.setattr(server, "load", lambda: None)
    server.start()
    assert not (tmp_path / "worker-0.ready").exists()


def test_failed_load_is_500_with_the_reason():
    server = ModelServer(Settings(), workers=1)
    server.status, server.error = FAILED, "RuntimeError: bad weights"
    with pytest.raises(ServerError, match="bad weights"):
        server.check_all_ready()


def test_a_multi_model_server_is_up_once_every_worker_can_take_a_load(tmp_path):
    from smserve.engine.multimodel.server import MultiModelServer

    first, second = (MultiModelServer(Settings(), worker_index=i, workers=2, state_dir=str(tmp_path)) for i in range(2))
    with pytest.raises(Unavailable, match="starting"):
        first.check_all_ready()  # torch and the rehearsal load are not in yet
    first._prepared.set()
    (tmp_path / "worker-0.ready").touch()
    with pytest.raises(Unavailable, match="worker\\(s\\) 1 of 2"):
        first.check_all_ready()
    second._prepared.set()
    (tmp_path / "worker-1.ready").touch()
    (tmp_path / "started").touch()
    first.check_all_ready()
    second.check_all_ready()
    # After the first full start a worker that answers is past its own start (a restarted
    # one takes no connection before), and no model, loaded or failed, changes /ping.
    (tmp_path / "worker-1.ready").unlink()
    first.check_all_ready()

"""SIGTERM drains: in-flight requests finish, new connections are refused, exit 0."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import numpy as np
import requests

from tests.helpers.models import slow_predict
from tests.helpers.server import pending_requests, wait_until, worker_pids

SLOW_PREDICT = slow_predict(4)
IN_FLIGHT = 6
GRACEFUL_S = 60


def test_sigterm_lets_in_flight_requests_finish_and_exits_0(make_server, model_copy, digits):
    # Two workers: draining must cover every worker, not just the one that got a signal first.
    server = make_server(model_copy(SLOW_PREDICT), {"SAGEMAKER_MODEL_SERVER_WORKERS": "2",
                                                    "SMSERVE_GRACEFUL_TIMEOUT": str(GRACEFUL_S)})
    x, y = digits
    responses: list[requests.Response | Exception] = []

    def invoke(i: int) -> None:
        # A session keeps its connection alive after the response, as SageMaker's front
        # end does: the worker must still exit without waiting for the graceful timeout.
        session = sessions[i]
        try:
            responses.append(session.post(server.url + "/invocations", json={"instances": x[i : i + 1].tolist()},
                                          timeout=30))
        except Exception as e:  # noqa: BLE001 - recorded and asserted on below
            responses.append(e)

    # A client that connects and never sends a request must not hold a worker either.
    silent = socket.create_connection(("127.0.0.1", server.port))
    sessions = [requests.Session() for _ in range(IN_FLIGHT)]
    for session in sessions:  # open the kept-alive connections before SIGTERM
        assert session.get(server.url + "/ping").status_code == 200
    clients = [threading.Thread(target=invoke, args=(i,)) for i in range(IN_FLIGHT)]
    for client in clients:
        client.start()
    # Every request has reached the server: in a forward pass, or queued for the next.
    assert wait_until(lambda: pending_requests(server) == IN_FLIGHT, timeout=15, interval=0.05)
    workers = worker_pids(server)
    signalled = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)

    # gevent workers notice the signal within a second of their loop's tick.
    def refused() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=1):
                return False
        except OSError:
            return True

    assert wait_until(refused, timeout=2.5, interval=0.1), "new connections were still accepted while requests were draining"
    assert len(responses) < IN_FLIGHT, "refused only once the requests were answered"

    for client in clients:
        client.join(30)
    assert server.proc.wait(30) == 0
    drained_s = time.monotonic() - signalled
    silent.close()
    assert len(responses) == IN_FLIGHT
    assert all(isinstance(r, requests.Response) and r.status_code == 200 for r in responses), responses
    predicted = sorted(int(np.argmax(r.json()["predictions"][0])) for r in responses)
    assert predicted == sorted(y[:IN_FLIGHT].tolist())
    # Every worker exited, and no connection (the silent one, the kept-alive ones) held
    # the drain until the graceful timeout.
    assert not any(os.path.exists(f"/proc/{pid}") for pid in workers), workers
    assert drained_s < GRACEFUL_S / 2, drained_s


def test_sigterm_while_a_replacement_worker_starts_ends_the_server_without_the_graceful_wait(make_server,
                                                                                          echo_model_dir):
    """The master forwards SIGTERM to a worker it has just forked, before that worker has
    set its own handlers: the worker must still stop, not serve on until the master kills
    it at the graceful timeout."""
    server = make_server(echo_model_dir, {"SMSERVE_GRACEFUL_TIMEOUT": "120"})
    (worker,) = worker_pids(server)
    os.kill(worker, signal.SIGKILL)
    # The signal as soon as the master says it boots the replacement: that worker has
    # then seconds of start ahead of it.
    assert wait_until(lambda: server.log().count("Booting worker") >= 2, timeout=30, interval=0.005)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=60) == 0, server.log()[-3000:]

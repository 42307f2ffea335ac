"""SIGTERM drains: in-flight requests finish, new connections are refused, exit 0."""

from __future__ import annotations

import signal
import socket
import threading

import numpy as np
import requests

from tests.helpers.models import slow_predict
from tests.helpers.server import pending_requests, wait_until

SLOW_PREDICT = slow_predict(4)
IN_FLIGHT = 6


def test_sigterm_lets_in_flight_requests_finish_and_exits_0(make_server, model_copy, digits):
    # Two workers: draining must cover every worker, not just the one that got a signal first.
    server = make_server(model_copy(SLOW_PREDICT), {"SAGEMAKER_MODEL_SERVER_WORKERS": "2"})
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
    silent.close()
    assert len(responses) == IN_FLIGHT
    assert all(isinstance(r, requests.Response) and r.status_code == 200 for r in responses), responses
    predicted = sorted(int(np.argmax(r.json()["predictions"][0])) for r in responses)
    assert predicted == sorted(y[:IN_FLIGHT].tolist())
    log = server.log()
    assert "Handling signal: term" in log
    assert "shutdown complete" in log
    assert "Worker exiting" in log
    assert "graceful timeout" not in log.lower()

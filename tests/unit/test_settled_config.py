"""http/connection.SettledConfig: the request parser reads gunicorn's settings through it."""

import pytest
from gunicorn.config import Config
from gunicorn.http.errors import LimitRequestHeaders
from gunicorn.http.parser import RequestParser

from smserve.http.connection import SettledConfig


class _Source:
    def __init__(self, data: bytes):
        self.data = data

    def recv(self, size):
        data, self.data = self.data[:size], self.data[size:]
        return data


def test_each_setting_is_looked_up_once_and_keeps_its_value():
    cfg = Config()
    cfg.set("limit_request_line", 1234)
    settled = SettledConfig(cfg)
    assert settled.limit_request_line == 1234 and settled.keepalive == cfg.keepalive
    assert "limit_request_line" in vars(settled)  # a plain attribute from now on
    assert settled.forwarded_allow_networks() == cfg.forwarded_allow_networks()


def test_the_parser_reads_through_it_as_through_gunicorns_config():
    head = (b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n"
            b"Content-Type: application/json\r\n\r\n[1]")
    requests = []
    for cfg in (Config(), SettledConfig(Config())):
        req = next(RequestParser(cfg, _Source(head), ("127.0.0.1", 5000)))
        requests.append((req.method, req.path, req.headers, req._expected_100_continue, req.body.read()))
    assert requests[0] == requests[1]
    assert requests[0][3] is True and requests[0][4] == b"[1]"


def test_limits_hold_through_it():
    cfg = Config()
    cfg.set("limit_request_fields", 2)
    head = b"GET /ping HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n"
    with pytest.raises(LimitRequestHeaders):
        next(RequestParser(SettledConfig(cfg), _Source(head), ("127.0.0.1", 5000)))

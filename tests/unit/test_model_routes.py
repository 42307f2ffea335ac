"""The multi-model API's refusals, through the route table on a worker's MultiModelServer
that has not started (no torch, no load): what a request may ask is checked before
anything is loaded or registered."""

from __future__ import annotations

import pytest

from smserve.engine.multi_model import MultiModelServer
from smserve.routes import endpoints
from smserve.routes.table import Request
from smserve.settings import Settings


@pytest.fixture
def api(tmp_path):
    settings = Settings(multi_model=True, metrics=False)
    server = MultiModelServer(settings, state_dir=str(tmp_path))
    table = endpoints.build(server, settings)

    def call(method: str, path: str, body: bytes = b"", query: str = ""):
        route, params = table.match(method, path)
        return table.dispatch(route, Request(method, path, {}, body, params, query))

    call.server = server
    return call


@pytest.mark.parametrize("query", [
    "limit=%C2%B2",  # '²': str.isdigit() says yes, int() says no (it was a 500)
    "limit=%D9%A3",  # Arabic-Indic three: read as 3
    "limit=%EF%BC%95",  # fullwidth five
    "limit=1" + "0" * 5000,  # int() refuses 4,300+ digits
    "limit=0", "limit=1001", "limit=-1", "limit=+5", "limit= 5", "limit=",
    "next_page_token=%C2%B2", "next_page_token=%D9%A3", "next_page_token=x", "next_page_token=-1",
    "next_page_token=1" + "0" * 5000, "next_page_token=7",  # (past the models there are)
])
def test_a_page_is_asked_for_in_ascii_digits_or_it_is_400(api, query):
    answer = api("GET", "/models", query=query)
    assert answer.status == 400, answer.body


@pytest.mark.parametrize("query", ["", "limit=1", "limit=1000", "limit=0007", "next_page_token=0",
                                   "next_page_token=", "limit=5&next_page_token=0"])
def test_a_page_in_ascii_digits_is_answered(api, query):
    answer = api("GET", "/models", query=query)
    assert answer.status == 200 and answer.body == b'{"models":[]}'

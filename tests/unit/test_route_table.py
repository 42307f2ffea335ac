"""The route table alone: matching, parameters, HEAD, errors turned into answers."""

from __future__ import annotations

import json

from smserve.errors import NotFound
from smserve.routes.table import Request, Response, RouteTable


def _table():
    table = RouteTable()
    table.add(("GET", "POST"), "/ping", lambda r: Response(200, [], b"pong"), quiet=True)
    table.add("POST", "/v2/models/{model}/infer", lambda r: Response(200, [], json.dumps(r.params).encode()))
    table.add("POST", "/v2/models/{model}/versions/{version}/infer",
              lambda r: Response(200, [], json.dumps(r.params).encode()))

    def missing(request):
        raise NotFound("no such thing", headers={"X-Why": "test"})

    table.add("GET", "/missing", missing)
    table.add("GET", "/broken", lambda r: 1 / 0)
    return table


def test_static_and_patterned_routes_match_with_decoded_parameters():
    table = _table()
    route, params = table.match("POST", "/v2/models/m%2Fx/versions/3/infer")
    assert route.pattern == "/v2/models/{model}/versions/{version}/infer"
    assert params == {"model": "m/x", "version": "3"}
    assert table.match("GET", "/ping")[0].quiet
    assert table.match("POST", "/ping")[0] is table.match("GET", "/ping")[0]


def test_head_is_answered_by_a_get_route_and_nothing_else_matches_loosely():
    table = _table()
    assert table.match("HEAD", "/ping")[0].pattern == "/ping"
    assert table.match("HEAD", "/v2/models/m/infer") == (None, {})
    assert table.match("GET", "/v2/models/m/infer") == (None, {})
    assert table.match("POST", "/v2/models//infer") == (None, {})
    assert table.match("POST", "/v2/models/a/b/infer") == (None, {})
    assert table.match("GET", "/ping/") == (None, {})


def test_errors_become_json_answers_with_their_headers():
    table = _table()
    route, params = table.match("GET", "/missing")
    answer = table.dispatch(route, Request("GET", "/missing", {}, b"", params))
    assert answer.status == 404 and json.loads(answer.body) == {"error": "no such thing"}
    assert ("X-Why", "test") in answer.headers and ("Content-Type", "application/json") in answer.headers
    route, params = table.match("GET", "/broken")
    answer = table.dispatch(route, Request("GET", "/broken", {}, b"", params))
    assert answer.status == 500 and "ZeroDivisionError" in json.loads(answer.body)["error"]


def test_the_request_reads_headers_by_any_case():
    request = Request("GET", "/", {"CONTENT-TYPE": "text/csv"})
    assert request.header("Content-Type") == "text/csv" and request.header("accept") is None

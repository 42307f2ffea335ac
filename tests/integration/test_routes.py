"""The one route table through a real gunicorn: every route answered by the worker, the
same answers through Flask's test client, and the HTTP corners around it (issue #25
items 6-8): JSON 404s and 405s with Allow, `GET /`, `Connection: ..., close`, a later
HTTP/1.x answered as 1.1, a head the WSGI environ cannot be built from."""

from __future__ import annotations

import json

import pytest
import requests

from tests.integration.http_raw import Reader, connect, request_bytes

PIXELS = [float(i % 17) for i in range(64)]


def raw(port: int, data: bytes, count: int = 1):
    with connect(port, timeout=10) as sock:
        sock.sendall(data)
        reader = Reader(sock)
        answers = [reader.response() for _ in range(count)]
        sock.settimeout(5)
        try:
            rest = sock.recv(1)
        except TimeoutError:
            rest = None  # still open
        return answers, rest


def test_get_root_lists_every_route_in_one_line_of_json(example_server):
    r = requests.get(example_server.url + "/")
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
    routes = r.json()["routes"]
    for expected in ("GET|POST /ping".replace("|", " "), "POST /invocations", "GET /execution-parameters",
                     "POST /v2/models/{model}/infer"):
        assert expected in routes
    assert b"\n" not in r.content


@pytest.mark.parametrize("path", ["/nope", "/v2/models/digits/what", "/invocations/extra"])
def test_an_unknown_path_is_a_json_404_naming_it(example_server, path):
    r = requests.get(example_server.url + path)
    assert r.status_code == 404 and r.headers["Content-Type"] == "application/json"
    assert path in r.json()["error"] and "GET /" in r.json()["error"]


@pytest.mark.parametrize("method", ["GET", "HEAD", "PUT", "DELETE"])
def test_a_method_a_route_does_not_take_is_405_with_allow(example_server, method):
    r = requests.request(method, example_server.url + "/invocations")
    assert r.status_code == 405
    assert r.headers["Allow"] == "POST"
    if method != "HEAD":
        assert method in r.json()["error"]


def test_head_on_a_get_route_has_no_body(example_server):
    r = requests.head(example_server.url + "/execution-parameters")
    assert r.status_code == 200 and r.content == b""


@pytest.mark.parametrize("connection", [["keep-alive, close"], ["keep-alive", "close"], ["Close"], ["x, CLOSE , y"]])
def test_close_among_the_connection_options_closes_after_the_answer(example_server, connection):
    head = [f"Connection: {value}" for value in connection]
    first = ("GET /ping HTTP/1.1\r\nHost: x\r\n" + "".join(h + "\r\n" for h in head) + "\r\n").encode()
    answers, rest = raw(example_server.port, first + request_bytes("GET", "/ping"))
    assert answers[0].status == 200
    assert answers[0].headers.get("connection", "").lower() == "close"
    assert rest == b"", "the pipelined second request was served on a connection the client asked to close"


def test_keep_alive_alone_keeps_the_connection(example_server):
    answers, rest = raw(example_server.port, request_bytes("GET", "/ping", headers={"Connection": "keep-alive"}) * 2, 2)
    assert [a.status for a in answers] == [200, 200] and rest is None


def test_a_later_http_1_minor_version_is_answered_in_http_1_1(example_server):
    with connect(example_server.port, timeout=10) as sock:
        sock.sendall(b"GET /ping HTTP/1.2\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 ")


def test_one_blank_line_before_the_request_line_is_ignored(example_server):
    answers, _ = raw(example_server.port, b"\r\n" + request_bytes("GET", "/ping"))
    assert answers[0].status == 200


@pytest.mark.parametrize("path", ["/execution-parameters", "/v2/models/digits", "/nope"])
def test_a_script_name_header_that_breaks_the_environ_is_a_json_400(example_server, path):
    answers, _ = raw(example_server.port, request_bytes("GET", path, headers={"SCRIPT_NAME": "/elsewhere"}))
    status = answers[0].status
    assert status < 500
    if status >= 400:
        assert "error" in answers[0].json()
    assert requests.get(example_server.url + "/ping").status_code == 200


@pytest.mark.parametrize("method, path, status_line", [
    ("GET", "/nope", b"HTTP/1.1 404 Not Found\r\n"),  # answered by the Flask app
    ("GET", "/v2/models/nope", b"HTTP/1.1 404 Not Found\r\n"),  # by the route table
    ("PUT", "/ping", b"HTTP/1.1 405 Method Not Allowed\r\n"),
])
def test_every_answer_has_the_same_reason_phrases(example_server, method, path, status_line):
    with connect(example_server.port, timeout=10) as sock:
        sock.sendall(request_bytes(method, path))
        head = b""
        while b"\r\n" not in head:
            head += sock.recv(4096)
    assert head.startswith(status_line), head


def test_a_percent_encoded_model_name_reaches_the_v2_route(example_server):
    body = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": PIXELS}]}
    r = requests.post(example_server.url + "/v2/models/%64igits/infer", json=body)
    assert r.status_code == 200, r.text
    r = requests.post(example_server.url + "/v2/models/other/infer", json=body)
    assert r.status_code == 404 and "other" in r.json()["error"]


def test_flask_test_client_sees_the_same_table(example_model_dir):
    """Every route the worker answers is answered by the Flask app too (other WSGI servers)."""
    from smserve.engine.worker.server import ModelServer
    from smserve.routes.app import create_app
    from smserve.settings import Settings

    settings = Settings.from_env({"SM_MODEL_DIR": str(example_model_dir)})
    server = ModelServer(settings, workers=1)
    app = create_app(settings, server)
    table = app.extensions["smserve.routes"]
    rules = {(rule.rule, method) for rule in app.url_map.iter_rules() for method in rule.methods}
    for route in table.routes:
        for method in route.methods:
            assert (route.flask_rule, method) in rules
    client = app.test_client()
    assert client.get("/nope").status_code == 404 and "error" in client.get("/nope").get_json()
    assert client.get("/nope").status == "404 Not Found"  # as every other answer says it, not NOT FOUND
    r = client.get("/invocations")
    assert r.status_code == 405 and r.headers["Allow"] == "POST"
    assert client.get("/").get_json()["routes"] == json.loads(json.dumps([
        f"{' '.join(route.methods)} {route.pattern}" for route in table.routes]))


@pytest.mark.parametrize("upgrade", ["websocket, h2c", "h2c, WebSocket"])
def test_a_handshake_that_offers_websocket_among_other_protocols_is_taken(example_server, upgrade):
    with connect(example_server.port, timeout=10) as sock:
        sock.sendall(("GET /invocations-bidirectional-stream HTTP/1.1\r\nHost: x\r\n"
                      f"Upgrade: {upgrade}\r\nConnection: Upgrade\r\n"
                      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 101 "), head

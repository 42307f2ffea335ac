"""The multi-model API's refusals, through the route table on a worker's MultiModelServer
that has not started (no torch, no load): what a request may ask is checked before
anything is loaded or registered."""

from __future__ import annotations

import json

import pytest

from smserve.engine.multimodel.server import MultiModelServer
from smserve.routes import endpoints
from smserve.routes.table import Request
from smserve.settings import Settings


@pytest.fixture
def api(tmp_path):
    root = tmp_path / "models"
    (root / "m" / "model").mkdir(parents=True)
    (root / "m" / "model" / "model.pt").write_bytes(b"")  # (a model by its files; never loaded here)
    settings = Settings(multi_model=True, metrics=False, models_root=str(root))
    server = MultiModelServer(settings, state_dir=str(tmp_path / "state"))
    table = endpoints.build(server, settings)

    def call(method: str, path: str, body: bytes = b"", query: str = ""):
        route, params = table.match(method, path)
        return table.dispatch(route, Request(method, path, {}, body, params, query))

    call.server = server
    call.root = root
    return call


def load(api, name, url=None):
    url = str(api.root / "m" / "model") if url is None else url
    return api("POST", "/models", json.dumps({"model_name": name, "url": url}).encode())


@pytest.mark.parametrize("name", ["a" * 1025, "a" * (1 << 20), " a", "caf\u00e9", "a\tb", "a\nb", "a\x00",
                                  "a\x7f"],
                         ids=["1025", "1MB", "leading-space", "non-ascii", "tab", "newline", "nul", "del"])
def test_a_name_sagemaker_could_not_send_is_400_before_anything_is_registered(api, name):
    answer = load(api, name)
    assert answer.status == 400 and b"model_name must be 1 to 1024 characters of printable ASCII" in answer.body
    assert len(answer.body) < 400  # (the name shown cut short)
    assert api.server.shared.entries() == []


@pytest.mark.parametrize("name", ["a", "a" * 1024, "customers/acme.tar.gz", "a b", "!~%20?#\"'\\"])
def test_a_name_sagemaker_may_send_passes_the_check(api, name):
    from smserve.engine.multimodel.registry import check_name

    check_name(name)


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


def test_the_request_line_holds_the_longest_name_percent_encoded():
    """Past gunicorn's limit a model's DELETE and invoke would be 414s: loaded for good."""
    from urllib.parse import quote

    from smserve.engine.multimodel.registry import MAX_NAME_CHARS
    from smserve.http import gunicorn_conf

    name = quote("%" * MAX_NAME_CHARS, safe="")
    lines = [f"POST /models/{name}/invoke HTTP/1.1", f"DELETE /models/{name} HTTP/1.1",
             f"POST /v2/models/{name}/versions/1/infer HTTP/1.1", f"GET /v2/models/{name}/versions/1/ready HTTP/1.1"]
    assert max(map(len, lines)) + 512 <= gunicorn_conf.limit_request_line


@pytest.mark.parametrize("url", ["/elsewhere/model", "relative/model", "{root}/../elsewhere", "{root}/m/../../x",
                                 "{root}-sibling/model", "/"])
def test_a_folder_outside_the_models_root_is_400_before_anything_is_registered(api, url):
    answer = load(api, "m", url.format(root=api.root))
    assert answer.status == 400 and b"not a folder under" in answer.body and b"SMSERVE_MODELS_ROOT" in answer.body
    assert api.server.shared.entries() == []


def test_the_default_models_root_is_sagemakers():
    assert Settings().models_root == "/opt/ml/models"
    assert Settings.from_env({"SMSERVE_MODELS_ROOT": "/srv/models/"}).models_root == "/srv/models"


@pytest.mark.parametrize("root", ["{root}", "{root}/", "{root}/m/..", "/"])
def test_a_folder_under_the_models_root_passes_however_the_root_is_written(api, root):
    from smserve.engine.multimodel.admission import check_model_folder

    check_model_folder(str(api.root / "m" / "model"), root.format(root=api.root))

"""http/connection.PlainHeadRequest: a plain head read in one pass gives the request gunicorn's
parser gives, and any head it does not take is gunicorn's to answer, error for error."""

import pytest
from gunicorn.config import Config
from gunicorn.http.message import Request
from gunicorn.http.parser import RequestParser
from hypothesis import example, given, settings, strategies as st

from smserve.http import connection as head_module
from smserve.http.connection import PlainHeadParser, SettledConfig

PEER = ("127.0.0.1", 5000)


class _Source:
    """A socket whose reads return `pieces` one at a time (the head may come cut)."""

    def __init__(self, *pieces: bytes):
        self.pieces = list(pieces)

    def recv(self, size):
        if not self.pieces:
            return b""
        data = self.pieces[0][:size]
        self.pieces[0] = self.pieces[0][size:]
        if not self.pieces[0]:
            self.pieces.pop(0)
        return data


def _config(**settings) -> Config:
    cfg = Config()
    for name, value in settings.items():
        cfg.set(name, value)
    return cfg


def _outcome(parser_class, cfg, pieces, peer=PEER):
    """Everything the worker reads of the first request (and the bytes after it), or
    the error's type and text."""
    try:
        parser = parser_class(cfg, _Source(*pieces), peer)
        req = next(parser)
        body = req.body.read()
        rest = parser.unreader.read()
        return ("request", req.method, req.uri, req.path, req.query, req.fragment, req.version, req.headers,
                req.scheme, req._expected_100_continue, req.should_close(), type(req.body.reader).__name__, body, rest)
    except Exception as e:  # noqa: BLE001 - the error is the outcome compared
        return ("error", type(e).__name__, str(e))


def _same(pieces, settings=None, peer=PEER, settled=None):
    """Our parser's outcome (through the worker's SettledConfig: `settled`, or one of
    these settings), checked against gunicorn's on gunicorn's own Config."""
    settings = settings or {}
    ours = _outcome(PlainHeadParser, settled or SettledConfig(_config(**settings)), pieces, peer)
    assert ours == _outcome(RequestParser, _config(**settings), pieces, peer)
    return ours


HEADS = [
    b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Type: application/json\r\n\r\n[1]",
    b"GET /ping HTTP/1.0\r\n\r\n",
    b"GET /ping?x=1&y=2 HTTP/1.1\r\nHost: a\r\n\r\nGET /ping HTTP/1.1\r\n\r\n",
    b"GET /p?a?b HTTP/1.1\r\n\r\n",
    b"GET /p;x?y HTTP/1.1\r\n\r\n",
    b"GET /p? HTTP/1.1\r\n\r\n",
    b"GET //ping HTTP/1.1\r\n\r\n",
    b"GET /p#f HTTP/1.1\r\n\r\n",
    b"GET * HTTP/1.1\r\n\r\n",
    b"OPTIONS * HTTP/1.1\r\n\r\n",
    b"GET http://x/p HTTP/1.1\r\n\r\n",
    b"CONNECT x:443 HTTP/1.1\r\n\r\n",
    b"get /p HTTP/1.1\r\n\r\n",
    b"FOO /p HTTP/1.1\r\n\r\n",
    b"GET /p HTTP/1.2\r\n\r\n",
    b"GET /p HTTP/2.0\r\n\r\n",
    b"GET /p http/1.1\r\n\r\n",
    b"GET  /p HTTP/1.1\r\n\r\n",
    b"GET /p  HTTP/1.1\r\n\r\n",
    b"GET /p\x7f HTTP/1.1\r\n\r\n",
    b"GET /p\xe9 HTTP/1.1\r\n\r\n",
    b"\r\nGET /p HTTP/1.1\r\n\r\n",
    b"GET /p HTTP/1.1\r\nA:  b  \r\n\r\n",
    b"GET /p HTTP/1.1\r\nA:\r\n\r\n",
    b"GET /p HTTP/1.1\r\nA: \t\r\n\r\n",
    b"GET /p HTTP/1.1\r\nA: x\xe9y\r\n\r\n",
    b"GET /p HTTP/1.1\r\nA : x\r\n\r\n",
    b"GET /p HTTP/1.1\r\n: x\r\n\r\n",
    b"GET /p HTTP/1.1\r\nA x\r\n\r\n",
    b"GET /p HTTP/1.1\r\nA: x\r\n y\r\n\r\n",
    b"GET /p HTTP/1.1\nA: x\r\n\r\n",
    b"GET /p HTTP/1.1\r\nA: x\ny\r\n\r\n",
    b"GET /p HTTP/1.1\r\nA: x\ry\r\n\r\n",
    b"GET /p HTTP/1.1\r\nA: x\x00y\r\n\r\n",
    b"GET /p HTTP/1.1\r\nA: x\x7fy\r\n\r\n",
    b"GET /p HTTP/1.1\r\nA\xe9: x\r\n\r\n",
    b"GET /p HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
    b"GET /p HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    b"GET /p HTTP/1.1\r\nContent-Length: 1_0\r\n\r\n",
    b"GET /p HTTP/1.1\r\nContent-Length: +1\r\n\r\nx",
    b"POST /p HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
    b"POST /p HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /p HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
    b"POST /p HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n",
    b"POST /p HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nab",
    b"POST /p HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nab",
    b"POST /p HTTP/1.1\r\nExpect: nope\r\n\r\n",
    b"POST /p HTTP/1.1\r\nX_Forwarded_For: 1\r\n\r\n",
    b"POST /p HTTP/1.1\r\nX-Forwarded-Proto: https\r\n\r\n",
    b"POST /p HTTP/1.1\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Ssl: off\r\n\r\n",
    b"GET /p HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    b"GET /p HTTP/1.1\r\nConnection: close\r\n\r\n",
    b"GET /p HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n",
    b"GET /p HTTP/1.1\r\nA: " + b"a" * 9000 + b"\r\n\r\n",
    b"GET /p HTTP/1.1\r\n" + b"A: b\r\n" * 100 + b"\r\n",
    b"GET /p HTTP/1.1\r\n" + b"A: b\r\n" * 101 + b"\r\n",
    b"GET /p HTTP/1.1\r\n",
    b"GET /p HTTP/1.1\r\nA: b",
    b"",
]


@pytest.mark.parametrize("head", HEADS, ids=range(len(HEADS)))
def test_every_head_comes_out_as_gunicorns_parser_makes_it(head):
    _same([head])


@pytest.mark.parametrize("cut", [1, 5, 17, 30, 31, 40])
def test_a_head_that_comes_in_pieces_is_read_whole(cut):
    head = HEADS[0]
    assert _same([head[:cut], head[cut:]])[0] == "request"


def test_a_plain_head_takes_the_one_pass_and_another_takes_gunicorns_parser(monkeypatch):
    """(Were the one pass never taken, every test above would pass on gunicorn's parser.)"""
    taken = []
    gunicorns = Request.parse
    monkeypatch.setattr(Request, "parse", lambda self, unreader: taken.append("gunicorn") or gunicorns(self, unreader))
    next(PlainHeadParser(SettledConfig(_config()), _Source(HEADS[0]), PEER))
    assert taken == []
    _outcome(PlainHeadParser, SettledConfig(_config()), [b"GET /p HTTP/1.1\r\nA: x\r\n y\r\n\r\n"])
    assert taken == ["gunicorn"]


@pytest.mark.parametrize("settings", [
    {"limit_request_line": 20},
    {"limit_request_fields": 2},
    {"limit_request_field_size": 12},
    {"forwarded_allow_ips": "*"},
    {"forwarded_allow_ips": "10.0.0.1"},
    {"header_map": "drop"},
    {"header_map": "dangerous"},
])
@pytest.mark.parametrize("head", [
    HEADS[0],
    b"POST /p HTTP/1.1\r\nX-Forwarded-Proto: https\r\nX_Forwarded_For: 1\r\nA: 12345\r\n\r\n",
    b"GET /p HTTP/1.1\r\nA: 1\r\nB: 2\r\n\r\n",
    b"GET /p HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n",
    b"GET /abcdefghijklmn HTTP/1.1\r\n\r\n",
])
def test_limits_and_policies_are_gunicorns(settings, head):
    _same([head], settings)


def test_the_peer_decides_the_scheme_headers_once_per_address():
    settings = {"forwarded_allow_ips": "10.0.0.1"}
    cfg = SettledConfig(_config(**settings))
    head = b"GET /p HTTP/1.1\r\nX-Forwarded-Proto: https\r\n\r\n"
    assert _same([head], settings, ("10.0.0.1", 1), cfg)[8] == "https"
    assert _same([head], settings, ("10.0.0.2", 1), cfg)[8] == "http"
    assert _same([head], settings, ("10.0.0.1", 2), cfg)[8] == "https"  # the kept answer
    assert cfg.trusted_peers == {"10.0.0.1": True, "10.0.0.2": False}


def test_the_peers_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(head_module, "TRUSTED_PEERS_MAX", 3)
    cfg = SettledConfig(_config())
    for i in range(10):
        _same([HEADS[1]], None, (f"10.0.0.{i}", 1), cfg)
        assert len(cfg.trusted_peers) <= 3


_TOKENS = st.sampled_from([b"Host", b"Content-Length", b"Content-Type", b"Expect", b"Transfer-Encoding",
                           b"Connection", b"X_Forwarded_For", b"X-Forwarded-Proto", b"A", b"a-b", b"A\xe9",
                           b"A B", b"", b"A:"])
_VALUE_BYTES = st.sampled_from([b"a", b"1", b" ", b"\t", b"\xe9", b"\x00", b"\x7f", b"\r", b"\n", b":", b"-",
                                b"chunked", b"close", b"100-continue", b"https", b"3"])
_FIELD_LINE = st.tuples(_TOKENS, st.sampled_from([b":", b": ", b" :", b":\t"]),
                        st.lists(_VALUE_BYTES, max_size=6).map(b"".join),
                        st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n", b"\r\n "])).map(b"".join)
_HEAD = st.tuples(
    st.sampled_from([b"GET", b"POST", b"PUT", b"HEAD", b"OPTIONS", b"DELETE", b"PATCH", b"get", b"CONNECT",
                     b"FOO", b""]),
    st.sampled_from([b" ", b" ", b"  ", b"\t"]),
    st.sampled_from([b"/", b"/invocations", b"//x", b"/p?q=1", b"/p#f", b"*", b"http://x/", b"", b"/a b",
                     b"/\xe9", b"/%20", b"/p?", b"x:1"]),
    st.sampled_from([b" HTTP/1.1", b" HTTP/1.0", b" HTTP/2.0", b" HTTP/1.2", b" http/1.1", b"HTTP/1.1", b" HTTP/11"]),
    st.sampled_from([b"\r\n", b"\r\n", b"\n"]),
    st.lists(_FIELD_LINE, max_size=5).map(b"".join),
    st.sampled_from([b"\r\n", b"\r\n", b"", b"\n"]),
    st.sampled_from([b"", b"abc", b"0\r\n\r\n", b"GET / HTTP/1.1\r\n\r\n"]),
).map(b"".join)


@settings(max_examples=400, deadline=None)
@given(head=_HEAD, cut=st.integers(min_value=0, max_value=80))
@example(head=HEADS[0], cut=0)
def test_any_head_comes_out_as_gunicorns_parser_makes_it(head, cut):
    _same([head[:cut], head[cut:]] if 0 < cut < len(head) else [head])

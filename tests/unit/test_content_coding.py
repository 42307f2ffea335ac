"""Request bodies with Content-Encoding gzip or deflate: inflated within the payload
limit, and refused with a 4xx when they are not what they claim."""

from __future__ import annotations

import gzip
import os
import tracemalloc
import zlib

import pytest
from hypothesis import given, settings, strategies as st

from smserve.codecs import contentcoding
from smserve.codecs.contentcoding import inflate
from smserve.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType

LIMIT = 8 << 20
DATA = os.urandom(5000) + b"\0" * 3_000_000 + b"end"


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize("coding, pack", [
    ("gzip", gzip.compress),
    ("x-gzip", gzip.compress),
    ("deflate", zlib.compress),  # RFC 9110's deflate: zlib-wrapped, as tritonclient sends it
    ("deflate", raw_deflate),  # what some clients send under the same name
], ids=["gzip", "x-gzip", "deflate-zlib", "deflate-raw"])
def test_inflates_each_coding(coding, pack):
    assert inflate(pack(DATA), coding, LIMIT) == DATA


@given(st.binary(max_size=3000), st.integers(1, 4))
@settings(max_examples=150, deadline=None)
def test_gzip_members_one_after_another_are_one_body(data, members):
    cuts = [len(data) * i // members for i in range(members + 1)]
    packed = b"".join(gzip.compress(data[a:b]) for a, b in zip(cuts, cuts[1:]))
    assert inflate(packed, "gzip", LIMIT) == data


@pytest.mark.parametrize("size", [contentcoding._PIECE - 1, contentcoding._PIECE, contentcoding._PIECE + 1,
                                  2 * contentcoding._PIECE, 3 * contentcoding._PIECE + 7])
def test_output_at_the_edges_of_a_piece_is_whole(size):
    """zlib hands the output out a piece at a time; a full piece may leave more in its window."""
    data = (b"0123456789abcdef" * (size // 16 + 1))[:size]
    for coding, pack in (("gzip", gzip.compress), ("deflate", zlib.compress)):
        assert inflate(pack(data), coding, LIMIT) == data


def test_exactly_the_limit_is_taken_one_byte_more_is_413():
    data = b"x" * 100_000
    assert inflate(gzip.compress(data), "gzip", len(data)) == data
    with pytest.raises(PayloadTooLarge, match="Decompressed data size exceeds the maximum allowed value of 99999 bytes "
                                              r"\(SMSERVE_MAX_REQUEST_MB=1\)"):
        inflate(gzip.compress(data), "gzip", len(data) - 1, "SMSERVE_MAX_REQUEST_MB=1")


def test_a_bomb_is_refused_without_inflating_it():
    """1 GiB of zeros in about 1 MB of gzip: refused having made no more than the limit."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    bomb = b"".join(packer.compress(b"\0" * (1 << 24)) for _ in range(64)) + packer.flush()
    assert len(bomb) < 2 << 20
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge):
            inflate(bomb, "gzip", 6 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < (6 << 20) + 3 * contentcoding._PIECE


@pytest.mark.parametrize("coding, body, words", [
    ("gzip", b"{\"instances\": [[1]]}", "not valid gzip data"),
    ("deflate", b"\x78\x9c not deflate", "not valid deflate data"),
    ("gzip", gzip.compress(DATA)[:-9], "ends before its gzip stream does"),
    ("deflate", zlib.compress(DATA)[:1000], "ends before its deflate stream does"),
    ("gzip", gzip.compress(b"abc") + b"trailing", "8 bytes follow the end of the body's gzip stream"),
    ("deflate", zlib.compress(b"abc") + zlib.compress(b"def"), "follow the end of the body's deflate stream"),
], ids=["not-gzip", "not-deflate", "gzip-cut", "deflate-cut", "gzip-trailing", "deflate-twice"])
def test_a_body_that_is_not_what_it_claims_is_400(coding, body, words):
    with pytest.raises(BadRequest, match=words) as raised:
        inflate(body, coding, LIMIT)
    assert raised.value.status == 400


@pytest.mark.parametrize("header, expected", [
    (None, []), ("", []), ("identity", []), ("gzip", ["gzip"]), ("GZip", ["gzip"]),
    (" deflate ", ["deflate"]), ("gzip, identity", ["gzip"]), ("deflate, gzip", ["deflate", "gzip"]),
])
def test_the_header_lists_codings_in_the_order_applied(header, expected):
    assert contentcoding.codings(header) == expected


@pytest.mark.parametrize("header", ["br", "zstd", "gzip, br", "compress", "gzip;q=1"])
def test_a_coding_we_cannot_undo_is_415_naming_the_ones_we_can(header):
    with pytest.raises(UnsupportedMediaType, match="is not supported.*gzip or deflate") as raised:
        contentcoding.codings(header)
    assert raised.value.status == 415


class InlineServer:
    """Pools.offload's contract, recorded: (size, fn) per call; and a worker's ledger."""

    def __init__(self):
        self.calls = []
        self.ledger = contentcoding.InflatedBytes.for_worker(1, LIMIT)

    def codec(self, size, fn, *args):
        self.calls.append((size, fn))
        return fn(*args)


def decode(body, header, limit, server):
    """contentcoding.decode with the server's offload and ledger."""
    return contentcoding.decode(body, header, limit, "", server.codec, server.ledger)


def test_decode_undoes_codings_last_first_and_always_off_the_loop():
    server = InlineServer()
    twice = zlib.compress(gzip.compress(b"payload"))  # gzip applied first, then deflate
    assert decode(twice, "gzip, deflate", LIMIT, server).body == b"payload"
    # Each inflate goes to a codec thread: its size is the limit (the work's bound), not the wire size.
    assert server.calls == [(LIMIT, inflate), (LIMIT, inflate)]


def test_decode_leaves_a_plain_or_empty_body_alone():
    server = InlineServer()
    assert decode(b"abc", None, LIMIT, server).body == b"abc"
    assert decode(b"abc", "identity", LIMIT, server).body == b"abc"
    assert decode(b"", "gzip", LIMIT, server).body == b""
    assert server.calls == []


def test_many_gzip_members_cost_linear_time_and_are_capped():
    """An empty gzip member is 20 bytes of no output: a body of them must neither copy
    the rest of the body per member (quadratic) nor run unbounded."""
    empty = gzip.compress(b"", mtime=0)
    assert inflate(empty * contentcoding.MAX_MEMBERS, "gzip", LIMIT) == b""
    with pytest.raises(BadRequest, match=f"more than {contentcoding.MAX_MEMBERS} members"):
        inflate(empty * (contentcoding.MAX_MEMBERS + 1), "gzip", LIMIT)
    with pytest.raises(BadRequest, match="more than"):
        inflate(empty * 300_000, "gzip", LIMIT)  # 6 MB: refused at the cap, not parsed to its end


def test_zero_padding_after_the_last_member_is_taken_as_gzip_takes_it():
    assert inflate(gzip.compress(b"abc") + b"\0" * 70_000, "gzip", LIMIT) == b"abc"
    with pytest.raises(BadRequest, match="follow the end"):
        inflate(gzip.compress(b"abc") + b"\0" * 70_000 + b"x", "gzip", LIMIT)


# --------------------------------------------------------------------------------------
# Inflated bodies in flight, bounded per worker (issue 25)


class ThreadedServer:
    """Pools.offload's contract on real threads (the caller's greenlet waits), and the
    ledger of a worker with two codec threads."""

    CODEC_THREADS = 2

    def __init__(self, limit: int = 1 << 20):
        from gevent.threadpool import ThreadPool

        from smserve.engine.runtime.threads import Pools

        self.pool = ThreadPool(self.CODEC_THREADS)
        self.pools = Pools(self.pool, None, None)
        self.ledger = contentcoding.InflatedBytes.for_worker(self.CODEC_THREADS, limit)

    def codec(self, size, fn, *args):
        return self.pool.apply(fn, args)


def requests_at_once(server, bodies: list[bytes], limit: int, hold_s: float) -> tuple[int, list]:
    """Decode every body in its own greenlet, each holding its body for hold_s (as a
    request does while it waits for the model); the most inflated bytes alive at once,
    and each request's outcome (its body's size, or the error)."""
    import gevent

    alive: dict[int, int] = {}
    most = 0
    outcomes: list = [None] * len(bodies)

    def request(i: int, body: bytes) -> None:
        nonlocal most
        try:
            inflated = decode(body, "gzip", limit, server)
        except Exception as e:  # noqa: BLE001 - the outcome is what the test checks
            outcomes[i] = e
            return
        alive[i] = len(inflated.body)
        most = max(most, sum(alive.values()))
        gevent.sleep(hold_s)
        outcomes[i] = len(inflated.body)
        del alive[i]
        inflated.release()  # the request done

    gevent.joinall([gevent.spawn(request, i, body) for i, body in enumerate(bodies)])
    return most, outcomes


def test_inflated_bytes_in_flight_stay_within_the_codec_threads_limits():
    """Twenty gzip bodies of ~2 KB that each inflate to just under the limit, all at
    once: a worker holds at most two limits of inflated bytes (one per codec thread),
    not twenty, and every request is answered."""
    limit = 2 << 20
    body = gzip.compress(b" " * (limit - 100))
    assert len(body) < 4 << 10
    most, outcomes = requests_at_once(ThreadedServer(limit), [body] * 20, limit, hold_s=0.05)
    assert outcomes == [limit - 100] * 20
    assert most <= 2 * limit


def test_a_request_that_finds_no_room_in_time_is_503_with_retry_after(monkeypatch):
    server = ThreadedServer()
    ledger = server.ledger
    monkeypatch.setattr(ledger, "wait_s", 0.1)
    size = (1 << 20) - 1000
    kept = [decode(gzip.compress(b"x" * size), "gzip", 1 << 20, server) for _ in range(2)]
    with pytest.raises(contentcoding.Unavailable) as refused:
        decode(gzip.compress(b"y"), "gzip", 1 << 20, server)
    assert refused.value.status == 503 and refused.value.headers == {"Retry-After": "1"}
    assert ledger.in_flight == 2 * size  # the bodies still held; the refused one reserved nothing
    for inflated in kept:
        inflated.release()
    assert ledger.in_flight == 0
    assert decode(gzip.compress(b"y"), "gzip", 1 << 20, server).body == b"y"


def test_bodies_that_fail_to_inflate_leave_no_reservation_behind():
    server = ThreadedServer()
    bomb = gzip.compress(b"\0" * (3 << 20))
    for body, error in ((b"not gzip", BadRequest), (bomb, PayloadTooLarge)):
        for _ in range(5):
            with pytest.raises(error):
                decode(body, "gzip", 1 << 20, server)
    assert server.ledger.reserved == 0


# --------------------------------------------------------------------------------------
# Nothing kept once a request is done (issue 33): the ledger counts, it keeps no list


def invocations(server, answer=None):
    """POST /invocations's route on `server`, the protocols replaced by `answer`
    (message -> Reply; by default the body's length): what the route does with the
    body before and after them is what is tested."""
    from smserve.core.reply import Reply
    from smserve.routes.sagemaker import DataPlane, SageMakerRoutes
    from smserve.routes.table import Request
    from smserve.settings import Settings

    answer = answer or (lambda message: Reply(str(len(message.body)).encode()))
    class Protocols:
        def answer(self, message, server, settings):
            return answer(message)

    settings = Settings(max_request_mb=1)
    route = SageMakerRoutes(server, settings, DataPlane(settings, server.pools.offload, Protocols()))
    server.ledger = route.plane.inflated  # the worker's, which the route holds

    def post(body: bytes):
        return route.invocations(Request("POST", "/invocations", {"CONTENT-ENCODING": "gzip"}, body))

    return post


def test_finished_requests_leave_nothing_in_the_ledger():
    """gzip.compress(b"") inflates to the shared b"", whose reference count never drops:
    the ledger kept each one in its list for good, and every later compressed request
    walked that list. 5,000 requests later nothing of them is left (measured by what
    contentcoding.py allocated and still holds), and the ledger reserves nothing."""
    server = ThreadedServer()
    post = invocations(server)
    empty, small = gzip.compress(b""), gzip.compress(b"abc")
    for body in (empty, small) * 10:  # the ledger, the pool's threads, interned results
        post(body)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for i in range(5000):
            assert post(small if i % 10 == 0 else empty).body in (b"0", b"3")
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    only_here = [tracemalloc.Filter(True, contentcoding.__file__)]
    grown = sum(stat.size_diff for stat in after.filter_traces(only_here).compare_to(
        before.filter_traces(only_here), "filename"))
    assert grown < 1024, f"contentcoding.py holds {grown} more bytes after 5,000 requests"
    assert server.ledger.in_flight == 0


def test_a_streamed_answer_holds_its_body_until_the_stream_ends_or_is_closed():
    from smserve.core.reply import Reply

    server = ThreadedServer()
    post = invocations(server, lambda message: Reply(iter([message.body[:2], message.body[2:]])))
    ledger = server.ledger
    answer = post(gzip.compress(b"abcdef"))
    assert ledger.in_flight == 6  # made, not yet sent
    assert b"".join(answer.body) == b"abcdef"
    assert ledger.in_flight == 0
    unread = post(gzip.compress(b"abcdef"))
    assert ledger.in_flight == 6
    unread.body.close()  # the client left before the first chunk: the generator never started
    assert ledger.in_flight == 0


def test_a_request_whose_protocol_fails_gives_its_room_back():
    def refuse(message):
        raise BadRequest("no")

    server = ThreadedServer()
    post = invocations(server, refuse)
    with pytest.raises(BadRequest):
        post(gzip.compress(b"abc"))
    assert server.ledger.in_flight == 0


def test_room_given_back_lets_waiting_requests_in_first_come_first_served():
    import gevent

    ledger = contentcoding.InflatedBytes(10, wait_s=30)
    ledger.reserve(8)
    order = []

    def wait(name, size):
        ledger.reserve(size)
        order.append(name)

    waiters = [gevent.spawn(wait, "first", 5), gevent.spawn(wait, "second", 1)]
    gevent.sleep(0)
    assert order == [] and ledger.reserved == 8  # "second" would fit, but waits its turn
    killed = gevent.spawn(wait, "killed", 5)
    gevent.sleep(0)
    killed.kill()  # its client gone while it waited: it takes no room with it
    ledger.release(8)
    gevent.joinall(waiters, timeout=5)
    assert order == ["first", "second"] and ledger.reserved == 6
    ledger.release(6)
    assert ledger.reserved == 0 and not ledger._waiting

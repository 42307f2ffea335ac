"""The local batch-transform runner against a small in-process HTTP server.

The server here follows the batch contract the real one implements (one output line
per input record, in order) and can be told to misbehave: fail with 5xx, drop the
connection, stall, answer 4xx or the wrong number of lines. That is what the runner
must handle, and a real model server cannot be made to do it on demand.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from local_test import batch_transform as bt
from local_test.batch_transform import MB, JobConfig


def csv_output(record: bytes) -> bytes:
    """The fake model: the sum of a CSV row's numbers."""
    return b"%g" % sum(float(x) for x in record.split(b","))


def json_output(record: bytes) -> bytes:
    value = json.loads(record)
    numbers = value["x"] if isinstance(value, dict) else value
    return json.dumps({"sum": sum(numbers)}).encode()


class FakeServer:
    """ThreadingHTTPServer speaking the batch contract, with failure injection."""

    def __init__(self):
        self.execution_parameters: dict | None = {
            "MaxConcurrentTransforms": 2,
            "BatchStrategy": "MULTI_RECORD",
            "MaxPayloadInMB": 6,
        }
        self.script: list[str] = []  # one action per incoming request, consumed in order
        self.max_body: int | None = None
        self.delay_s = 0.0
        self.slow_first_s = 0.0  # delays only the first request: later ones overtake it
        self.lines_short_by = 0
        self.lock = threading.Lock()
        self.bodies: list[bytes] = []
        self.content_types: list[str] = []
        self.accepts: list[str] = []
        self.attempts = 0
        self.in_flight = 0
        self.max_in_flight = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as SageMaker's client uses

            def log_message(self, *args):
                pass

            def reply(self, status: int, body: bytes, content_type="text/csv"):
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/ping":
                    self.reply(200, b"")
                elif self.path == "/execution-parameters" and fake.execution_parameters is not None:
                    self.reply(200, json.dumps(fake.execution_parameters).encode(), "application/json")
                else:
                    self.reply(404, b'{"error": "not found"}', "application/json")

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with fake.lock:
                    fake.attempts += 1
                    first = fake.attempts == 1
                    action = fake.script.pop(0) if fake.script else "ok"
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                try:
                    time.sleep(fake.delay_s + (fake.slow_first_s if first else 0))
                    self.handle_invocation(action, body)
                finally:
                    with fake.lock:
                        fake.in_flight -= 1

            def handle_invocation(self, action: str, body: bytes):
                if action == "drop":
                    # Close without a response: the client sees a connection error.
                    self.close_connection = True
                    return
                if action == "stall":
                    time.sleep(1.0)
                if action.isdigit():
                    self.reply(int(action), b'{"error": "injected"}', "application/json")
                    return
                if fake.max_body is not None and len(body) > fake.max_body:
                    self.reply(413, b'{"error": "payload too large"}', "application/json")
                    return
                records = [line for line in body.replace(b"\r", b"").split(b"\n") if line.strip()]
                if any(b"bad" in record for record in records):
                    self.reply(400, b'{"error": "record does not parse"}', "application/json")
                    return
                with fake.lock:
                    fake.bodies.append(body)
                    fake.content_types.append(self.headers["Content-Type"])
                    fake.accepts.append(self.headers["Accept"])
                content_type = self.headers["Content-Type"]
                model = csv_output if content_type == "text/csv" else json_output
                outputs = [model(record) for record in records]
                if fake.lines_short_by:
                    outputs = outputs[: len(outputs) - fake.lines_short_by]
                if action.startswith("cut"):
                    self.cut_short(outputs[: int(action[3:])], content_type)
                    return
                self.reply(200, b"".join(o + b"\n" for o in outputs), content_type)

            def cut_short(self, lines: list[bytes], content_type: str):
                """As the real server answers when a later forward pass fails: 200, the
                first passes' lines as chunks, then the connection closes without the
                final chunk."""
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for line in lines:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line) + 1, line + b"\n"))
                self.wfile.flush()
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def requests_answered(self) -> int:
        return len(self.bodies)


@pytest.fixture
def server():
    fake = FakeServer()
    fake.thread.start()
    yield fake
    fake.httpd.shutdown()
    fake.httpd.server_close()


def config(server: FakeServer, **overrides) -> JobConfig:
    settings = dict(url=server.url, retry_backoff_s=0.01, timeout_s=5.0)
    settings.update(overrides)
    return JobConfig(**settings)


def csv_rows(n: int, width: int = 3, start: int = 0) -> list[bytes]:
    return [b",".join(b"%d" % (i * width + j) for j in range(width)) for i in range(start, start + n)]


def write(path: Path, records: list[bytes], newline: bytes = b"\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(r + newline for r in records))
    return path


def expected_csv(records: list[bytes]) -> bytes:
    return b"".join(csv_output(r) + b"\n" for r in records)


# --- pure functions ----------------------------------------------------------------------


def test_split_records_tolerates_crlf_blank_lines_and_a_missing_final_newline():
    data = b"1,2\r\n\r\n3,4\n   \n5,6"
    assert bt.split_records(data, "Line") == [b"1,2", b"3,4", b"5,6"]
    assert bt.split_records(data, "None") == [data]
    assert bt.split_records(b"", "None") == []


def test_multi_record_fills_each_batch_up_to_the_limit_and_no_further():
    records = [b"x" * 9] * 7  # 10 bytes each with the newline
    batches = list(bt.pack_batches(records, "MULTI_RECORD", 30))
    assert [len(b[1]) for b in batches] == [3, 3, 1]
    assert [b[0] for b in batches] == [0, 3, 6]
    assert all(len(body) <= 30 and error is None for _, _, body, error in batches)
    assert batches[0][2] == b"xxxxxxxxx\n" * 3


def test_single_record_sends_one_record_per_batch():
    records = csv_rows(4)
    batches = list(bt.pack_batches(records, "SINGLE_RECORD", 6 * MB))
    assert [b[1] for b in batches] == [[r] for r in records]
    assert [b[2] for b in batches] == [r + b"\n" for r in records]


def test_a_record_over_the_limit_fails_alone_and_its_neighbours_still_go():
    records = [b"a" * 5, b"b" * 40, b"c" * 5]
    batches = list(bt.pack_batches(records, "MULTI_RECORD", 30))
    assert [(first, recs) for first, recs, _, _ in batches] == [(0, [records[0]]), (1, [records[1]]), (2, [records[2]])]
    errors = [error for *_, error in batches]
    assert errors[0] is None and errors[2] is None
    assert "record 2 is 41 bytes, over MaxPayloadInMB" in errors[1]


def test_no_limit_when_max_payload_is_zero():
    records = [b"r" * 1000] * 100
    batches = list(bt.pack_batches(records, "MULTI_RECORD", None))
    assert len(batches) == 1 and len(batches[0][1]) == 100


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=40), max_size=60),
    limit=st.integers(min_value=5, max_value=120),
)
def test_packing_keeps_every_record_in_order_and_every_batch_maximal(sizes, limit):
    records = [b"%d:" % i + b"x" * size for i, size in enumerate(sizes)]  # distinct, so order shows
    batches = list(bt.pack_batches(records, "MULTI_RECORD", limit))
    assert [r for _, recs, _, _ in batches for r in recs] == records
    for index, (first, recs, body, error) in enumerate(batches):
        assert records[first : first + len(recs)] == recs
        if error:
            assert len(recs) == 1 and len(recs[0]) + 1 > limit
            continue
        assert body == b"".join(r + b"\n" for r in recs) and len(body) <= limit
        # Greedy: the next record would not have fitted into this batch.
        following = first + len(recs)
        if following < len(records) and index + 1 < len(batches) and not batches[index + 1][3]:
            assert len(body) + len(records[following]) + 1 > limit


def test_response_lines_drops_one_final_newline_and_carriage_returns():
    assert bt.response_lines(b"1\r\n2\n") == [b"1", b"2"]
    assert bt.response_lines(b"1\n2") == [b"1", b"2"]
    assert bt.response_lines(b"1\n\n") == [b"1", b""]  # an empty line is still a line
    assert bt.response_lines(b"\n") == [b""]


def test_join_record_follows_sagemakers_documented_rules():
    assert bt.join_record(b"1,2,3", b"0.1,0.9", "csv") == b"1,2,3,0.1,0.9"
    joined = json.loads(bt.join_record(b'{"id": 7, "x": [1, 2]}', b"[0.1, 0.9]", "json"))
    assert joined == {"id": 7, "x": [1, 2], "SageMakerOutput": [0.1, 0.9]}
    # Not a key-value object: SageMaker makes a new one holding input and output.
    joined = json.loads(bt.join_record(b"[1, 2]", b'{"label": "3"}', "json"))
    assert joined == {"SageMakerInput": [1, 2], "SageMakerOutput": {"label": "3"}}
    joined = json.loads(bt.join_record(b'{"a": 1}', b"plain text", "json"))
    assert joined == {"a": 1, "SageMakerOutput": "plain text"}
    with pytest.raises(bt.BatchFailed, match="not JSON"):
        bt.join_record(b"1,2", b"3", "json")


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"split_type": "Lines"}, "SplitType"),
        ({"max_retries": 4}, "InvocationsMaxRetries"),
        ({"max_concurrent_transforms": 0}, "MaxConcurrentTransforms"),
        ({"join_source": "Input", "split_type": "None"}, "SplitType=Line"),
        ({"join_source": "Input", "content_type": "application/x-npy"}, "text/csv and JSON Lines"),
    ],
)
def test_settings_that_cannot_work_are_refused_before_any_request(overrides, message):
    with pytest.raises(bt.ConfigError, match=message):
        JobConfig(**overrides).validate()


def test_execution_parameters_are_used_unless_the_job_overrides_them():
    params = {"MaxConcurrentTransforms": 5, "BatchStrategy": "SINGLE_RECORD", "MaxPayloadInMB": 2}
    cfg = bt.resolve_config(params, {"max_payload_mb": None, "batch_strategy": None})
    assert (cfg.max_concurrent_transforms, cfg.batch_strategy, cfg.max_payload_mb) == (5, "SINGLE_RECORD", 2)
    cfg = bt.resolve_config(params, {"batch_strategy": "MultiRecord", "max_concurrent_transforms": 1})
    assert (cfg.max_concurrent_transforms, cfg.batch_strategy, cfg.max_payload_mb) == (1, "MULTI_RECORD", 2)
    cfg = bt.resolve_config({}, {})
    assert (cfg.max_concurrent_transforms, cfg.batch_strategy, cfg.max_payload_mb) == (1, "MULTI_RECORD", 6)


# --- against the fake server -------------------------------------------------------------


def test_output_keeps_input_order_while_requests_overlap(server, tmp_path):
    records = csv_rows(120)
    source = write(tmp_path / "in" / "data.csv", records)
    server.slow_first_s = 0.3  # the first mini-batch finishes last
    server.delay_s = 0.01
    # One record a request gives many mini-batches to finish out of order.
    cfg = config(server, max_concurrent_transforms=4, batch_strategy="SINGLE_RECORD")
    result = bt.run_job(source, tmp_path / "out", cfg, progress=False)
    assert result.failures == []
    assert result.records == 120 and result.requests == 120
    assert (tmp_path / "out" / "data.csv.out").read_bytes() == expected_csv(records)
    assert 1 < server.max_in_flight <= 4


def test_multi_record_batches_respect_max_payload(server, tmp_path):
    # ~100 KB records: 10 fit in a 1 MB mini-batch, the 11th does not.
    records = [b",".join([b"1"] * 51_199)] * 25
    assert len(records[0]) + 1 == 102_398
    source = write(tmp_path / "big.csv", records)
    cfg = config(server, max_payload_mb=1, max_concurrent_transforms=2)
    result = bt.run_job(source, tmp_path / "out", cfg, progress=False)
    assert result.failures == []
    assert sorted(body.count(b"\n") for body in server.bodies) == [5, 10, 10]
    assert all(len(body) <= MB for body in server.bodies)
    assert (tmp_path / "out" / "big.csv.out").read_bytes() == b"51199\n" * 25


def test_content_type_and_accept_are_sent(server, tmp_path):
    source = write(tmp_path / "a.csv", csv_rows(3))
    cfg = config(server, content_type="text/csv", accept="text/csv")
    bt.run_job(source, tmp_path / "out", cfg, progress=False)
    assert server.content_types == ["text/csv"] and server.accepts == ["text/csv"]


def test_without_accept_the_model_answers_in_its_own_type(server, tmp_path):
    """A job without TransformOutput.Accept: nothing is asked of the model (an image in
    used to ask for the image's own type back, a 406 on every file)."""
    source = tmp_path / "cat.jpg"
    source.write_bytes(b"[1]\n[2]\n")  # (the fake model answers each line; a JPEG is sent as it is all the same)
    cfg = config(server, content_type="image/jpeg", split_type="None")
    bt.run_job(source, tmp_path / "out", cfg, progress=False)
    assert server.content_types == ["image/jpeg"] and server.accepts == ["*/*"]
    assert server.bodies == [source.read_bytes()]  # whole: one file, one request


@pytest.mark.parametrize("content_type, split_type, warned", [
    ("image/jpeg", "Line", True), ("application/x-npy", "Line", True), ("image/jpeg", "None", False),
    ("text/csv", "Line", False), ("application/jsonlines", "Line", False), ("text/plain", "Line", False),
])
def test_splitting_a_binary_type_on_newlines_is_warned_of(content_type, split_type, warned):
    warning = JobConfig(content_type=content_type, split_type=split_type).binary_split_warning()
    assert (warning is not None) == warned
    if warned:
        assert content_type in warning and "--split-type None" in warning


def test_server_errors_and_dropped_connections_are_retried(server, tmp_path):
    records = csv_rows(10)
    source = write(tmp_path / "a.csv", records)
    server.script = ["500", "drop", "503"]
    cfg = config(server, max_retries=3)
    result = bt.run_job(source, tmp_path / "out", cfg, progress=False)
    assert result.failures == []
    assert server.attempts == 4 and server.requests_answered == 1
    assert (tmp_path / "out" / "a.csv.out").read_bytes() == expected_csv(records)


def test_retries_run_out_after_invocations_max_retries(server, tmp_path):
    source = write(tmp_path / "a.csv", csv_rows(3))
    server.script = ["503"] * 10
    result = bt.run_job(source, tmp_path / "out", config(server, max_retries=2), progress=False)
    assert server.attempts == 3
    assert len(result.failures) == 1 and "HTTP 503" in result.failures[0].message
    assert "after 3 attempts" in result.failures[0].message
    assert not (tmp_path / "out" / "a.csv.out").exists()


def test_a_client_error_is_not_retried(server, tmp_path):
    write(tmp_path / "in" / "good.csv", csv_rows(5))
    write(tmp_path / "in" / "bad.csv", csv_rows(2) + [b"bad,row"] + csv_rows(2, start=9))
    cfg = config(server, max_retries=3, max_concurrent_transforms=1)
    result = bt.run_job(tmp_path / "in", tmp_path / "out", cfg, progress=False)
    assert server.attempts == 2  # one per file, no retry of the 400
    assert len(result.failures) == 1
    failure = result.failures[0]
    assert failure.source.name == "bad.csv" and failure.records == 5 and failure.first_record_number == 1
    assert "HTTP 400" in failure.message and "record does not parse" in failure.message
    assert (tmp_path / "out" / "good.csv.out").read_bytes() == expected_csv(csv_rows(5))
    assert not (tmp_path / "out" / "bad.csv.out").exists()
    assert result.records == 5


def test_an_answer_that_ends_early_at_the_same_line_twice_is_reported_not_retried_again(server, tmp_path):
    source = write(tmp_path / "a.csv", csv_rows(5))
    server.script = ["cut2"] * 4  # a model that fails on its second pass, every time
    result = bt.run_job(source, tmp_path / "out", config(server, max_retries=3), progress=False)
    assert server.attempts == 2
    (failure,) = result.failures
    assert "ended early, after 2 of 5 lines" in failure.message
    assert "model failed part-way through" in failure.message and "server's log" in failure.message
    assert "not retried again" in failure.message and "ChunkedEncodingError" not in failure.message
    assert not (tmp_path / "out" / "a.csv.out").exists()


def test_an_answer_that_ends_early_once_is_retried(server, tmp_path):
    records = csv_rows(5)
    source = write(tmp_path / "a.csv", records)
    server.script = ["cut3"]  # a worker that died once; the retry reaches another
    result = bt.run_job(source, tmp_path / "out", config(server, max_retries=3), progress=False)
    assert result.failures == [] and server.attempts == 2
    assert (tmp_path / "out" / "a.csv.out").read_bytes() == expected_csv(records)


def test_answers_that_end_early_at_different_lines_use_up_the_retries(server, tmp_path):
    source = write(tmp_path / "a.csv", csv_rows(5))
    server.script = ["cut0", "cut1", "cut2", "cut3"]
    result = bt.run_job(source, tmp_path / "out", config(server, max_retries=3), progress=False)
    assert server.attempts == 4
    (failure,) = result.failures
    assert "ended early, after 3 of 5 lines" in failure.message and "(after 4 attempts)" in failure.message


def test_a_request_that_outlives_the_timeout_is_retried_then_fails(server, tmp_path):
    source = write(tmp_path / "a.csv", csv_rows(2))
    server.script = ["stall", "stall"]
    cfg = config(server, timeout_s=0.3, max_retries=1)
    result = bt.run_job(source, tmp_path / "out", cfg, progress=False)
    assert server.attempts == 2
    assert len(result.failures) == 1 and "Timeout" in result.failures[0].message


def test_payload_too_large_from_the_server_fails_without_retry(server, tmp_path):
    source = write(tmp_path / "a.csv", csv_rows(100))
    server.max_body = 100
    result = bt.run_job(source, tmp_path / "out", config(server), progress=False)
    assert server.attempts == 1
    assert "HTTP 413" in result.failures[0].message


def test_a_response_with_the_wrong_number_of_lines_fails_loudly(server, tmp_path):
    source = write(tmp_path / "a.csv", csv_rows(6))
    server.lines_short_by = 1
    result = bt.run_job(source, tmp_path / "out", config(server), progress=False)
    assert len(result.failures) == 1
    assert "response has 5 lines for 6 records" in result.failures[0].message
    assert not (tmp_path / "out" / "a.csv.out").exists()


def test_an_oversize_record_fails_and_is_never_sent(server, tmp_path):
    big = b",".join([b"1"] * (MB // 2 + 1))  # over 1 MB by itself
    records = csv_rows(3) + [big] + csv_rows(3, start=3)
    source = write(tmp_path / "a.csv", records)
    cfg = config(server, max_payload_mb=1, max_concurrent_transforms=1)
    result = bt.run_job(source, tmp_path / "out", cfg, progress=False)
    assert all(len(body) < MB for body in server.bodies)
    assert [b.count(b"\n") for b in server.bodies] == [3, 3]
    assert len(result.failures) == 1
    assert result.failures[0].first_record_number == 4 and "over MaxPayloadInMB" in result.failures[0].message


def test_join_source_input_for_csv(server, tmp_path):
    records = csv_rows(50)
    source = write(tmp_path / "a.csv", records, newline=b"\r\n")
    cfg = config(server, join_source="Input", max_concurrent_transforms=3, batch_strategy="SINGLE_RECORD")
    result = bt.run_job(source, tmp_path / "out", cfg, progress=False)
    assert result.failures == []
    expected = b"".join(r + b"," + csv_output(r) + b"\n" for r in records)
    assert (tmp_path / "out" / "a.csv.out").read_bytes() == expected


def test_join_source_input_for_json_lines_objects_and_arrays(server, tmp_path):
    lines = [b'{"id": "a", "x": [1, 2]}', b"[3, 4, 5]", b'{"id": "b", "x": [6]}']
    source = write(tmp_path / "a.jsonl", lines)
    cfg = config(
        server, content_type="application/jsonlines", accept="application/jsonlines", join_source="Input"
    )
    result = bt.run_job(source, tmp_path / "out", cfg, progress=False)
    assert result.failures == []
    out = [json.loads(line) for line in (tmp_path / "out" / "a.jsonl.out").read_text().splitlines()]
    assert out == [
        {"id": "a", "x": [1, 2], "SageMakerOutput": {"sum": 3}},
        {"SageMakerInput": [3, 4, 5], "SageMakerOutput": {"sum": 12}},
        {"id": "b", "x": [6], "SageMakerOutput": {"sum": 6}},
    ]


def test_split_type_none_sends_each_file_whole_and_assemble_none_concatenates(server, tmp_path):
    write(tmp_path / "in" / "one.csv", csv_rows(4))
    write(tmp_path / "in" / "two.csv", csv_rows(2, start=4))
    cfg = config(server, split_type="None", assemble_with="None")
    result = bt.run_job(tmp_path / "in", tmp_path / "out", cfg, progress=False)
    assert result.failures == [] and result.requests == 2 and result.records == 2
    assert (tmp_path / "out" / "one.csv.out").read_bytes() == expected_csv(csv_rows(4))
    assert (tmp_path / "out" / "two.csv.out").read_bytes() == expected_csv(csv_rows(2, start=4))


def test_a_folder_is_walked_and_its_layout_kept_under_the_output(server, tmp_path):
    write(tmp_path / "in" / "top.csv", csv_rows(2))
    write(tmp_path / "in" / "sub" / "deep.csv", csv_rows(3))
    (tmp_path / "in" / "empty.csv").write_bytes(b"")
    # An output folder inside the input folder is not read back as input.
    out = tmp_path / "in" / "results"
    write(out / "stale.csv.out", [b"not input"])
    result = bt.run_job(tmp_path / "in", out, config(server), progress=False)
    assert result.failures == [] and result.records == 5
    assert (out / "top.csv.out").read_bytes() == expected_csv(csv_rows(2))
    assert (out / "sub" / "deep.csv.out").read_bytes() == expected_csv(csv_rows(3))
    assert (out / "empty.csv.out").read_bytes() == b""
    assert not (out / "results").exists()


# --- the command line --------------------------------------------------------------------


def test_main_takes_the_servers_execution_parameters(server, tmp_path, capsys):
    records = csv_rows(30)
    source = write(tmp_path / "a.csv", records)
    server.execution_parameters = {"MaxConcurrentTransforms": 3, "BatchStrategy": "SINGLE_RECORD", "MaxPayloadInMB": 1}
    code = bt.main([str(source), str(tmp_path / "out"), "--url", server.url, "--no-progress"])
    assert code == 0
    assert server.requests_answered == 30  # SINGLE_RECORD, from the server
    assert (tmp_path / "out" / "a.csv.out").read_bytes() == expected_csv(records)
    captured = capsys.readouterr()
    assert "records: 30" in captured.out and "failed mini-batches: 0" in captured.out
    assert "SINGLE_RECORD" in captured.err and "MaxConcurrentTransforms 3" in captured.err


def test_main_flags_override_the_execution_parameters(server, tmp_path):
    source = write(tmp_path / "a.csv", csv_rows(30))
    server.execution_parameters = {"MaxConcurrentTransforms": 3, "BatchStrategy": "SINGLE_RECORD", "MaxPayloadInMB": 1}
    code = bt.main(
        [str(source), str(tmp_path / "out"), "--url", server.url, "--no-progress", "--batch-strategy", "MULTI_RECORD"]
    )
    assert code == 0 and server.requests_answered == 1


def test_main_uses_sagemakers_defaults_without_execution_parameters(server, tmp_path, capsys):
    source = write(tmp_path / "a.csv", csv_rows(5))
    server.execution_parameters = None
    code = bt.main([str(source), str(tmp_path / "out"), "--url", server.url, "--no-progress"])
    assert code == 0
    assert "MaxConcurrentTransforms 1" in capsys.readouterr().err


def test_main_exits_nonzero_when_a_batch_fails(server, tmp_path, capsys):
    source = write(tmp_path / "a.csv", [b"bad"])
    code = bt.main([str(source), str(tmp_path / "out"), "--url", server.url, "--no-progress"])
    assert code == 1
    assert "failed mini-batches: 1" in capsys.readouterr().out


def test_main_exits_2_when_the_server_is_unreachable(tmp_path, capsys):
    source = write(tmp_path / "a.csv", csv_rows(1))
    with ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler) as probe:
        port = probe.server_address[1]  # free once the with-block closes it
    code = bt.main([str(source), str(tmp_path / "out"), "--url", f"http://127.0.0.1:{port}", "--wait", "0.5"])
    assert code == 2
    assert "/ping did not answer 200" in capsys.readouterr().err


def test_output_folder_equal_to_the_input_folder_is_refused(tmp_path):
    (tmp_path / "a.csv").write_text("1,2\n")
    with pytest.raises(bt.ConfigError, match="is the input folder"):
        bt.list_inputs(tmp_path, tmp_path)


# --- --input-name: CSV columns to named inputs --------------------------------------------


@pytest.mark.parametrize("record, inputs, expected", [
    (b"1,2,3", (("x", None),), {"x": [1, 2, 3]}),
    (b"1,2,3", (("a", 2), ("b", None)), {"a": [1, 2], "b": [3]}),
    (b" -4 , 2.5e3 ,.5,1.,+3", (("x", None),), {"x": [-4, 2500.0, 0.5, 1.0, 3.0]}),
    (b"1,2", (("a", 3), ("b", None)), {"a": [1, 2], "b": []}),  # too few: the server's shape check says so
    (b"1,oops,nan", (("x", None),), {"x": [1, "oops", "nan"]}),  # not numbers: the server names the line
])
def test_a_csv_record_becomes_one_json_object_of_named_inputs(record, inputs, expected):
    line = bt.named_record(record, inputs)
    assert b"\n" not in line and json.loads(line) == expected


def test_an_integer_cell_goes_as_written_not_through_a_float():
    assert bt.named_record(b"9007199254740993", (("ids", None),)) == b'{"ids":[9007199254740993]}'


@pytest.mark.parametrize("settings, message", [
    (dict(input_names=(("a", None),), content_type="application/jsonlines"), "for text/csv input"),
    (dict(input_names=(("a", None),), split_type="None"), "split by line"),
    (dict(input_names=(("a", 2), ("a", None))), "named twice"),
    (dict(input_names=(("a", None), ("b", None))), "every input but the last as NAME:COLUMNS"),
    (dict(input_names=(("a", 2), ("b", 3))), "the last input takes the rest"),
])
def test_input_names_that_cannot_work_are_refused_before_any_request(settings, message):
    with pytest.raises(bt.ConfigError, match=message):
        JobConfig(**settings).validate()


@pytest.mark.parametrize("text, parsed", [("x", ("x", None)), ("x:3", ("x", 3)), ("ns:x", ("ns:x", None)),
                                          ("ns:x:2", ("ns:x", 2))])
def test_input_name_flags(text, parsed):
    assert bt.parse_input_name(text) == parsed


def test_named_records_go_as_json_lines_and_join_as_the_csv_they_were(server, tmp_path):
    records = csv_rows(5, width=2)
    source = write(tmp_path / "data.csv", records)
    cfg = config(server, input_names=(("x", None),), accept="application/jsonlines", join_source="Input")
    result = bt.run_job(source, tmp_path / "out", cfg, progress=False)
    assert result.failures == []
    assert server.content_types == ["application/jsonlines"]
    assert server.bodies == [b"".join(b'{"x":[%s]}\n' % r for r in records)]
    out = (tmp_path / "out" / "data.csv.out").read_bytes().splitlines()
    assert out == [r + b"," + json_output(b'{"x":[%s]}' % r) for r in records]


def test_a_refused_named_batch_says_how_it_was_sent(server, tmp_path):
    server.script = ["400"]
    source = write(tmp_path / "data.csv", csv_rows(2))
    cfg = config(server, input_names=(("a", 1), ("b", None)))
    result = bt.run_job(source, tmp_path / "out", cfg, progress=False)
    (failure,) = result.failures
    assert "HTTP 400" in failure.message and "JSON Lines objects of the inputs a, b" in failure.message

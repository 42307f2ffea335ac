"""invoke --stream: InvokeEndpointWithResponseStream, decoded as the parts arrive.

moto has no response-streaming API, so these tests put local_test.runtime.LocalRuntime
where SageMaker would be (its docstring says how it frames the container's chunked
answer as SageMaker's event stream). boto3 in the tool talks to it over HTTP and
decodes the events with botocore's own event-stream parser. Behind it is either a scripted chunked server (to cut parts at awkward places, hold the
stream open, or break it off) or the real server (container/serve) with a model whose
predict_fn yields.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading

import pytest

from deploy.stream import printable
from local_test.runtime import LocalRuntime
from tests.deploy.eventstream import ChunkedServer
from tests.deploy.support import REGION, REPO_ROOT, one_error_line
from tests.helpers.models import STREAMING_HOOKS, model_dir_with

ENDPOINT = "textgen"


@pytest.fixture
def fake_aws(monkeypatch, tmp_path) -> dict:
    """Credentials and a region; nothing from the host's ~/.aws."""
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
    }
    for name in ("AWS_PROFILE", "AWS_REGION", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def start_tool(adapter_url: str, *argv: str) -> subprocess.Popen:
    env = {key: value for key, value in os.environ.items() if key != "AWS_ENDPOINT_URL"}
    return subprocess.Popen(
        [sys.executable, "-m", "deploy", "invoke", "--endpoint-name", ENDPOINT, "--endpoint-url", adapter_url, "--stream", *argv],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def line_reader(stream) -> queue.Queue:
    lines: queue.Queue = queue.Queue()

    def read():
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


# ---------------------------------------------------------------- decoding, unit


def parts(data: bytes, cuts: list[int]):
    edges = [0, *cuts, len(data)]
    return [{"PayloadPart": {"Bytes": data[a:b]}} for a, b in zip(edges, edges[1:])]


JSONL = b'{"token": 0, "text": "w0"}\n{"token": 1, "text": "caf\xc3\xa9"}\n{"token": 2, "text": "w2"}\n'
SSE = b': keep-alive\n\ndata: {"token": 0}\n\nid: 7\ndata: {"token": 1,\ndata:  "more": true}\n\nevent: end\ndata: {}\n\n'


@pytest.mark.parametrize("cut", range(1, len(JSONL)))
def test_json_lines_are_whole_wherever_the_parts_are_cut(cut):
    assert list(printable(parts(JSONL, [cut]), "application/jsonlines")) == [line.decode() for line in JSONL.splitlines()]


@pytest.mark.parametrize("cut", range(1, len(SSE)))
def test_server_sent_events_are_whole_wherever_the_parts_are_cut(cut):
    # Comments, ids and the closing `event: end` are read, not printed; data lines join.
    assert list(printable(parts(SSE, [cut]), "text/event-stream")) == ['{"token": 0}', '{"token": 1,\n "more": true}']


def test_text_is_printed_part_by_part_without_splitting_a_character():
    text = "généré".encode()
    printed = list(printable(parts(text, [1, 2, 3]), "text/plain; charset=utf-8"))
    assert "".join(printed) == "généré\n"
    assert printed[:2] == ["g", "é"]  # é's two bytes came in two parts: printed once both are there


def test_binary_answers_are_decoded_once_whole():
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, np.arange(6, dtype="<f4").reshape(2, 3))
    [printed] = printable(parts(buffer.getvalue(), [3, 70]), "application/x-npy")
    assert json.loads(printed) == {"shape": [2, 3], "dtype": "float32", "data": [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]}


# ---------------------------------------------------------------- through boto3 and the adapter


def test_stream_prints_each_record_while_the_stream_is_still_open(fake_aws, tmp_path):
    gate = threading.Event()
    script = [b'{"token": 0, "text": "w0"}\n{"tok', b'en": 1, "text": "w1"}\n', gate, b'{"token": 2, "text": "w2"}\n']
    request = tmp_path / "prompt.json"
    request.write_bytes(b'{"n": 3}')
    with ChunkedServer("application/jsonlines", script) as container, LocalRuntime(container.url) as adapter:
        tool = start_tool(adapter.url, "--input", str(request), "--accept", "application/jsonlines")
        lines = line_reader(tool.stdout)
        try:
            # Two records arrive while the container still holds the third back.
            assert json.loads(lines.get(timeout=30)) == {"token": 0, "text": "w0"}
            assert json.loads(lines.get(timeout=30)) == {"token": 1, "text": "w1"}
            assert lines.empty()
            gate.set()
            assert json.loads(lines.get(timeout=30)) == {"token": 2, "text": "w2"}
            assert lines.get(timeout=30) is None
            assert tool.wait(30) == 0, tool.stderr.read()
        finally:
            gate.set()
            tool.kill()
        # What the tool sent, as SageMaker's API receives it.
        [sent] = adapter.requests
        assert sent["path"] == f"/endpoints/{ENDPOINT}/invocations-response-stream"
        assert sent["headers"]["Content-Type"] == "application/json"
        assert sent["headers"]["X-Amzn-SageMaker-Accept"] == "application/jsonlines"
        assert sent["body"] == b'{"n": 3}'
        assert "/sagemaker/aws4_request" in sent["headers"]["Authorization"]  # signed for SageMaker
        # ...and what the container got from "SageMaker".
        [relayed] = container.requests
        assert (relayed["headers"]["Content-Type"], relayed["headers"]["Accept"], relayed["body"]) == (
            "application/json", "application/jsonlines", b'{"n": 3}')
        assert len(adapter.parts) >= 3  # really relayed in parts, not as one body


def test_sse_error_event_from_the_container_is_one_line_and_exit_1(fake_aws, cli_in_process):
    script = [b'data: {"token": 0}\n\n', b'event: error\ndata: {"error": "CUDA out of memory"}\n\n']
    with ChunkedServer("text/event-stream", script) as container, LocalRuntime(container.url) as adapter:
        status, out, err = cli_in_process(adapter.url, "--array", "[[1]]", "--accept", "text/event-stream")
    assert status == 1
    assert out == '{"token": 0}\n'  # what came before the failure was printed
    assert one_error_line(err) == "error: the model's stream failed: CUDA out of memory"


def test_a_stream_broken_off_is_a_model_stream_error(fake_aws, cli_in_process):
    script = [b'{"token": 0}\n', "break"]
    with ChunkedServer("application/jsonlines", script) as container, LocalRuntime(container.url) as adapter:
        status, out, err = cli_in_process(adapter.url, "--array", "[[1]]")
    assert status == 1
    assert out == '{"token": 0}\n'
    assert one_error_line(err) == "error: the model's stream failed: ModelStreamError: the model's response stream broke off: IncompleteRead"


def test_a_refused_request_is_sagemakers_model_error(fake_aws, cli_in_process):
    """The container's 4xx comes before any part: SageMaker answers ModelError (424), no stream."""
    error_server = _ErrorServer(415, b'{"error": "unsupported Content-Type text/x-foo"}')
    with error_server, LocalRuntime(error_server.url) as adapter:
        status, out, err = cli_in_process(adapter.url, "--array", "[[1]]")
    assert (status, out) == (1, "")
    line = one_error_line(err)
    assert line.startswith("error: InvokeEndpointWithResponseStream failed: ModelError: Received client error (415)")
    assert "unsupported Content-Type text/x-foo" in line


class _ErrorServer(ChunkedServer):
    def __init__(self, status: int, body: bytes):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def cli_in_process(capsys):
    from deploy.cli import main

    def run(adapter_url: str, *argv: str):
        capsys.readouterr()
        status = main(["invoke", "--endpoint-name", ENDPOINT, "--endpoint-url", adapter_url, "--stream", *argv])
        out, err = capsys.readouterr()
        return status, out, err

    return run


# ---------------------------------------------------------------- the real server


@pytest.fixture(scope="module")
def streaming_server(tmp_path_factory):
    from tests.helpers.server import ServerProcess

    model_dir = model_dir_with(tmp_path_factory.mktemp("streaming-model"), STREAMING_HOOKS, "words")
    log = tmp_path_factory.mktemp("streaming-log") / "server.log"
    with ServerProcess(model_dir, log_path=log) as server:
        yield server


@pytest.mark.slow
@pytest.mark.parametrize(("accept", "printed"), [
    ("application/jsonlines", ['{"token":0,"text":"w0"}', '{"token":1,"text":"w1"}', '{"token":2,"text":"w2"}']),
    ("text/event-stream", ['{"token":0,"text":"w0"}', '{"token":1,"text":"w1"}', '{"token":2,"text":"w2"}']),
])
def test_stream_from_the_real_server(fake_aws, streaming_server, tmp_path, accept, printed):
    request = tmp_path / "prompt.json"
    request.write_text(json.dumps({"n": 3, "pause": 0.3}))
    with LocalRuntime(streaming_server.url) as adapter:
        tool = start_tool(adapter.url, "--input", str(request), "--accept", accept)
        lines = line_reader(tool.stdout)
        try:
            got = []
            while (line := lines.get(timeout=60)) is not None:
                got.append(line.rstrip("\n"))
            assert tool.wait(30) == 0, tool.stderr.read()
        finally:
            tool.kill()
    assert [json.loads(line) for line in got] == [json.loads(line) for line in printed]
    # Each record left the server in its own chunk, 0.3 s apart: relayed as separate parts.
    assert len(adapter.parts) >= 3

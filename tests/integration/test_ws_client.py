"""local_test/ws_client.py, run as a user runs it (a subprocess) against real servers:
the digits classifier's default sessions and the textgen example's stream_fn."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.server import ROOT, ServerProcess, copy_model
from local_test.ws_client import exit_status, fragments, session_url

pytestmark = pytest.mark.slow

PAYLOADS = ROOT / "local_test" / "payloads"
# Each character the textgen session sends waits this long first, so a streamed answer
# takes long enough to see it arrive piece by piece.
CHAR_DELAY_S = 0.02
SLOW_STREAM = f'''

import time as _time

_stream_fn = stream_fn


def stream_fn(messages, model, context):
    for answer in _stream_fn(messages, model, context):
        yield answer if isinstance(answer, dict) else _slowly(answer)


def _slowly(chars):
    for char in chars:
        _time.sleep({CHAR_DELAY_S})
        yield char
'''


def client(server: ServerProcess, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "local_test.ws_client", "--url", f"ws://127.0.0.1:{server.port}",
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def textgen_server(textgen_dir, tmp_path_factory):
    """The textgen example, its stream_fn slowed to CHAR_DELAY_S a character."""
    work = tmp_path_factory.mktemp("textgen")
    model = copy_model(textgen_dir, work / "model")
    script = model / "code" / "inference.py"
    script.write_text(script.read_text() + SLOW_STREAM)
    with ServerProcess(model, log_path=work / "server.log").start() as server:
        yield server


@pytest.fixture(scope="module")
def npy_file(tmp_path_factory) -> Path:
    from sklearn.datasets import load_digits

    path = tmp_path_factory.mktemp("npy") / "rows.npy"
    np.save(path, load_digits().data[:5].astype(np.float32))
    return path


# ---------------------------------------------------------------- the helpers


def test_the_url_defaults_to_the_bidirectional_path_and_takes_the_query():
    assert session_url("ws://localhost:8080", None) == "ws://localhost:8080/invocations-bidirectional-stream"
    assert session_url("http://h:1/", "a=1&b=2") == "ws://h:1/invocations-bidirectional-stream?a=1&b=2"
    assert session_url("localhost:9", "?b=2") == "ws://localhost:9/invocations-bidirectional-stream?b=2"
    assert session_url("wss://h/other?a=1", "b=2") == "wss://h/other?a=1&b=2"


def test_fragments_keep_the_message_whole():
    assert fragments("abcdefg", 3) == ["ab", "cd", "efg"]
    assert b"".join(fragments(b"\x00" * 10, 4)) == b"\x00" * 10
    assert fragments("ab", 3) == ["", "a", "b"]


def test_exit_status_is_the_close_code_less_1000():
    assert [exit_status(c) for c in (1000, 1001, 1008, 1011, 1006, 4000, None)] == [0, 1, 8, 11, 6, 255, 255]


def test_default_port_comes_from_sagemaker_bind_to_port():
    result = subprocess.run([sys.executable, "-m", "local_test.ws_client", "--help"], cwd=ROOT, capture_output=True,
                            text=True, env={**os.environ, "SAGEMAKER_BIND_TO_PORT": "9123"}, timeout=30)
    assert "ws://localhost:9123" in result.stdout


# ---------------------------------------------------------------- digits: default sessions


def test_a_json_message_gets_its_predictions(example_server):
    result = client(example_server, "--json", str(PAYLOADS / "digits.json"), "--ping")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith('{"predictions":[[')
    assert "ping: " in result.stderr and " ms" in result.stderr
    assert result.stderr.rstrip().endswith("closed: 1000")


def test_a_fragmented_npy_message_is_answered_like_a_whole_one(example_server, npy_file):
    whole = client(example_server, "--npy", str(npy_file))
    fragmented = client(example_server, "--npy", str(npy_file), "--fragment", "4", "--repeat", "2")
    assert whole.returncode == 0 and fragmented.returncode == 0, fragmented.stderr
    assert whole.stdout.startswith("array float32 [5, 10]:\n[[")
    assert fragmented.stdout == whole.stdout * 2


def test_messages_are_answered_in_order(example_server, npy_file, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"instances": [[1, 2]]}')
    result = client(example_server, "--text", "not json", "--npy", str(npy_file), "--json", str(bad))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith('{"error":"request body is not valid JSON') and lines[0].endswith('"status":400}')
    assert lines[1] == "array float32 [5, 10]:"
    assert '"status":400' in lines[-1] and "64" in lines[-1]


def test_a_bad_query_option_exits_8_with_the_1008_reason(example_server):
    result = client(example_server, "--query", "colour=blue", "--text", "{}")
    assert result.returncode == 8
    assert "closed: 1008 unsupported query option(s) colour; supported: content-type, accept" in result.stderr
    assert result.stdout == ""


def test_no_server_exits_255():
    result = subprocess.run([sys.executable, "-m", "local_test.ws_client", "--url", "ws://127.0.0.1:9", "--text", "x"],
                            cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert result.returncode == 255
    assert "no session" in result.stderr


# ---------------------------------------------------------------- textgen: a stream_fn session


def test_a_prompt_is_streamed_back_piece_by_piece(textgen_server):
    tokens = 40
    process = subprocess.Popen(
        [sys.executable, "-m", "local_test.ws_client", "--url", f"ws://127.0.0.1:{textgen_server.port}",
         "--query", f"max_tokens={tokens}&seed=7", "--text", "The iris"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    arrivals: list[tuple[float, bytes]] = []

    def read():
        while data := os.read(process.stdout.fileno(), 4096):
            arrivals.append((time.monotonic(), data))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        process.wait(60)
    finally:
        process.kill()
        reader.join(10)
    stderr = process.stderr.read().decode()
    assert process.returncode == 0, stderr
    assert stderr.rstrip().endswith("closed: 1000")
    text = b"".join(data for _, data in arrivals).decode()
    assert len(text) == tokens + 1 and text.endswith("\n")
    # Printed as it came: the first characters were out well before the last.
    assert len(arrivals) > 3
    assert arrivals[-1][0] - arrivals[0][0] > tokens * CHAR_DELAY_S / 2


def test_a_seeded_session_replays(textgen_server):
    args = ("--query", "max_tokens=15&seed=3", "--text", "The iris", "--text", "")
    first, second = client(textgen_server, *args), client(textgen_server, *args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout and len(first.stdout) == 2 * 16


def test_a_bad_textgen_option_exits_8_with_the_model_s_reason(textgen_server):
    result = client(textgen_server, "--query", "max_tokens=lots", "--text", "The iris")
    assert result.returncode == 8
    assert "closed: 1008 bad query option: 'max_tokens' must be an integer, not 'lots'" in result.stderr

"""invoke --bidirectional where its client cannot run (Python 3.11), and the records it would send.

AWS's client for InvokeEndpointWithBidirectionalStream (aws-sdk-sagemaker-runtime-http2)
needs Python >= 3.12, so it is not a dependency of this 3.11 project. Here: the records
become payload parts as SageMaker maps them to WebSocket messages (one line, one UTF8
part), and without the client the command says what it needs in one line, before any
AWS call. The SDK path itself was run by hand under Python 3.12 with the package
installed, as far as the network (see the deploy report); it needs AWS to go further.
"""

from __future__ import annotations

import sys

import pytest

from deploy.bidirectional import payload_parts
from tests.deploy.support import one_error_line


def test_each_line_is_one_utf8_part(tmp_path):
    records = tmp_path / "chat.jsonl"
    records.write_bytes(b'{"prompt": "caf\xc3\xa9"}\n\n{"prompt": "next"}\r\n')
    assert payload_parts(records, None) == [(b'{"prompt": "caf\xc3\xa9"}', "UTF8"), (b'{"prompt": "next"}', "UTF8")]


def test_a_binary_file_is_one_binary_part(tmp_path):
    blob = tmp_path / "audio.raw"
    blob.write_bytes(b"\x00\x01\n\x02")
    assert payload_parts(blob, "application/octet-stream") == [(b"\x00\x01\n\x02", "BINARY")]


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the refusal is for Python < 3.12")
def test_without_the_client_the_command_says_what_it_needs(aws_env, cli, tmp_path):
    records = tmp_path / "chat.jsonl"
    records.write_text('{"prompt": "hi"}\n')
    aws_env.start_recording()
    status, out, err = cli("invoke", "--endpoint-name", "chat", "--input", str(records), "--bidirectional")
    assert (status, out) == (1, "")
    assert one_error_line(err) == (
        "error: invoke --bidirectional needs aws-sdk-sagemaker-runtime-http2 (AWS's HTTP/2 client; boto3 has none), which needs "
        f"Python >= 3.12 and this is 3.{sys.version_info.minor}: see docs/deploy.md, 'Bidirectional streaming'"
    )
    assert aws_env.recorded() == []


def test_bidirectional_takes_a_file(aws_env, cli):
    status, _, err = cli("invoke", "--endpoint-name", "chat", "--array", "[[1]]", "--bidirectional")
    assert status == 1 and one_error_line(err) == "error: --bidirectional sends a file's records: pass --input FILE"

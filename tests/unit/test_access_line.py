"""The text access line: whatever a request's target or id holds, it cannot forge the
line's other fields."""

from __future__ import annotations

import json
import logging
import re
import time

import pytest

from smserve.http import access

# remote "METHOD PATH" status bytes latency id=ID, the quoted part read as a JSON string
LINE = re.compile(r'(\S+) "((?:[^"\\]|\\.)*)" (\d+) (\d+) ([\d.]+)ms id=(\S+|"(?:[^"\\]|\\.)*")')


def access_line(caplog, path: str, inference_id: str | None = None) -> str:
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "REMOTE_ADDR": "10.0.0.1"}
    if inference_id is not None:
        environ["HTTP_X_AMZN_SAGEMAKER_INFERENCE_ID"] = inference_id
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="smserve.access"):
        access.log_request(environ, 404, 0, time.monotonic(), route="unmatched")
    [record] = caplog.records
    return record.getMessage()


@pytest.mark.parametrize("path", [
    '/x"_200_0_0.1ms_id=forged"',  # a '"' ended the quotes: `"GET /x"_200_..."" 404` read as a 200
    '/x" 200 0 0.1ms id=forged',
    "/x\\\" 200",
    "/caf\u00e9\x07",
    "/plain/path%20with%22escapes",
])
def test_the_path_cannot_end_its_quotes(caplog, path):
    line = access_line(caplog, path)
    match = LINE.fullmatch(line)
    assert match is not None, line
    remote, request, status, sent, _, inference_id = match.groups()
    assert (remote, status, sent, inference_id) == ("10.0.0.1", "404", "0", "-")
    assert json.loads(f'"{request}"') == f"GET {path}"


def test_a_plain_path_and_id_are_written_as_they_are(caplog):
    assert access_line(caplog, "/models/a%2Fb/invoke", "inf-42").startswith('10.0.0.1 "GET /models/a%2Fb/invoke" 404 0 ')
    assert access_line(caplog, "/ping", "inf-42").endswith(" id=inf-42")

"""Both streaming APIs against the real image, as SageMaker reaches it: a WebSocket
session at /invocations-bidirectional-stream on port 8080 and a chunked answer."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import requests
from websockets.sync.client import connect as ws_connect

WS_PATH = "/invocations-bidirectional-stream"


def _ws_url(container, query: str = "") -> str:
    return container.url(WS_PATH).replace("http://", "ws://") + (f"?{query}" if query else "")


@pytest.mark.container
def test_image_is_labelled_for_bidirectional_streaming(podman, image):
    import subprocess

    labels = json.loads(subprocess.run([podman, "image", "inspect", "--format", "{{json .Labels}}", image],
                                       capture_output=True, text=True, check=True).stdout)
    assert labels.get("com.amazonaws.sagemaker.capabilities.bidirectional-streaming") == "true"


@pytest.mark.container
def test_a_websocket_session_with_the_image(serving):
    x = np.arange(128, dtype=np.float32).reshape(2, 64) % 17
    buf = io.BytesIO()
    np.save(buf, x)
    with ws_connect(_ws_url(serving), max_size=None) as ws:
        ws.send(json.dumps({"instances": x.tolist()}))
        as_json = np.asarray(json.loads(ws.recv(timeout=30))["predictions"])
        ws.send([buf.getvalue()[:50], buf.getvalue()[50:]])  # a fragmented binary message
        as_npy = np.load(io.BytesIO(ws.recv(timeout=30)), allow_pickle=False)
        assert ws.ping().wait(10)
    assert as_json.shape == (2, 10) and np.allclose(as_json, as_npy, atol=1e-6)
    assert requests.post(serving.url("/ping"), timeout=10).status_code == 200


@pytest.mark.container
@pytest.mark.slow
def test_textgen_streams_from_the_image(start_container, textgen_dir):
    container = start_container(textgen_dir)
    with requests.post(container.url("/invocations"), json={"prompt": "The", "max_tokens": 20, "seed": 3},
                       headers={"Accept": "text/plain"}, stream=True, timeout=60) as r:
        assert r.status_code == 200 and r.headers["Transfer-Encoding"] == "chunked"
        chunks = list(r.raw.read_chunked(decode_content=False))
    assert len(chunks) == 20
    with ws_connect(_ws_url(container, "max_tokens=20&seed=3")) as ws:
        ws.send("The")
        pieces = list(ws.recv_streaming())
    assert len("".join(pieces)) == 20 and len(pieces) == 21  # a frame a character, then the final one

"""The tool's invoke encodings against the real local server and the example model.

The server is the suite's shared one (tests/conftest.py `example_server`: container/serve
serve, gunicorn, the digits model in build/model). Bodies are built and read by
deploy.codec, the functions `python -m deploy invoke` uses, and travel by plain HTTP;
this checks the bytes moto cannot carry (arbitrary FP32 blobs, npy) and that the model
answers them sensibly: the predicted class is the digit's label for most samples.
"""

from __future__ import annotations

import numpy as np
import pytest
import requests

from deploy import codec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(example_server) -> str:
    return example_server.url


@pytest.fixture(scope="module")
def pixels_and_labels(digits):
    """The example model's held-out digits: pixels FP32 [n, 64] (0..16), labels [n]."""
    x_test, y_test = digits
    return np.asarray(x_test, dtype=np.float32), np.asarray(y_test)


def post(url: str, body: bytes, content_type: str, accept: str | None = None):
    headers = {"Content-Type": content_type}
    if accept:
        headers["Accept"] = accept
    response = requests.post(f"{url}/invocations", data=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text[:500]
    return codec.decode(response.content, response.headers["Content-Type"]), response.headers["Content-Type"]


def probabilities(url: str, pixels: np.ndarray, content_type: str, accept: str | None) -> np.ndarray:
    """Send the pixels as content_type, read the answer as accept; the [n, 10] probabilities."""
    body, sent_type = codec.encode(pixels, content_type, input_name="pixels")
    decoded, response_type = post(url, body, sent_type, accept)
    if content_type == codec.V2_BINARY:
        # Every output was asked for in binary, so the answer is the binary form with its N.
        assert codec.header_size(response_type) is not None, response_type
        assert set(decoded) == {"probabilities"}
        return decoded["probabilities"]
    assert codec.media_type(response_type) == accept
    if accept == codec.JSON and content_type == codec.JSON:
        decoded = decoded["predictions"]  # {"instances": ...} in: wrapped; any other body: the bare rows
    return np.asarray(decoded, dtype=np.float32)


@pytest.fixture(scope="module")
def json_probabilities(server, pixels_and_labels):
    return probabilities(server, pixels_and_labels[0], codec.JSON, codec.JSON)


@pytest.mark.parametrize(
    ("content_type", "accept"),
    [
        (codec.V2_BINARY, None),
        (codec.JSON, codec.JSON),
        (codec.CSV, codec.CSV),
        (codec.JSONLINES, codec.JSONLINES),
        (codec.NPY, codec.NPY),
        (codec.CSV, codec.NPY),
        (codec.NPY, codec.JSON),
    ],
)
def test_each_encoding_classifies_digits(server, pixels_and_labels, json_probabilities, content_type, accept):
    pixels, labels = pixels_and_labels
    got = probabilities(server, pixels, content_type, accept)
    assert got.shape == (len(labels), 10)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-4)
    accuracy = float(np.mean(got.argmax(axis=1) == labels))
    assert accuracy >= 0.9, accuracy
    # The same model on the same pixels: the encoding must not change the answer.
    np.testing.assert_allclose(got, json_probabilities, rtol=1e-5, atol=1e-6)

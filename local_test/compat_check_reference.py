"""The reference side of `make compat-check`: a model folder served by the AWS toolkit's
own handler (sagemaker-pytorch-inference's HandlerService on sagemaker-inference),
loaded and called by TorchServe's real Python backend (its `ts` package), on a small
HTTP server that stands in for TorchServe's Java frontend.

What the frontend and the DLC's start script do, and so this module does:
- the worker's PYTHONPATH starts with `<model_dir>/code`
  (sagemaker_pytorch_serving_container/torchserve.py `_set_python_path`): the caller
  sets it, since it must be there before the interpreter starts;
- `decode_input_request=false` (the toolkit's etc/default-ts.properties) reaches the
  worker as TS_DECODE_INPUT_REQUEST=false: the body stays bytes (ts/protocol/
  otf_message_handler.py `_retrieve_input_data`);
- the worker loads the handler with ts/model_loader.py's TsModelLoader and a metrics
  cache from ts/configs/metrics.yaml (ts/model_service_worker.py `load_model`), then
  calls `Service.predict` with the frontend's batch: `requestId`, one parameter `body`
  with the request's Content-Type, and every request header (ts/service.py
  `retrieve_data_for_inference`);
- the answer is decoded from the frame `create_predict_response` writes
  (ts/protocol/otf_message_handler.py): per request its status, Content-Type and body
  (bytes as is, str as UTF-8, anything else as JSON); a failed batch gives its code
  and message to every request;
- one request at a time: the DLC's default batch size is 1, and one worker handles one
  batch at a time.

Run as `python -P local_test/compat_check_reference.py MODEL_DIR PORT` (local_test/
compat_check.py starts it): GET /ping answers 200 once the model has loaded,
POST /invocations answers as the DLC would.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HANDLER = "sagemaker_pytorch_serving_container.handler_service"
MODEL_NAME = "model"  # the name the DLC's start script registers the model under


def load_service(model_dir: str):
    """The ts Service holding the toolkit's handler, initialized as TorchServe's worker does."""
    os.environ["TS_DECODE_INPUT_REQUEST"] = "false"
    import torch
    import ts
    from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
    from ts.model_loader import ModelLoaderFactory

    metrics = MetricsCacheYamlImpl(config_file_path=os.path.join(os.path.dirname(ts.__file__), "configs", "metrics.yaml"))
    metrics.initialize_cache()
    metrics.model_name = MODEL_NAME
    gpu = 0 if torch.cuda.is_available() else None
    service = ModelLoaderFactory.get_model_loader().load(MODEL_NAME, model_dir, HANDLER, gpu, 1, None, True, metrics)
    service.set_cl_socket(None)
    return service


def decode_predict_response(frame: bytes) -> list[tuple[int, str, bytes]]:
    """(status, Content-Type, body) per request, from create_predict_response's frame."""
    pos = 0

    def read_int() -> int:
        nonlocal pos
        (value,) = struct.unpack_from("!i", frame, pos)
        pos += 4
        return value

    def read_bytes() -> bytes:
        nonlocal pos
        length = read_int()
        pos += length
        return frame[pos - length:pos]

    code = read_int()
    message = read_bytes()
    answers = []
    while True:
        id_length = read_int()
        if id_length == -1:
            break
        pos += id_length
        content_type = read_bytes().decode()
        status = read_int()
        read_bytes()  # the reason phrase
        for _ in range(read_int()):  # response headers: name, value
            read_bytes(), read_bytes()
        body = read_bytes()
        # A failed batch carries b"error" per request; the frontend answers its message.
        answers.append((status, content_type, body) if code == 200 else (code, "text/plain", message))
    return answers


class ReferenceServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, service):
        super().__init__(("127.0.0.1", port), Handler)
        self.service = service
        self.lock = threading.Lock()

    def invoke(self, body: bytes, headers: list[tuple[str, str]]) -> tuple[int, str, bytes]:
        content_type = next((v for k, v in headers if k.lower() == "content-type"), "")
        batch = [{
            "requestId": str(uuid.uuid4()).encode(),
            "parameters": [{"name": "body", "contentType": content_type, "value": body}],
            "headers": [{"name": k.encode(), "value": v.encode()} for k, v in headers],
        }]
        with self.lock:
            return decode_predict_response(bytes(self.service.predict(batch)))[0]


class Handler(BaseHTTPRequestHandler):
    server: ReferenceServer

    def do_GET(self):
        self._answer(200 if self.path == "/ping" else 404, "", b"")

    def do_POST(self):
        if self.path != "/invocations":
            self._answer(404, "", b"")
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(*self.server.invoke(body, list(self.headers.items())))

    def _answer(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass  # the handler's own logs are what a reader of this process's output wants


def main() -> None:
    model_dir, port = sys.argv[1], int(sys.argv[2])
    # as ts/model_service_worker.py logs: the handler's tracebacks land in toolkit.log
    logging.basicConfig(stream=sys.stdout, format="%(message)s", level=logging.INFO)
    service = load_service(model_dir)
    ReferenceServer(port, service).serve_forever()


if __name__ == "__main__":
    main()

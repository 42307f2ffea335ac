"""SageMaker's runtime API in front of a local server: what boto3's `sagemaker-runtime`
calls reach, played on this machine, so that client code (`python -m deploy invoke`,
your own boto3) runs against `make serve` or `make run` unchanged.

    runtime = LocalRuntime("http://127.0.0.1:8080").start()
    boto3.client("sagemaker-runtime", endpoint_url=runtime.url, ...).invoke_endpoint(...)

It does what SageMaker does between a client and a custom container, as documented:

- InvokeEndpoint (POST /endpoints/NAME/invocations) becomes POST /invocations (or
  /models/TARGET/invoke with a TargetModel: a multi-model endpoint), with the body, its
  Content-Type and Accept, and SageMaker's headers the container reads: CustomAttributes,
  InferenceId, TargetModel and SessionId. The answer's body and Content-Type come back,
  with the container's CustomAttributes, NewSessionId and ClosedSessionId headers.
- InvokeEndpointWithResponseStream (…/invocations-response-stream, the wanted type in
  X-Amzn-SageMaker-Accept) relays the container's chunked answer as it comes: each piece
  one PayloadPart event of an `application/vnd.amazon.eventstream` response (the
  container's Content-Type in X-Amzn-SageMaker-Content-Type); a body broken off becomes
  a ModelStreamError event (ErrorCode StreamBroken, SageMaker's for a reset).
- A container answer other than 200 becomes SageMaker's ModelError: HTTP 424, the
  container's status and body as OriginalStatusCode and OriginalMessage.

Event-stream messages are framed as the AWS event stream encoding specifies: total
length and headers length (big-endian u32), the CRC32 of those 8 bytes, the headers
(name length u8, name, type 7 = string, value length u16, value), the payload, and the
CRC32 of everything before it; botocore's own decoder reads them on the client's side.
It is a stand-in for trying client code, not SageMaker: no auth, one endpoint (any name).
"""

from __future__ import annotations

import http.client
import json
import re
import struct
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, unquote, urlparse

# What SageMaker passes on to the container, both ways.
REQUEST_HEADERS = ("X-Amzn-SageMaker-Custom-Attributes", "X-Amzn-SageMaker-Inference-Id",
                   "X-Amzn-SageMaker-Session-Id")
ANSWER_HEADERS = ("X-Amzn-SageMaker-Custom-Attributes", "X-Amzn-SageMaker-New-Session-Id",
                  "X-Amzn-SageMaker-Closed-Session-Id")
TARGET_MODEL = "X-Amzn-SageMaker-Target-Model"
_PATH = re.compile(r"^/endpoints/([^/]+)/(invocations|invocations-response-stream)$")


def event_message(headers: dict[str, str], payload: bytes) -> bytes:
    encoded = b"".join(
        struct.pack(">B", len(name)) + name.encode() + b"\x07" + struct.pack(">H", len(value.encode())) + value.encode()
        for name, value in headers.items()
    )
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack(">II", total, len(encoded))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + encoded + payload
    return message + struct.pack(">I", zlib.crc32(message))


def payload_part(data: bytes) -> bytes:
    return event_message({":message-type": "event", ":event-type": "PayloadPart",
                          ":content-type": "application/octet-stream"}, data)


def model_stream_error(message: str, code: str = "StreamBroken") -> bytes:
    body = json.dumps({"Message": message, "ErrorCode": code}).encode()
    return event_message({":message-type": "exception", ":exception-type": "ModelStreamError",
                          ":content-type": "application/json"}, body)


class PostServer:
    """A local HTTP/1.1 server on a thread of its own (port 0: a free one) whose every
    POST, recorded in `requests` (method, path, headers, body), goes to post(handler,
    body). Started and stopped by `with`."""

    def __init__(self, port: int = 0):
        self.requests: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.requests.append({"method": "POST", "path": self.path, "headers": dict(self.headers),
                                       "body": body})
                owner.post(self, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def post(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        raise NotImplementedError

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class LocalRuntime(PostServer):
    """boto3 -> this stand-in -> the container at `upstream` (http://host:port)."""

    def __init__(self, upstream: str, port: int = 0):
        super().__init__(port)
        self.upstream = urlparse(upstream)
        self.parts: list[bytes] = []  # the payload parts relayed, in order

    def post(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        found = _PATH.match(handler.path)
        if found is None:
            handler.send_error(404)
            return
        self._relay(handler, body, streaming=found.group(2) != "invocations")

    def _relay(self, handler: BaseHTTPRequestHandler, body: bytes, streaming: bool) -> None:
        headers = {"Content-Type": handler.headers.get("Content-Type", "application/octet-stream")}
        accept = handler.headers.get("X-Amzn-SageMaker-Accept" if streaming else "Accept")
        if accept:
            headers["Accept"] = accept
        for name in REQUEST_HEADERS:
            if handler.headers.get(name) is not None:
                headers[name] = handler.headers[name]
        target = handler.headers.get(TARGET_MODEL)
        path = f"/models/{quote(unquote(target), safe='')}/invoke" if target else "/invocations"
        connection = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=600)
        try:
            connection.request("POST", path, body=body, headers=headers)
            answer = connection.getresponse()
            if answer.status != 200:
                self._model_error(handler, answer)
            elif streaming:
                self._stream(handler, answer)
            else:
                self._whole(handler, answer)
        finally:
            connection.close()

    @staticmethod
    def _model_error(handler, answer) -> None:
        original = answer.read().decode("utf-8", "replace")
        error = {"message": f"Received client error ({answer.status}) from primary with message \"{original}\".",
                 "OriginalStatusCode": answer.status, "OriginalMessage": original}
        payload = json.dumps(error).encode()
        handler.send_response(424)
        handler.send_header("x-amzn-ErrorType", "ModelError")
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    @staticmethod
    def _whole(handler, answer) -> None:
        payload = answer.read()
        handler.send_response(200)
        handler.send_header("Content-Type", answer.getheader("Content-Type", "application/octet-stream"))
        handler.send_header("x-Amzn-Invoked-Production-Variant", "AllTraffic")
        for name in ANSWER_HEADERS:
            if answer.getheader(name) is not None:
                handler.send_header(name, answer.getheader(name))
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def _stream(self, handler, answer) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/vnd.amazon.eventstream")
        handler.send_header("X-Amzn-SageMaker-Content-Type", answer.getheader("Content-Type", "application/octet-stream"))
        handler.send_header("x-Amzn-Invoked-Production-Variant", "AllTraffic")
        if answer.getheader("X-Amzn-SageMaker-Custom-Attributes") is not None:
            handler.send_header("X-Amzn-SageMaker-Custom-Attributes", answer.getheader("X-Amzn-SageMaker-Custom-Attributes"))
        # Chunked, as the service answers: urllib3 hands a chunked body over chunk by
        # chunk, where it reads a close-delimited one in 64 KiB blocks.
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()

        def send(message: bytes) -> None:
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(message), message))
            handler.wfile.flush()

        try:
            while True:
                piece = answer.read1(65536)  # what has arrived, without waiting for more
                if not piece:
                    break
                self.parts.append(piece)
                send(payload_part(piece))
        except (http.client.IncompleteRead, ConnectionError, OSError) as error:
            send(model_stream_error(f"the model's response stream broke off: {type(error).__name__}"))
        finally:
            handler.wfile.write(b"0\r\n\r\n")
            handler.close_connection = True

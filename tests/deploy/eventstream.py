"""A local stand-in for SageMaker's response streaming, for `invoke --stream` tests.

moto does not implement InvokeEndpointWithResponseStream, so `SageMakerStreamAdapter`
plays SageMaker's part between boto3 and a real HTTP server, doing what SageMaker
documents for custom containers ("the container streams by answering with
Transfer-Encoding: chunked; SageMaker relays parts as they come"):

- boto3 sends POST /endpoints/NAME/invocations-response-stream with the body, the
  body's type in Content-Type and the wanted type in X-Amzn-SageMaker-Accept. The
  adapter records that request (so tests check what the tool sent) and makes the
  container's call: POST /invocations with Content-Type and Accept.
- A container answer other than 200 becomes SageMaker's ModelError (HTTP 424, with the
  container's status and body as OriginalStatusCode / OriginalMessage), before any
  event is sent.
- A 200 becomes an `application/vnd.amazon.eventstream` response whose
  X-Amzn-SageMaker-Content-Type header is the container's Content-Type; every piece
  of the chunked body, as soon as it is read, becomes one PayloadPart event
  (headers :message-type=event, :event-type=PayloadPart, payload = the bytes), sent
  to boto3 as one HTTP chunk. (Chunked, as the service answers: urllib3 hands a
  chunked body over chunk by chunk, whereas it reads a close-delimited one in 64 KiB
  blocks, which would hold small parts back.)
- A container that breaks its chunked body off becomes a ModelStreamError exception
  event (:message-type=exception, :exception-type=ModelStreamError, JSON payload with
  Message and ErrorCode "StreamBroken", SageMaker's code for a reset connection).

Event-stream messages are framed as the AWS event stream encoding specifies: total
length and headers length (big-endian u32), the CRC32 of those 8 bytes, the headers
(name length u8, name, type 7 = string, value length u16, value), the payload, and the
CRC32 of everything before it. botocore's own decoder reads them in the tool, so a
framing mistake here fails the tests rather than passing silently.
"""

from __future__ import annotations

import http.client
import json
import struct
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse


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
    return event_message({":message-type": "event", ":event-type": "PayloadPart", ":content-type": "application/octet-stream"}, data)


def model_stream_error(message: str, code: str = "StreamBroken") -> bytes:
    body = json.dumps({"Message": message, "ErrorCode": code}).encode()
    return event_message({":message-type": "exception", ":exception-type": "ModelStreamError", ":content-type": "application/json"}, body)


class SageMakerStreamAdapter:
    """boto3 -> this adapter -> the container at `upstream` (http://host:port)."""

    def __init__(self, upstream: str):
        self.upstream = urlparse(upstream)
        self.requests: list[dict] = []  # what the tool sent: method, path, headers, body
        self.parts: list[bytes] = []  # the payload parts relayed, in order
        adapter = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                adapter.requests.append({"method": "POST", "path": self.path, "headers": dict(self.headers), "body": body})
                adapter._relay(self, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "SageMakerStreamAdapter":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _relay(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        if not handler.path.endswith("/invocations-response-stream"):
            handler.send_error(404)
            return
        headers = {"Content-Type": handler.headers.get("Content-Type", "application/octet-stream")}
        if handler.headers.get("X-Amzn-SageMaker-Accept"):
            headers["Accept"] = handler.headers["X-Amzn-SageMaker-Accept"]
        connection = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=60)
        connection.request("POST", "/invocations", body=body, headers=headers)
        answer = connection.getresponse()
        if answer.status != 200:
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
            return
        handler.send_response(200)
        handler.send_header("Content-Type", "application/vnd.amazon.eventstream")
        handler.send_header("X-Amzn-SageMaker-Content-Type", answer.getheader("Content-Type", "application/octet-stream"))
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
            connection.close()
            handler.wfile.write(b"0\r\n\r\n")
            handler.close_connection = True


class ChunkedServer:
    """A container stand-in that answers /invocations with scripted chunks.

    `script` is a list of items: bytes are sent as one chunk each; a threading.Event is
    waited on before going on (so a test can prove the tool printed what came before
    it while the stream was still open); the string "break" closes the connection
    without the terminating chunk, as a crashed container would.
    """

    def __init__(self, content_type: str, script: list):
        self.content_type = content_type
        self.script = script
        self.requests: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                stub.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                self.send_response(200)
                self.send_header("Content-Type", stub.content_type)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for item in stub.script:
                    if isinstance(item, threading.Event):
                        assert item.wait(30), "the test never released the stream"
                    elif item == "break":
                        self.wfile.flush()
                        self.close_connection = True
                        return
                    else:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(item), item))
                        self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "ChunkedServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

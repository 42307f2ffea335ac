"""A container stand-in for `invoke --stream` tests: ChunkedServer streams scripted
chunks. SageMaker's part between boto3 and it is local_test.runtime.LocalRuntime (moto
does not implement InvokeEndpointWithResponseStream)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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

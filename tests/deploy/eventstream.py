"""A container stand-in for `invoke --stream` tests: ChunkedServer streams scripted
chunks. SageMaker's part between boto3 and it is local_test.runtime.LocalRuntime (moto
does not implement InvokeEndpointWithResponseStream)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler

from local_test.runtime import PostServer


class ChunkedServer(PostServer):
    """A container stand-in that answers /invocations with scripted chunks.

    `script` is a list of items: bytes are sent as one chunk each; a threading.Event is
    waited on before going on (so a test can prove the tool printed what came before
    it while the stream was still open); the string "break" closes the connection
    without the terminating chunk, as a crashed container would.
    """

    def __init__(self, content_type: str, script: list):
        super().__init__()
        self.content_type = content_type
        self.script = script

    def post(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", self.content_type)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for item in self.script:
            if isinstance(item, threading.Event):
                assert item.wait(30), "the test never released the stream"
            elif item == "break":
                handler.wfile.flush()
                handler.close_connection = True
                return
            else:
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(item), item))
                handler.wfile.flush()
        handler.wfile.write(b"0\r\n\r\n")

"""The ceiling: the least a Python server does per request. An asyncio.Protocol reads
the Content-Length and the body, np.load, the TorchScript forward with one torch
thread, np.save, one write. No checks, no batching, no log: whatever our server spends
beyond this is the price of what it does that this does not.

    PEER_MODEL_DIR=DIR python bench/peers/raw_asyncio.py PORT
"""

import asyncio
import io
import os
import sys

import numpy as np
import torch

torch.set_num_threads(1)
model = torch.jit.load(os.path.join(os.environ["PEER_MODEL_DIR"], "model.pt")).eval()


class Handler(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buffer = transport, bytearray()

    def data_received(self, data):
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:  # keep-alive: several requests may wait
            head = bytes(self.buffer[:end]).lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15:].split(b"\r\n", 1)[0]) if at >= 0 else 0
            if len(self.buffer) < end + 4 + length:
                return
            body = bytes(self.buffer[end + 4:end + 4 + length])
            del self.buffer[:end + 4 + length]
            if not body:  # GET /ping
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                continue
            x = np.load(io.BytesIO(body), allow_pickle=False)
            with torch.no_grad():
                y = model(torch.from_numpy(x)).numpy()
            out = io.BytesIO()
            np.save(out, y)
            answer = out.getvalue()
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-npy\r\nContent-Length: %d\r\n\r\n%b"
                                 % (len(answer), answer))


async def serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Handler, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


asyncio.run(serve(int(sys.argv[1])))

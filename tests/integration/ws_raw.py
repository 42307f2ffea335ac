"""A minimal RFC 6455 client over a raw socket, for what the `websockets` library cannot
express: a handshake sent in pieces, frames pipelined behind it, a sender whose bytes
pile up in the socket buffers, each frame as it arrived."""

from __future__ import annotations

import base64
import os
import socket
import struct

PATH = "/invocations-bidirectional-stream"
CONT, TEXT, BINARY, CLOSE, PING, PONG = 0, 1, 2, 8, 9, 10


def handshake(query: str = "") -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    path = PATH + (f"?{query}" if query else "")
    return (f"GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode()


def frame(opcode: int, payload: bytes = b"", fin: bool = True) -> bytes:
    """A client frame (masked, as a client's must be)."""
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    mask = os.urandom(4)
    keys = (mask * (n // 4 + 1))[:n]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(keys, "big")).to_bytes(n, "big")
    return head + mask + masked


def text(message: str) -> bytes:
    return frame(TEXT, message.encode("utf-8"))


class Conn:
    def __init__(self, sock: socket.socket, buffered: bytes = b""):
        self.sock = sock
        self.buf = buffered

    @classmethod
    def open(cls, port: int, query: str = "", timeout: float = 30, sndbuf: int | None = None) -> "Conn":
        sock = socket.socket()
        if sndbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        sock.settimeout(timeout)
        sock.connect(("127.0.0.1", port))
        sock.sendall(handshake(query))
        conn = cls(sock)
        status = conn.response_head()
        assert status.startswith(b"HTTP/1.1 101"), status
        return conn

    def _need(self, n: int) -> bytes:
        while len(self.buf) < n:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError(f"connection closed ({len(self.buf)} of {n} bytes)")
            self.buf += data
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def response_head(self) -> bytes:
        """An HTTP response head; its status line."""
        while b"\r\n\r\n" not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError(f"connection closed in a response head: {self.buf!r}")
            self.buf += data
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        return head.split(b"\r\n")[0]

    def http_response(self) -> tuple[bytes, bytes]:
        """A whole HTTP response with a Content-Length: (status line, body)."""
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
        return head.split(b"\r\n")[0], self._need(length)

    def frame(self) -> tuple[bool, int, bytes]:
        """(fin, opcode, payload) of the next server frame."""
        b0, b1 = self._need(2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", self._need(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", self._need(8))[0]
        return bool(b0 & 0x80), b0 & 0x0F, self._need(n)

    def message(self) -> tuple:
        """(opcode, payload) of the next data message, its frames joined; a Close is
        ("close", code, reason)."""
        parts, first = [], None
        while True:
            fin, opcode, data = self.frame()
            if opcode == CLOSE:
                code = struct.unpack("!H", data[:2])[0] if len(data) >= 2 else None
                return "close", code, data[2:].decode("utf-8", "replace")
            if opcode in (PING, PONG):
                continue
            first = opcode if first is None else first
            parts.append(data)
            if fin:
                return first, b"".join(parts)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        try:
            self.sock.sendall(frame(CLOSE, struct.pack("!H", 1000)))
        except OSError:
            pass
        self.sock.close()

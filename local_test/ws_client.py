"""A WebSocket session with a local server or container, as SageMaker opens one.

    python -m local_test.ws_client --json local_test/payloads/digits.json
    python -m local_test.ws_client --npy rows.npy --fragment 4 --ping
    python -m local_test.ws_client --query 'max_tokens=200&seed=7' --text 'The iris'
    python -m local_test.ws_client --url ws://localhost:8080 --text a --text b --repeat 3

SageMaker's InvokeEndpointWithBidirectionalStream opens a WebSocket to the container's
`/invocations-bidirectional-stream` with the caller's query string, and maps payload
parts to frames one to one: a UTF8 part is a text frame, a BINARY part a binary frame,
a run of PARTIAL parts ending with COMPLETE one fragmented message (--fragment N sends
each message as N frames, as such a run arrives). Its pings come every 60 s, as this
client's do.

Messages go in the order given (--repeat N sends the whole list N times), one at a
time: each waits for its answer, printed to stdout as it arrives. A text answer is
printed as text, a fragmented one frame by frame (so a streamed answer shows live); a
binary answer that is a .npy array is printed as the array, other binary as its byte
count. Pings, the close code and the close reason go to stderr. The session ends with
a normal close (1000); the exit status is 0 when the server closed with 1000 too, else
the server's close code minus 1000 (1008 -> 8, 1011 -> 11; 1006, no Close frame, ->
6), or 255 when no session opened at all.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from urllib.parse import urlsplit, urlunsplit

PATH = "/invocations-bidirectional-stream"
NORMAL = 1000
NO_SESSION = 255
NPY_MAGIC = b"\x93NUMPY"
# SageMaker pings an open session every 60 s.
PING_INTERVAL_S = 60


class _Message(argparse.Action):
    """--text/--json/--npy/--binary, kept in the order given on the command line."""

    def __call__(self, parser, namespace, value, option_string=None):
        messages = getattr(namespace, "messages", None) or []
        messages.append((self.dest, value))
        namespace.messages = messages


def default_url() -> str:
    return f"ws://localhost:{os.environ.get('SAGEMAKER_BIND_TO_PORT') or 8080}"


def session_url(url: str, query: str | None) -> str:
    """ws(s)://host:port[/path][?query]: http(s) is taken for ws(s), an empty path is the
    bidirectional endpoint, and --query is appended to any query the URL has."""
    parts = urlsplit(url if "://" in url else "ws://" + url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    path = parts.path if parts.path not in ("", "/") else PATH
    query = "&".join(q for q in (parts.query, (query or "").lstrip("?")) if q)
    return urlunsplit((scheme, parts.netloc, path, query, ""))


def load_messages(items: list[tuple[str, str]]) -> list[str | bytes]:
    """(kind, argument) -> the message: str for a text frame, bytes for a binary one."""
    messages: list[str | bytes] = []
    for kind, value in items:
        if kind == "text":
            messages.append(value)
        elif kind == "json":
            with open(value, encoding="utf-8") as f:
                messages.append(f.read())
        else:  # npy, binary: the file's bytes as they are
            with open(value, "rb") as f:
                messages.append(f.read())
    return messages


def fragments(message: str | bytes, count: int) -> list[str | bytes]:
    """The message cut into `count` frames of about equal size (some empty when it is
    shorter than `count`: an empty continuation frame is valid)."""
    size = len(message)
    cuts = [size * i // count for i in range(count + 1)]
    return [message[cuts[i]:cuts[i + 1]] for i in range(count)]


def describe_binary(data: bytes) -> str:
    if data.startswith(NPY_MAGIC):
        import numpy as np

        try:
            array = np.load(io.BytesIO(data), allow_pickle=False)
        except ValueError as e:
            return f"<binary answer: {len(data)} bytes, not a readable .npy: {e}>"
        with np.printoptions(threshold=200, linewidth=120):
            return f"array {array.dtype} {list(array.shape)}:\n{array}"
    return f"<binary answer: {len(data)} bytes>"


def print_answer(frames, out) -> None:
    """One answer, frame by frame as each arrives: text written at once, binary
    gathered until the message ends."""
    binary: list[bytes] = []
    text = False
    try:
        for frame in frames:
            if isinstance(frame, str):
                text = True
                out.write(frame)
                out.flush()
            else:
                binary.append(frame)
    finally:
        if text:
            out.write("\n")
        elif binary:
            out.write(describe_binary(b"".join(binary)) + "\n")
        out.flush()


def exit_status(code: int | None) -> int:
    if code == NORMAL:
        return 0
    if code is not None and 1000 < code < 1255:
        return code - 1000
    return NO_SESSION


def run(url: str, messages: list[str | bytes], fragment: int = 1, ping: bool = False,
        out=sys.stdout, err=sys.stderr) -> int:
    from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
    from websockets.sync.client import connect

    try:
        # As SageMaker does: no compression, no proxy, pings every 60 s, any size (the
        # server enforces its own payload limit).
        session = connect(url, compression=None, proxy=None, max_size=None,
                          ping_interval=PING_INTERVAL_S, ping_timeout=PING_INTERVAL_S, open_timeout=30)
    except InvalidStatus as e:
        body = e.response.body.decode("utf-8", errors="replace").strip() if e.response.body else ""
        print(f"no session: HTTP {e.response.status_code} {body}", file=err)
        return NO_SESSION
    except (OSError, InvalidHandshake, TimeoutError) as e:
        print(f"no session with {url}: {e}", file=err)
        return NO_SESSION
    with session as ws:
        try:
            if ping:
                started = time.perf_counter()
                if ws.ping().wait(PING_INTERVAL_S):
                    print(f"ping: {(time.perf_counter() - started) * 1000:.2f} ms", file=err)
                else:
                    print(f"ping: no pong in {PING_INTERVAL_S} s", file=err)
            for message in messages:
                ws.send(fragments(message, fragment) if fragment > 1 else message)
                print_answer(ws.recv_streaming(), out)
            ws.close(NORMAL)
        except ConnectionClosed:
            pass  # the server ended the session: its code and reason are below
        except KeyboardInterrupt:
            ws.close(1001, "client interrupted")
    code = ws.close_code if ws.close_code is not None else 1006
    reason = ws.close_reason or ""
    print(f"closed: {code}{' ' + reason if reason else ''}", file=err)
    return exit_status(code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m local_test.ws_client",
                                     description=__doc__.split("\n\n")[0].strip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("--url", default=default_url(),
                        help=f"the server (default {default_url()}, from SAGEMAKER_BIND_TO_PORT; the path "
                        f"defaults to {PATH})")
    parser.add_argument("--query", help="the session's query string, as SageMaker passes the caller's "
                        "(e.g. 'content-type=text/csv&accept=application/json')")
    parser.add_argument("--text", action=_Message, metavar="MSG", help="a text message")
    parser.add_argument("--json", action=_Message, metavar="FILE", help="a file's text as a text message")
    parser.add_argument("--npy", action=_Message, metavar="FILE", help="a .npy file as a binary message")
    parser.add_argument("--binary", action=_Message, metavar="FILE", help="a file's bytes as a binary message")
    parser.add_argument("--fragment", type=int, default=1, metavar="N",
                        help="send each message as N frames: one fragmented message, as SageMaker sends "
                        "a run of PARTIAL parts ending with COMPLETE")
    parser.add_argument("--ping", action="store_true", help="ping once the session is open; print the round trip")
    parser.add_argument("--repeat", type=int, default=1, metavar="N", help="send the messages N times over")
    args = parser.parse_args(argv)
    if args.fragment < 1:
        parser.error("--fragment takes a count of frames, 1 or more")
    if args.repeat < 1:
        parser.error("--repeat takes a count, 1 or more")
    try:
        messages = load_messages(getattr(args, "messages", None) or []) * args.repeat
    except OSError as e:
        parser.error(str(e))
    return run(session_url(args.url, args.query), messages, args.fragment, args.ping)


if __name__ == "__main__":
    sys.exit(main())

"""A stateful session against a local server, through the same client code as
`python -m deploy invoke --session-id`: boto3's sagemaker-runtime, SageMaker's part
played by local_test.runtime.

    python -m local_test.session [--url http://localhost:8080] [--content-type T] [--accept A]
                                 [--stream] [--keep] BODY [BODY ...]
    python -m local_test.session --runtime-only [--port 8081]

Each BODY (a JSON text, or @FILE for a file's bytes) is one InvokeEndpoint of one session:
the first with SessionId=NEW_SESSION, the others with the ID its answer gave; then one
more, {"requestType": "CLOSE"}, closes it (unless --keep). Answers go to stdout, one a
line; NewSessionId and ClosedSessionId to stderr, as `deploy invoke` prints them.
--stream sends every BODY after the first with InvokeEndpointWithResponseStream (a
session is opened by InvokeEndpoint only, as SageMaker has it). --runtime-only serves the
stand-in alone, for your own boto3 (`endpoint_url=`) or `python -m deploy --endpoint-url`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from local_test.runtime import LocalRuntime

DEFAULT_URL = "http://localhost:8080"
ENDPOINT = "local"
CLOSE = json.dumps({"requestType": "CLOSE"}).encode()


def _body(text: str) -> bytes:
    return Path(text[1:]).read_bytes() if text.startswith("@") else text.encode()


def converse(url: str, bodies: list[bytes], content_type: str, accept: str | None, stream: bool = False,
             keep: bool = False, out=sys.stdout) -> str:
    """One session of len(bodies) requests (and a close, unless keep) against the server
    at url; returns the session's ID."""
    # boto3 wants a region and credentials; the stand-in checks none.
    for name, value in (("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_ACCESS_KEY_ID", "local"),
                        ("AWS_SECRET_ACCESS_KEY", "local")):
        os.environ.setdefault(name, value)
    from deploy.aws import Aws
    from deploy.invoke import Routing, invoke, invoke_response, invoke_stream
    from deploy.stream import Fragment, printable

    with LocalRuntime(url) as runtime:
        aws = Aws(endpoint_url=runtime.url)
        opened = invoke_response(aws, ENDPOINT, bodies[0], content_type, accept, Routing(session_id="NEW_SESSION"))
        if not opened.get("NewSessionId"):
            raise SystemExit("error: the server opened no session (its answer has no NewSessionId): does the model "
                             "define open_session?")
        print(opened["Body"].read().decode("utf-8", "replace"), file=out, flush=True)
        routing = Routing(session_id=opened["NewSessionId"].split(";")[0])
        for body in bodies[1:]:
            if stream:
                events, response_type = invoke_stream(aws, ENDPOINT, body, content_type, accept, routing)
                piece = ""
                for piece in printable(events, response_type):
                    # A Fragment is part of a line (a streamed text part), as `deploy invoke` prints it.
                    print(piece, end="" if isinstance(piece, Fragment) else "\n", file=out, flush=True)
                if isinstance(piece, Fragment):
                    print(file=out, flush=True)  # the answer's line ends
            else:
                answer, _ = invoke(aws, ENDPOINT, body, content_type, accept, routing)
                print(answer.decode("utf-8", "replace"), file=out, flush=True)
        if not keep:
            invoke(aws, ENDPOINT, CLOSE, "application/json", None, routing)
    session_id = routing.session_id
    return session_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m local_test.session", description=__doc__.splitlines()[0])
    parser.add_argument("bodies", nargs="*", metavar="BODY", help="a request body: JSON text, or @FILE")
    parser.add_argument("--url", default=os.environ.get("SMSERVE_URL", DEFAULT_URL), help="the server (container)")
    parser.add_argument("--content-type", default="application/json")
    parser.add_argument("--accept")
    parser.add_argument("--stream", action="store_true", help="the requests after the first as response streams")
    parser.add_argument("--keep", action="store_true", help="leave the session open (no CLOSE)")
    parser.add_argument("--runtime-only", action="store_true", help="serve the local runtime stand-in, nothing else")
    parser.add_argument("--port", type=int, default=0, help="the stand-in's port (--runtime-only)")
    args = parser.parse_args(argv)
    if args.runtime_only:
        with LocalRuntime(args.url, args.port) as runtime:
            print(f"sagemaker-runtime for {args.url} at {runtime.url} (endpoint_url=); Ctrl-C ends it", file=sys.stderr)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                return 0
    if not args.bodies:
        parser.error("give at least one BODY (or --runtime-only)")
    from deploy.aws import EXPECTED_ERRORS, one_line

    try:
        converse(args.url, [_body(text) for text in args.bodies], args.content_type, args.accept, args.stream,
                 args.keep)
    except EXPECTED_ERRORS as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

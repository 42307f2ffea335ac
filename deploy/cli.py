"""python -m deploy <command>: from a local image to a SageMaker endpoint and batch jobs.

Results (URIs, response bodies) go to stdout; progress and notes to stderr. Every
failure is one line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from deploy.aws import EXPECTED_ERRORS, Aws, one_line
from deploy.commands import artifacts, endpoints, requests
from deploy.stream import Fragment


def main(argv: list[str] | None = None, runner=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        # A push to a private registry needs no AWS account at all.
        needs_aws = args.needs_aws(args) if hasattr(args, "needs_aws") else True
        aws = Aws(region=args.region, profile=args.profile, endpoint_url=args.endpoint_url) if needs_aws else None
        for line in args.handler(aws, args, runner):
            # A Fragment is part of a line (a streamed text part), printed as it came.
            print(line, end="" if isinstance(line, Fragment) else "\n", flush=True)
        return 0
    except EXPECTED_ERRORS as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--region", help="AWS region (default: AWS_REGION / AWS_DEFAULT_REGION / the profile's)")
    common.add_argument("--profile", help="AWS profile (default: AWS_PROFILE)")
    common.add_argument(
        "--endpoint-url",
        help="send every AWS call here (a moto server, LocalStack); default: AWS_ENDPOINT_URL, which boto3 honours itself",
    )

    waiting = argparse.ArgumentParser(add_help=False)
    waiting.add_argument("--poll-seconds", type=float, default=30.0, help="seconds between status checks (default 30)")
    waiting.add_argument("--max-wait", type=float, default=3600.0, help="give up waiting after this many seconds (default 3600)")

    parser = argparse.ArgumentParser(prog="python -m deploy", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # In the order of a deployment's life, as --help lists them.
    for add in (artifacts.add, endpoints.add, requests.add, endpoints.add_teardown):
        add(sub, common, waiting)
    return parser

"""The command line: python -m local_test.batch_transform INPUT OUTPUT [flags]."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from local_test.batch_transform.client import fetch_execution_parameters, wait_for_ping
from local_test.batch_transform.config import (BATCH_STRATEGIES, DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT_S, DEFAULT_URL,
                                               parse_input_name, resolve_config)
from local_test.batch_transform.errors import ConfigError
from local_test.batch_transform.job import run_job


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m local_test.batch_transform",
        description="Run a SageMaker-style batch transform against a local server or container.",
    )
    parser.add_argument("input", type=Path, help="an input file, or a folder: every file under it")
    parser.add_argument("output", type=Path, help="folder for the <input name>.out files")
    parser.add_argument("--url", default=os.environ.get("SMSERVE_URL", DEFAULT_URL))
    parser.add_argument("--content-type", default="text/csv", help="ContentType (default text/csv)")
    parser.add_argument("--accept", help="Accept (default: none sent, so the model answers in its own type, as "
                                         "SageMaker does for a job without one: in batch mode a CSV or JSON Lines "
                                         "request's own type)")
    parser.add_argument("--split-type", choices=["Line", "None"], default="Line")
    parser.add_argument("--assemble-with", choices=["Line", "None"], default="Line")
    parser.add_argument("--join-source", choices=["None", "Input"], default="None")
    parser.add_argument(
        "--batch-strategy",
        type=str.upper,
        choices=sorted(BATCH_STRATEGIES),
        help="default: what /execution-parameters says",
    )
    parser.add_argument("--max-payload-mb", type=int, help="MaxPayloadInMB; 0 = no limit")
    parser.add_argument("--max-concurrent-transforms", type=int)
    parser.add_argument(
        "--max-retries", type=int, default=DEFAULT_MAX_RETRIES, help="InvocationsMaxRetries (0..3)"
    )
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="InvocationsTimeoutInSeconds"
    )
    parser.add_argument("--retry-backoff", type=float, default=0.5, help="first retry delay, s")
    parser.add_argument(
        "--wait", type=float, default=30.0, help="seconds to wait for /ping to answer 200"
    )
    parser.add_argument(
        "--input-name", action="append", metavar="NAME[:COLUMNS]", default=[],
        help="the model input a CSV record's columns feed; repeat it for a model of several inputs, each but "
             "the last as NAME:COLUMNS, the last taking the rest. Each record then goes as a JSON Lines object "
             "of named inputs, which a CSV line cannot be (the output and JoinSource=Input are as for CSV)",
    )
    parser.add_argument("--no-progress", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        wait_for_ping(args.url, args.wait)
        params = fetch_execution_parameters(args.url)
        config = resolve_config(
            params,
            {
                "url": args.url,
                "content_type": args.content_type,
                "accept": args.accept,
                "split_type": args.split_type,
                "assemble_with": args.assemble_with,
                "join_source": args.join_source,
                "batch_strategy": args.batch_strategy,
                "max_payload_mb": args.max_payload_mb,
                "max_concurrent_transforms": args.max_concurrent_transforms,
                "max_retries": args.max_retries,
                "timeout_s": args.timeout,
                "retry_backoff_s": args.retry_backoff,
                "input_names": tuple(parse_input_name(text) for text in args.input_name),
            },
        )
        inputs = ", ".join(name if columns is None else f"{name} ({columns})" for name, columns in config.input_names)
        print(
            f"job: {config.batch_strategy}, MaxPayloadInMB {config.max_payload_mb}, "
            f"MaxConcurrentTransforms {config.max_concurrent_transforms}, SplitType {config.split_type}, "
            f"AssembleWith {config.assemble_with}, JoinSource {config.join_source}"
            + (f", CSV columns to the inputs {inputs} as JSON Lines" if inputs else "")
            + ("" if params else " (no /execution-parameters: SageMaker's defaults)"),
            file=sys.stderr,
        )
        warning = config.binary_split_warning()
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
        result = run_job(args.input, args.output, config, progress=not args.no_progress)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(result.summary())
    return 1 if result.failures else 0

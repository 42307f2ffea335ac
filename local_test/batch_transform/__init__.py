"""Run a SageMaker batch transform locally, against a running server or container.

SageMaker's batch transform does the client side of a transform job: it asks the
container for its execution parameters, splits the input files into records, packs
them into mini-batches, sends them to POST /invocations with bounded concurrency,
retries what failed, and reassembles one ``<input name>.out`` per input file. This
runner does the same against http://localhost:8080 (or --url), so a job's settings
can be tried in seconds instead of a job's start-up time:

    .venv/bin/python -m local_test.batch_transform data/ out/ \\
        --content-type text/csv --accept text/csv --join-source Input

(`.venv/bin/python local_test/batch_transform.py ...` runs the same.)

Job settings given as flags override what GET /execution-parameters says, as the
settings of CreateTransformJob do. Exit status: 0 when every mini-batch succeeded,
1 when any failed (its file's .out is then not written), 2 for bad settings or an
unreachable server.

One job a module: config (the job's settings), records (a file's records, their
mini-batches, answers back into lines), client (HTTP and retries), files (one input
file's mini-batches and its .out), job (the run, MaxConcurrentTransforms at a time),
cli (the flags).
"""

from __future__ import annotations

from local_test.batch_transform.cli import build_parser, main
from local_test.batch_transform.client import Client, EndedEarly, fetch_execution_parameters, wait_for_ping
from local_test.batch_transform.config import MB, JobConfig, join_kind, parse_input_name, resolve_config
from local_test.batch_transform.errors import BatchFailed, ConfigError
from local_test.batch_transform.files import FileJob, MiniBatch, list_inputs, plan_file
from local_test.batch_transform.job import Failure, JobResult, run_job, transform_batch
from local_test.batch_transform.records import join_record, named_record, pack_batches, response_lines, split_records

__all__ = [
    "MB", "BatchFailed", "Client", "ConfigError", "EndedEarly", "Failure", "FileJob", "JobConfig", "JobResult",
    "MiniBatch", "build_parser", "fetch_execution_parameters", "join_kind", "join_record", "list_inputs", "main",
    "named_record", "pack_batches", "parse_input_name", "plan_file", "resolve_config", "response_lines", "run_job", "split_records", "transform_batch",
    "wait_for_ping",
]

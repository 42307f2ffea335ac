"""The job: every file's mini-batches through the server, MaxConcurrentTransforms at a time."""

from __future__ import annotations

import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from tqdm import tqdm

from local_test.batch_transform.client import Client
from local_test.batch_transform.config import JobConfig, join_kind
from local_test.batch_transform.errors import BatchFailed
from local_test.batch_transform.files import FileJob, MiniBatch, assemble, count_records, list_inputs, plan_file
from local_test.batch_transform.records import join_record, response_lines


@dataclass
class Failure:
    source: Path
    batch: int
    first_record_number: int  # 1-based, counting records (blank lines are not records)
    records: int
    message: str


@dataclass
class JobResult:
    records: int = 0  # records transformed successfully
    requests: int = 0  # mini-batches sent (not counting retries)
    seconds: float = 0.0
    failures: list[Failure] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)

    @property
    def failed_records(self) -> int:
        return sum(f.records for f in self.failures)

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        return (
            f"records: {self.records}  requests: {self.requests}  seconds: {self.seconds:.2f}  "
            f"records/s: {self.records_per_second:.1f}  failed mini-batches: {len(self.failures)} "
            f"({self.failed_records} records)"
        )


def transform_batch(client: Client, batch: MiniBatch, config: JobConfig) -> bytes:
    """Send one mini-batch and turn its response into this batch's share of the .out file."""
    try:
        body = client.invoke(batch.body, len(batch.records))
    except BatchFailed as failed:
        if config.input_names and "HTTP 4" in str(failed):
            names = ", ".join(name for name, _ in config.input_names)
            raise BatchFailed(f"{failed} (the records went as JSON Lines objects of the inputs {names}, as "
                              "--input-name asks; a model with one input takes the CSV as it is, without "
                              "--input-name)") from None
        raise
    if not config.checks_lines:
        if config.assemble_with == "Line" and body and not body.endswith(b"\n"):
            body += b"\n"
        return body
    lines = response_lines(body)
    if len(lines) != len(batch.records):
        raise BatchFailed(
            f"response has {len(lines)} lines for {len(batch.records)} records: the server must "
            "answer one line per record, in order (is it running with SAGEMAKER_BATCH=true and "
            "BatchStrategy MULTI_RECORD, and does --accept give one line per record?)"
        )
    if config.join_source == "Input":
        kind = join_kind(config.content_type)
        lines = [join_record(r, o, kind) for r, o in zip(batch.records, lines)]
    return b"".join(line + b"\n" for line in lines)


def run_job(
    input_path: Path | str,
    output_dir: Path | str,
    config: JobConfig,
    progress: bool = True,
    log=None,
) -> JobResult:
    """Transform every input file; write the .out of each file whose batches all succeeded."""
    config.validate()
    input_path, output_dir = Path(input_path), Path(output_dir)
    log = log or (lambda message: tqdm.write(message, file=sys.stderr))
    pairs = list_inputs(input_path, output_dir)
    client = Client(config)
    result = JobResult()
    window = 2 * config.max_concurrent_transforms  # bounds memory held in bodies

    total = count_records(pairs, config.split_type) if progress else None
    bar = tqdm(total=total, unit="rec", file=sys.stderr, disable=not progress, dynamic_ncols=True)
    started = time.perf_counter()

    def finish_batch(batch: MiniBatch, output: bytes | None, error: str | None) -> None:
        job = batch.file_job
        if error is not None:
            job.failed = True
            failure = Failure(job.source, batch.index, batch.first_record + 1, len(batch.records), error)
            result.failures.append(failure)
            log(
                f"FAILED {job.source} mini-batch {batch.index} (records {batch.first_record + 1}"
                f"..{batch.first_record + len(batch.records)}): {error}"
            )
        else:
            job.outputs[batch.index] = output
            result.records += len(batch.records)
        bar.update(len(batch.records))
        if result.failures:
            bar.set_postfix(failed=len(result.failures), refresh=False)
        job.remaining -= 1
        if job.remaining == 0:
            finish_file(job)

    def finish_file(job: FileJob) -> None:
        if job.failed:
            log(f"not written: {job.destination} ({job.source} had failed mini-batches)")
        else:
            job.destination.parent.mkdir(parents=True, exist_ok=True)
            job.destination.write_bytes(assemble(job))
            result.written.append(job.destination)
        job.outputs.clear()

    def collect(done: Iterable[Future]) -> None:
        for future in done:
            batch = future.batch  # type: ignore[attr-defined]
            try:
                finish_batch(batch, future.result(), None)
            except BatchFailed as exc:
                finish_batch(batch, None, str(exc))
            except Exception as exc:  # a bug or an unexpected client error: still report it
                finish_batch(batch, None, f"{type(exc).__name__}: {exc}")

    output_dir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(config.max_concurrent_transforms, thread_name_prefix="transform") as pool:
        pending: set[Future] = set()
        try:
            for source, destination in pairs:
                job = plan_file(source, destination, config)
                if not job.batches:
                    finish_file(job)
                for batch in job.batches:
                    if batch.error is not None:
                        finish_batch(batch, None, batch.error)
                        continue
                    while len(pending) >= window:
                        done, pending = wait(pending, return_when=FIRST_COMPLETED)
                        collect(done)
                    future = pool.submit(transform_batch, client, batch, config)
                    future.batch = batch  # type: ignore[attr-defined]
                    pending.add(future)
                    result.requests += 1
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                collect(done)
        finally:
            for future in pending:
                future.cancel()
    result.seconds = time.perf_counter() - started
    bar.close()
    return result

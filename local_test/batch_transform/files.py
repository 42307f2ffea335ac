"""One input file's part of a job: its mini-batches, their outputs, its .out file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from local_test.batch_transform.config import JobConfig
from local_test.batch_transform.errors import ConfigError
from local_test.batch_transform.records import named_record, pack_batches, split_records


@dataclass
class MiniBatch:
    file_job: "FileJob"
    index: int
    first_record: int  # index of its first record within the file
    records: list[bytes]
    body: bytes
    error: str | None = None  # set when the batch cannot be sent at all


@dataclass
class FileJob:
    source: Path
    destination: Path
    records: int
    batches: list[MiniBatch] = field(default_factory=list)
    outputs: dict[int, bytes] = field(default_factory=dict)
    failed: bool = False
    remaining: int = 0


def list_inputs(input_path: Path, output_dir: Path) -> list[tuple[Path, Path]]:
    """(input file, its .out file) for a file, or for every file under a folder."""
    if input_path.is_file():
        return [(input_path, output_dir / (input_path.name + ".out"))]
    if not input_path.is_dir():
        raise ConfigError(f"input {input_path} does not exist")
    output_resolved = output_dir.resolve()
    if output_resolved == input_path.resolve():
        raise ConfigError(f"output folder {output_dir} is the input folder: choose another, as a job's S3OutputPath")
    pairs = []
    for path in sorted(p for p in input_path.rglob("*") if p.is_file()):
        # An output folder inside the input folder must not be read back as input.
        if output_resolved in path.resolve().parents:
            continue
        relative = path.relative_to(input_path)
        pairs.append((path, output_dir / relative.parent / (relative.name + ".out")))
    return pairs


def plan_file(source: Path, destination: Path, config: JobConfig) -> FileJob:
    records = split_records(source.read_bytes(), config.split_type)
    job = FileJob(source=source, destination=destination, records=len(records))
    # Mini-batches are packed from what is sent (a named record is longer than its CSV
    # line), but keep the records as read, which JoinSource=Input joins.
    sent = [named_record(r, config.input_names) for r in records] if config.input_names else records
    for index, (first, batch_sent, body, error) in enumerate(
        pack_batches(sent, config.batch_strategy, config.max_payload_bytes, config.split_type)
    ):
        job.batches.append(MiniBatch(job, index, first, records[first:first + len(batch_sent)], body, error))
    job.remaining = len(job.batches)
    return job


def count_records(pairs: list[tuple[Path, Path]], split_type: str) -> int:
    """For the progress bar's total: a streaming pass, so files are not all held at once."""
    total = 0
    for source, _ in pairs:
        if split_type == "None":
            total += source.stat().st_size > 0
            continue
        with open(source, "rb") as f:
            total += sum(1 for line in f if line.strip())
    return total


def assemble(job: FileJob) -> bytes:
    # Batches finish in any order; the file is written in input order.
    return b"".join(job.outputs[i] for i in range(len(job.batches)))

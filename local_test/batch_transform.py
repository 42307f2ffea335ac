"""Run a SageMaker batch transform locally, against a running server or container.

SageMaker's batch transform does the client side of a transform job: it asks the
container for its execution parameters, splits the input files into records, packs
them into mini-batches, sends them to POST /invocations with bounded concurrency,
retries what failed, and reassembles one ``<input name>.out`` per input file. This
script does the same against http://localhost:8080 (or --url), so a job's settings
can be tried in seconds instead of a job's start-up time:

    .venv/bin/python local_test/batch_transform.py data/ out/ \\
        --content-type text/csv --accept text/csv --join-source Input

Job settings given as flags override what GET /execution-parameters says, as the
settings of CreateTransformJob do. Exit status: 0 when every mini-batch succeeded,
1 when any failed (its file's .out is then not written), 2 for bad settings or an
unreachable server.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import requests
from tqdm import tqdm

MB = 1024 * 1024
DEFAULT_URL = "http://localhost:8080"

# What SageMaker assumes when the container has no /execution-parameters route.
FALLBACK_MAX_CONCURRENT_TRANSFORMS = 1
FALLBACK_BATCH_STRATEGY = "MULTI_RECORD"
FALLBACK_MAX_PAYLOAD_MB = 6

# ModelClientConfig's defaults (InvocationsMaxRetries is 0..3, the timeout 1..3600 s).
DEFAULT_MAX_RETRIES = 3
DEFAULT_TIMEOUT_S = 600.0

BATCH_STRATEGIES = {
    "MULTI_RECORD": "MULTI_RECORD",
    "MULTIRECORD": "MULTI_RECORD",
    "SINGLE_RECORD": "SINGLE_RECORD",
    "SINGLERECORD": "SINGLE_RECORD",
}

CSV_TYPES = {"text/csv"}
JSON_TYPES = {
    "application/jsonlines",
    "application/x-jsonlines",
    "application/jsonl",
    "application/json",
}


class ConfigError(ValueError):
    """A job setting that cannot work; reported before any request is sent."""


class BatchFailed(Exception):
    """A mini-batch that did not produce usable output (after any retries)."""


class EndedEarly(Exception):
    """An answer that began (HTTP 200) but ended before its end: its chunked body has
    no final chunk. The server streams a many-pass CSV or JSON Lines answer pass by
    pass, so a model that fails on a later pass can only cut the answer short."""

    def __init__(self, received: bytes):
        super().__init__("the answer ended early")
        self.received = received

    @property
    def lines(self) -> int:
        return self.received.count(b"\n")


@dataclass(frozen=True)
class JobConfig:
    url: str = DEFAULT_URL
    content_type: str = "text/csv"
    accept: str = "text/csv"
    split_type: str = "Line"  # "Line" or "None"
    assemble_with: str = "Line"  # "Line" or "None"
    join_source: str = "None"  # "None" or "Input"
    batch_strategy: str = "MULTI_RECORD"
    max_payload_mb: int = FALLBACK_MAX_PAYLOAD_MB  # 0: no limit
    max_concurrent_transforms: int = FALLBACK_MAX_CONCURRENT_TRANSFORMS
    max_retries: int = DEFAULT_MAX_RETRIES
    timeout_s: float = DEFAULT_TIMEOUT_S
    retry_backoff_s: float = 0.5

    def validate(self) -> None:
        if self.split_type not in ("Line", "None"):
            raise ConfigError(f"SplitType must be Line or None, not {self.split_type!r}")
        if self.assemble_with not in ("Line", "None"):
            raise ConfigError(f"AssembleWith must be Line or None, not {self.assemble_with!r}")
        if self.join_source not in ("None", "Input"):
            raise ConfigError(f"JoinSource must be None or Input, not {self.join_source!r}")
        if self.batch_strategy not in ("MULTI_RECORD", "SINGLE_RECORD"):
            raise ConfigError(
                f"BatchStrategy must be MULTI_RECORD or SINGLE_RECORD, not {self.batch_strategy!r}"
            )
        if self.max_payload_mb < 0:
            raise ConfigError("MaxPayloadInMB must be >= 0 (0 means no limit)")
        if self.max_concurrent_transforms < 1:
            raise ConfigError("MaxConcurrentTransforms must be >= 1")
        if not 0 <= self.max_retries <= 3:
            raise ConfigError("InvocationsMaxRetries must be between 0 and 3, as in ModelClientConfig")
        if self.timeout_s <= 0:
            raise ConfigError("InvocationsTimeoutInSeconds must be > 0")
        if self.join_source == "Input":
            if self.split_type != "Line":
                raise ConfigError("JoinSource=Input needs SplitType=Line: records are joined one by one")
            if self.assemble_with != "Line":
                raise ConfigError("JoinSource=Input needs AssembleWith=Line: one joined record a line")
            if join_kind(self.content_type) is None:
                raise ConfigError(
                    "JoinSource=Input works for text/csv and JSON Lines input, "
                    f"not {self.content_type!r}"
                )

    @property
    def max_payload_bytes(self) -> int | None:
        return self.max_payload_mb * MB if self.max_payload_mb else None

    @property
    def checks_lines(self) -> bool:
        # Only when records are assembled (or joined) one output line each does a
        # response's line count carry meaning; with AssembleWith=None a response may
        # legitimately be one document per mini-batch.
        return self.split_type == "Line" and self.assemble_with == "Line"


def base_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def join_kind(content_type: str) -> str | None:
    kind = base_type(content_type)
    if kind in CSV_TYPES:
        return "csv"
    if kind in JSON_TYPES:
        return "json"
    return None


# --- records and mini-batches ---------------------------------------------------------


def split_records(data: bytes, split_type: str) -> list[bytes]:
    """The records of one input file; a blank line is a separator, not a record."""
    if split_type == "None":
        return [data] if data else []
    records = []
    for line in data.split(b"\n"):
        if line.endswith(b"\r"):
            line = line[:-1]
        if line.strip():
            records.append(line)
    return records


@dataclass
class MiniBatch:
    file_job: "FileJob"
    index: int
    first_record: int  # index of its first record within the file
    records: list[bytes]
    body: bytes
    error: str | None = None  # set when the batch cannot be sent at all


def pack_batches(
    records: list[bytes], strategy: str, max_payload_bytes: int | None, split_type: str = "Line"
) -> Iterator[tuple[int, list[bytes], bytes, str | None]]:
    """Yield (first record index, records, body, error) in input order.

    MULTI_RECORD fills a mini-batch with whole records, each newline-terminated, while
    the body stays within MaxPayloadInMB. A record that alone exceeds it becomes a
    mini-batch of its own that carries an error instead of being sent: SageMaker
    fails such a record rather than splitting it.
    """
    if split_type == "None":
        for i, record in enumerate(records):
            error = _oversize(len(record), max_payload_bytes, "the file")
            yield i, [record], record, error
        return

    current: list[bytes] = []
    current_size = 0
    first = 0
    for i, record in enumerate(records):
        size = len(record) + 1
        error = _oversize(size, max_payload_bytes, f"record {i + 1}")
        if error:
            if current:
                yield first, current, _body(current), None
                current, current_size = [], 0
            yield i, [record], b"", error
            first = i + 1
            continue
        fits = max_payload_bytes is None or current_size + size <= max_payload_bytes
        if current and (strategy == "SINGLE_RECORD" or not fits):
            yield first, current, _body(current), None
            current, current_size = [], 0
        if not current:
            first = i
        current.append(record)
        current_size += size
    if current:
        yield first, current, _body(current), None


def _body(records: list[bytes]) -> bytes:
    return b"".join(record + b"\n" for record in records)


def _oversize(size: int, limit: int | None, what: str) -> str | None:
    if limit is not None and size > limit:
        return (
            f"{what} is {size} bytes, over MaxPayloadInMB ({limit // MB} MB = {limit} bytes); "
            "SageMaker does not split a record"
        )
    return None


def response_lines(body: bytes) -> list[bytes]:
    """One entry per newline-terminated line; a CR before the newline is dropped."""
    lines = body.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def join_record(record: bytes, output: bytes, kind: str) -> bytes:
    """JoinSource=Input for one record, as SageMaker documents it.

    CSV: the input row followed by the output row's columns. JSON: the output goes
    into the input object under "SageMakerOutput"; an input that is not an object
    (an array, a scalar) is wrapped as {"SageMakerInput": ..., "SageMakerOutput": ...}.
    """
    if kind == "csv":
        return record + b"," + output
    try:
        source = json.loads(record)
    except ValueError as exc:
        raise BatchFailed(f"JoinSource=Input: input record is not JSON ({exc})") from None
    try:
        result = json.loads(output)
    except ValueError:
        # A model whose JSON Lines output is plain text still gets joined, as a string.
        result = output.decode("utf-8", "replace")
    if isinstance(source, dict):
        joined = dict(source)
        joined["SageMakerOutput"] = result
    else:
        joined = {"SageMakerInput": source, "SageMakerOutput": result}
    return json.dumps(joined, separators=(",", ":")).encode()


# --- files ------------------------------------------------------------------------------


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
    for index, (first, batch_records, body, error) in enumerate(
        pack_batches(records, config.batch_strategy, config.max_payload_bytes, config.split_type)
    ):
        job.batches.append(MiniBatch(job, index, first, batch_records, body, error))
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


# --- HTTP -------------------------------------------------------------------------------


class Client:
    """One requests.Session per thread: a Session's connection pool is not thread-safe."""

    def __init__(self, config: JobConfig):
        self.config = config
        self._local = threading.local()

    @property
    def session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def invoke(self, body: bytes, records: int | None = None) -> bytes:
        """POST /invocations with ModelClientConfig's retry rule.

        Connection errors, timeouts and 5xx are retried up to max_retries times; a 4xx
        is the request's own fault and would fail the same way again. An answer that
        ends early (see EndedEarly) is retried too, as SageMaker would, unless a retry
        ends at the very same byte: a model that fails on a later pass does so every
        time, and a dying worker would not stop at the same place twice.
        """
        config = self.config
        url = config.url.rstrip("/") + "/invocations"
        headers = {"Content-Type": config.content_type, "Accept": config.accept}
        last_error = ""
        ended_at: int | None = None  # how much the last answer that ended early held
        tries = 0
        for attempt in range(config.max_retries + 1):
            if attempt:
                time.sleep(config.retry_backoff_s * 2 ** (attempt - 1))
            tries += 1
            try:
                response = self.session.post(
                    url, data=body, headers=headers, timeout=(config.timeout_s, config.timeout_s), stream=True
                )
                if response.status_code == 200:
                    return _whole_answer(response)
                content = response.content
            except EndedEarly as early:
                last_error = _ended_early(early, records)
                if ended_at == len(early.received):
                    raise BatchFailed(f"{last_error}; a retry ended at the same place, so it is not retried "
                                      f"again (after {tries} attempts)") from None
                ended_at = len(early.received)
                continue
            except (
                requests.ConnectionError,
                requests.Timeout,
                requests.exceptions.ChunkedEncodingError,
            ) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
                continue
            last_error = f"HTTP {response.status_code}: {_short(content.decode('utf-8', 'replace'))}"
            if response.status_code < 500:
                raise BatchFailed(last_error)
        raise BatchFailed(f"{last_error} (after {tries} attempt{'s' if tries > 1 else ''})")


def _whole_answer(response: requests.Response) -> bytes:
    """A 200 answer's body; EndedEarly with what came when it breaks off. A read that
    times out is a requests.ConnectionError, left to the caller."""
    received = bytearray()
    try:
        for chunk in response.iter_content(64 * 1024):
            received += chunk
    except requests.exceptions.ChunkedEncodingError:
        raise EndedEarly(bytes(received)) from None
    finally:
        response.close()
    return bytes(received)


def _ended_early(early: EndedEarly, records: int | None) -> str:
    of = f" of {records}" if records is not None else ""
    return (
        f"the server's answer ended early, after {early.lines}{of} lines: HTTP 200 and the first lines had "
        "left when the model failed part-way through (a later forward pass raised), or its worker died; "
        "the server's log says why"
    )


def _short(text: str, limit: int = 300) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + "..."


def wait_for_ping(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        try:
            response = requests.get(url.rstrip("/") + "/ping", timeout=5)
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code}"
        except requests.RequestException as exc:
            last = f"{type(exc).__name__}"
        if time.monotonic() >= deadline:
            raise ConfigError(f"{url}/ping did not answer 200 within {timeout_s:g} s (last: {last})")
        time.sleep(0.5)


def fetch_execution_parameters(url: str) -> dict:
    """GET /execution-parameters; SageMaker's defaults when the container has none."""
    try:
        response = requests.get(url.rstrip("/") + "/execution-parameters", timeout=10)
    except requests.RequestException as exc:
        raise ConfigError(f"cannot reach {url}: {exc}") from None
    if response.status_code == 404:
        return {}
    if response.status_code != 200:
        raise ConfigError(
            f"GET /execution-parameters answered HTTP {response.status_code}: {_short(response.text)}"
        )
    try:
        params = response.json()
    except ValueError:
        raise ConfigError("GET /execution-parameters did not return JSON") from None
    if not isinstance(params, dict):
        raise ConfigError("GET /execution-parameters did not return a JSON object")
    return params


def resolve_config(params: dict, overrides: dict) -> JobConfig:
    """The container's execution parameters, overridden by the job's own settings."""
    merged = {
        "max_concurrent_transforms": params.get(
            "MaxConcurrentTransforms", FALLBACK_MAX_CONCURRENT_TRANSFORMS
        ),
        "batch_strategy": params.get("BatchStrategy", FALLBACK_BATCH_STRATEGY),
        "max_payload_mb": params.get("MaxPayloadInMB", FALLBACK_MAX_PAYLOAD_MB),
    }
    merged.update({k: v for k, v in overrides.items() if v is not None})
    strategy = str(merged["batch_strategy"]).upper()
    if strategy not in BATCH_STRATEGIES:
        raise ConfigError(f"unknown BatchStrategy {merged['batch_strategy']!r}")
    merged["batch_strategy"] = BATCH_STRATEGIES[strategy]
    try:
        merged["max_concurrent_transforms"] = int(merged["max_concurrent_transforms"])
        merged["max_payload_mb"] = int(merged["max_payload_mb"])
    except (TypeError, ValueError):
        raise ConfigError(f"execution parameters are not integers: {params}") from None
    config = JobConfig(**merged)
    config.validate()
    return config


# --- the job ----------------------------------------------------------------------------


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
    body = client.invoke(batch.body, len(batch.records))
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


# --- command line -----------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Run a SageMaker-style batch transform against a local server or container.",
    )
    parser.add_argument("input", type=Path, help="an input file, or a folder: every file under it")
    parser.add_argument("output", type=Path, help="folder for the <input name>.out files")
    parser.add_argument("--url", default=os.environ.get("SMSERVE_URL", DEFAULT_URL))
    parser.add_argument("--content-type", default="text/csv", help="ContentType (default text/csv)")
    parser.add_argument("--accept", help="Accept (default: the content type)")
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
                "accept": args.accept or args.content_type,
                "split_type": args.split_type,
                "assemble_with": args.assemble_with,
                "join_source": args.join_source,
                "batch_strategy": args.batch_strategy,
                "max_payload_mb": args.max_payload_mb,
                "max_concurrent_transforms": args.max_concurrent_transforms,
                "max_retries": args.max_retries,
                "timeout_s": args.timeout,
                "retry_backoff_s": args.retry_backoff,
            },
        )
        print(
            f"job: {config.batch_strategy}, MaxPayloadInMB {config.max_payload_mb}, "
            f"MaxConcurrentTransforms {config.max_concurrent_transforms}, SplitType {config.split_type}, "
            f"AssembleWith {config.assemble_with}, JoinSource {config.join_source}"
            + ("" if params else " (no /execution-parameters: SageMaker's defaults)"),
            file=sys.stderr,
        )
        result = run_job(args.input, args.output, config, progress=not args.no_progress)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(result.summary())
    return 1 if result.failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""A job's settings: CreateTransformJob's, merged over the container's execution parameters."""

from __future__ import annotations

from dataclasses import dataclass

from local_test.batch_transform.errors import ConfigError

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
JSON_LINES = "application/jsonlines"


@dataclass(frozen=True)
class JobConfig:
    url: str = DEFAULT_URL
    content_type: str = "text/csv"
    # None: no Accept header, as SageMaker sends none for a job that sets none: the
    # model answers in its own type (its output_fn's, or the server's default).
    accept: str | None = None
    split_type: str = "Line"  # "Line" or "None"
    assemble_with: str = "Line"  # "Line" or "None"
    join_source: str = "None"  # "None" or "Input"
    batch_strategy: str = "MULTI_RECORD"
    max_payload_mb: int = FALLBACK_MAX_PAYLOAD_MB  # 0: no limit
    max_concurrent_transforms: int = FALLBACK_MAX_CONCURRENT_TRANSFORMS
    max_retries: int = DEFAULT_MAX_RETRIES
    timeout_s: float = DEFAULT_TIMEOUT_S
    retry_backoff_s: float = 0.5
    # The model inputs a CSV record's columns feed, in column order: (name, how many
    # columns; None for the last, which takes the rest). Empty: the CSV goes as it is,
    # and the server feeds its columns to the model's one input.
    input_names: tuple[tuple[str, int | None], ...] = ()

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
        if self.input_names:
            self._validate_input_names()

    def _validate_input_names(self) -> None:
        if join_kind(self.content_type) != "csv" or self.split_type != "Line":
            raise ConfigError("--input-name is for text/csv input split by line: it names what a CSV record's "
                              "columns feed (JSON Lines records name their inputs themselves)")
        names = [name for name, _ in self.input_names]
        if len(set(names)) != len(names):
            raise ConfigError(f"--input-name: an input named twice ({', '.join(names)})")
        if any(columns is None for _, columns in self.input_names[:-1]):
            raise ConfigError("--input-name: give every input but the last as NAME:COLUMNS; the last one "
                              "takes the rest of the columns")
        if self.input_names[-1][1] is not None:
            raise ConfigError("--input-name: the last input takes the rest of the columns; give it without :COLUMNS")

    def binary_split_warning(self) -> str | None:
        """SplitType=Line on a content type that is no text: SageMaker splits at every
        newline byte, which a JPEG or a .npy file holds by chance, so each file arrives
        in pieces that decode as nothing."""
        kind = base_type(self.content_type)
        if self.split_type != "Line" or kind.startswith("text/") or kind in JSON_TYPES:
            return None
        return (f"SplitType Line on {kind}: a binary file is cut at every newline byte it happens to hold, and "
                "each piece is sent as a record; send whole files with --split-type None")

    @property
    def max_payload_bytes(self) -> int | None:
        return self.max_payload_mb * MB if self.max_payload_mb else None

    @property
    def checks_lines(self) -> bool:
        # Only when records are assembled (or joined) one output line each does a
        # response's line count carry meaning; with AssembleWith=None a response may
        # legitimately be one document per mini-batch.
        return self.split_type == "Line" and self.assemble_with == "Line"

    @property
    def request_content_type(self) -> str:
        """What the requests carry: CSV records given input names go as JSON Lines
        objects, as a CSV line has no place for a name."""
        return JSON_LINES if self.input_names else self.content_type


def base_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def join_kind(content_type: str) -> str | None:
    kind = base_type(content_type)
    if kind in CSV_TYPES:
        return "csv"
    if kind in JSON_TYPES:
        return "json"
    return None


def parse_input_name(text: str) -> tuple[str, int | None]:
    """--input-name's NAME or NAME:COLUMNS (a name may itself hold a colon)."""
    name, colon, columns = text.rpartition(":")
    if colon and name and columns.isdigit():
        if int(columns) < 1:
            raise ConfigError(f"--input-name {text}: an input takes at least one column")
        return name, int(columns)
    if not text:
        raise ConfigError("--input-name: the name is empty")
    return text, None


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

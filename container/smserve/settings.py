"""Every setting the server reads, from the environment, into one frozen object.

`Settings.from_env()` runs once per process: in `serve` (so a bad value stops the
container before gunicorn starts, with a message naming the variable), and in the
gunicorn master (http/gunicorn_conf.py), which hands its object to each worker it forks.
Nothing else in the package reads os.environ (tests/unit/test_environment.py); how each
variable's text becomes a value is variables.py's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping

from smserve import toolkit
from smserve import variables as parse
from smserve.variables import MAX_BATCH_DELAY_MS

DEFAULT_MODEL_DIR = "/opt/ml/model"
# Where SageMaker copies a multi-model endpoint's models (POST /models's url:
# /opt/ml/models/<model_name>/model).
DEFAULT_MODELS_ROOT = "/opt/ml/models"
BATCH_STRATEGIES = ("SINGLE_RECORD", "MULTI_RECORD")
LOG_FORMATS = ("text", "json")
AUTOCAST_MODES = ("off", "fp16", "bf16")
# torch.compile's own mode names, plus off.
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# SageMaker's MaxPayloadInMB when a job sets none.
DEFAULT_PAYLOAD_MB = 6
MB = 1024 * 1024
# SMSERVE_MAX_REQUEST_MB's default: the largest body a server with no settings takes.
DEFAULT_MAX_REQUEST_MB = 100
# gunicorn's default wait for a silent worker, and the least ours is.
SILENT_WORKER_FLOOR_S = 30


class SettingsError(ValueError):
    """An environment variable holds a value the server cannot use."""


@dataclass(frozen=True)
class Settings:
    port: int = 8080
    # None: hardware.plan_workers decides (one on a CPU host; on a GPU host
    # workers_per_gpu per GPU), in the master, which must not initialise CUDA.
    workers: int | None = None
    # None: as many per GPU as the cores and the GPU's memory allow, up to 4
    # (hardware.plan_workers); ignored when `workers` is set.
    workers_per_gpu: int | None = None
    # Seconds a request may take (gunicorn's wait for a silent worker: silent_worker_timeout).
    timeout: int = 60
    graceful_timeout: int = 25
    # None: application/json, or in batch mode a CSV or JSON Lines request's own type.
    default_accept: str | None = None
    model_dir: str = DEFAULT_MODEL_DIR
    batch: bool = False
    batch_strategy: str = "MULTI_RECORD"
    # None: not set by the job; /execution-parameters derives a value. A payload of 0
    # is the job's "no limit" (MaxPayloadInMB=0: bodies of any size, chunked): the
    # server's own limit, max_request_mb, applies then. A concurrency of 0 is read as
    # unset, as SageMaker reads MaxConcurrentTransforms=0.
    max_payload_mb: int | None = None
    max_concurrent_transforms: int | None = None
    # The server's own request body limit: real-time, and in a batch job whose
    # MaxPayloadInMB is 0 (SageMaker's own real-time cap is lower, so the container is
    # never the one to refuse a request SageMaker accepted).
    max_request_mb: int = DEFAULT_MAX_REQUEST_MB
    # Dynamic batching: most samples in one forward pass (None: the model's
    # max_batch_size) and how long the first request of a batch may wait for company.
    max_batch_size: int | None = None
    max_batch_delay_ms: float = 0.0
    # A forward pass of a CPU model measured shorter than this runs on the event loop's
    # thread instead of being handed to the inference thread (Runner._forward); 0: never.
    inline_pass_ms: float = 1.0
    # Slow clients: the request head must arrive within header_timeout seconds, the
    # body within body_timeout (well under SageMaker's 60 s invocation limit); at most
    # max_connections per worker, the longest-waiting evicted first at the cap.
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    # An answer's bytes must keep leaving: a client that stops reading for this long
    # (None: body_timeout) is cut off, so it cannot pin the answer's memory.
    send_timeout: float | None = None
    max_connections: int = 4096
    # Sessions per worker, of each kind: WebSocket sessions served by the model's
    # stream_fn (each holds a thread), and stateful sessions (SageMaker's NEW_SESSION).
    max_sessions: int = 64
    # A stateful session expires this long after it opened (its Expires; use does not
    # renew it: SageMaker routes by that Expires).
    session_ttl_s: float = 1200.0
    # A worker full of sessions closes one idle this long (the longest idle) to open a
    # new one: one client's burst of NEW_SESSION cannot lock everyone out for the TTL.
    session_idle_s: float = 120.0
    # What the sessions' state may hold in a worker, as it is counted: the request that
    # grows it past this is answered 507 and its session closed.
    session_state_mb: int = 1024
    # Requests whose decode or encode cost grows with the body run on this many
    # codec threads, off the event loop.
    codec_threads: int = 2
    # Threads per worker that run the models' input_fn and output_fn (None: the worker's
    # share of the cores, at least 1).
    hook_threads: int | None = None
    # Processes per worker that run the models' input_fn and output_fn instead (0: off,
    # they run on the hook threads): each its own GIL (engine/hooks/processes.py).
    hook_processes: int = 0
    torch_threads: int | None = None
    device: str = "auto"
    # Mixed precision around the forward pass (torch.autocast), and torch.compile of
    # the loaded module before its warm-up; both off unless asked for (model.py).
    autocast: str = "off"
    compile_mode: str = "off"
    # SMSERVE_LOG_LEVEL, else SAGEMAKER_CONTAINER_LOG_LEVEL (the SDK's container_log_level).
    log_level: str = "info"
    log_format: str = "text"
    # A model that fails to load stops the server (exit 3) instead of leaving it up with
    # /ping at 500. For local runs (`make serve` sets it): under SageMaker the container
    # stays up, so that the endpoint reports the failure and the log says why.
    exit_on_load_error: bool = False
    # SageMaker's multi-model endpoints: no model at start; the /models API loads and
    # unloads them (docs/multi-model.md). None room: measured (engine/multimodel/server.py).
    multi_model: bool = False
    models_memory_mb: int | None = None
    # How long POST /models waits for every worker to load a model before it gives the
    # load up: SageMaker lets a multi-model load run for up to 360 s.
    model_load_timeout: int = 360
    # POST /models loads only a folder under this one: its url names a folder whose
    # code/inference.py then runs, so only where SageMaker puts models. "/": any folder.
    models_root: str = DEFAULT_MODELS_ROOT
    # GET /metrics and the recording behind it (off: no route, nothing recorded).
    metrics: bool = True
    # The model's script in its code/ folder, as the SageMaker SDK's entry_point names
    # it; SAGEMAKER_SUBMIT_DIRECTORY may hold it instead, where that is a local folder
    # (smserve/toolkit.py).
    program: str = toolkit.DEFAULT_PROGRAM
    submit_directory: str | None = None
    # Set by `serve` and the container runtime, not by users (_RUNTIME): the workers'
    # shared folder for ready markers and multi-model state, prometheus_client's
    # multiprocess folder (None: single-process metrics), and the GPUs this container
    # may use as the runtime lists them (None: unset; engine/worker/hardware.gpu_count).
    state_dir: str | None = None
    metrics_dir: str | None = None
    cuda_visible_devices: str | None = None
    nvidia_visible_devices: str | None = None

    @property
    def job_sets_no_payload_limit(self) -> bool:
        """A batch job with MaxPayloadInMB=0."""
        return self.batch and self.max_payload_mb == 0

    @property
    def max_body_bytes(self) -> int:
        """The largest request body accepted: the job's payload cap in batch mode,
        unless the job sets none (0); the server's own limit otherwise."""
        if self.batch and not self.job_sets_no_payload_limit:
            return (self.max_payload_mb or DEFAULT_PAYLOAD_MB) * MB
        return self.max_request_mb * MB

    @property
    def body_limit_setting(self) -> str:
        """Which variable sets max_body_bytes, for error messages."""
        if self.job_sets_no_payload_limit:
            return (f"{PREFIX}MAX_REQUEST_MB={self.max_request_mb}, the server's own limit: the job's "
                    "SAGEMAKER_MAX_PAYLOAD_IN_MB=0 sets none; raise it in the model's or job's environment")
        if self.batch:
            return f"SAGEMAKER_MAX_PAYLOAD_IN_MB={self.max_payload_mb or DEFAULT_PAYLOAD_MB}"
        return f"{PREFIX}MAX_REQUEST_MB={self.max_request_mb}"

    @property
    def send_deadline(self) -> float:
        return self.send_timeout if self.send_timeout is not None else self.body_timeout

    @property
    def request_timeout(self) -> int:
        # Batch jobs may set InvocationsTimeoutInSeconds up to 3600 s.
        return max(self.timeout, 3600) if self.batch else self.timeout

    @property
    def silent_worker_timeout(self) -> int:
        # How long gunicorn's arbiter waits for a worker's heartbeat (sent each second)
        # before it kills the worker: at least the longest request, and never under
        # gunicorn's own 30 s, so a short answer deadline (1 s) does not get a worker
        # killed for a heartbeat a loaded machine sent late.
        return max(self.request_timeout, SILENT_WORKER_FLOOR_S)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        values = {}
        for name, (variable, convert) in [*_VARIABLES.items(), *_FALLBACKS.items()]:
            raw = env.get(variable)
            if raw is None or raw.strip() == "" or name in values:
                continue
            try:
                values[name] = convert(raw.strip())
            except (ValueError, TypeError) as e:
                raise SettingsError(f"{variable}={raw!r}: {e}") from None
        for name, (variable, keep_empty) in _RUNTIME.items():
            raw = env.get(variable)
            if raw is not None and (raw.strip() or keep_empty):
                values[name] = raw
        return cls(**values)


# The PyTorch containers take any whole number in these (int() of the text); this server
# takes each one too, one out of its range clamped, and says so at start (toolkit_notes).
# variable -> (field, lowest, highest or None, what a value below the lowest becomes:
# the lowest, or the field's default where the lowest would be a trap: a 1 s deadline).
_JAVA_INT_MAX = 2**31 - 1  # TorchServe's largest batchSize
_CLAMPED: dict[str, tuple[str, int, int | None, bool]] = {
    "SAGEMAKER_TS_BATCH_SIZE": ("max_batch_size", 1, _JAVA_INT_MAX, False),
    "SAGEMAKER_TS_MAX_BATCH_DELAY": ("max_batch_delay_ms", 0, MAX_BATCH_DELAY_MS, False),
    "SAGEMAKER_TS_RESPONSE_TIMEOUT": ("timeout", 1, None, True),
    # TorchServe reads 0 workers as "as many as the machine has": here, the default plan.
    "SAGEMAKER_MODEL_SERVER_WORKERS": ("workers", 1, None, True),
    "SAGEMAKER_MODEL_SERVER_TIMEOUT": ("timeout", 1, None, True),
}


def _clamped(variable: str, raw: str):
    """(the value this server takes for variable's text, why it differs, or None)."""
    field, low, high, default_below = _CLAMPED[variable]
    try:
        number = float(raw)  # a whole number as the containers write it; a decimal is taken too
    except ValueError:
        raise ValueError("must be a whole number") from None
    if number != number:
        raise ValueError("must be a whole number")
    default = Settings.__dataclass_fields__[field].default
    why = None
    if number < low:
        number = default if default_below else low
        why = f"below {low}: taken as " + ("unset (this server's default)" if default_below else str(low))
    elif high is not None and number > high:
        number, why = high, f"above {high}: taken as {high}, this server's most"
    if number is None or isinstance(default, float):
        return number if number is None else float(number), why
    if number == float("inf"):
        raise ValueError("must be a whole number")
    return int(number), why


def _clamp_note(variable: str, raw: str) -> str | None:
    if variable not in _CLAMPED:
        return None
    try:
        return _clamped(variable, raw)[1]
    except ValueError:
        return None  # from_env refuses it, naming the variable


PREFIX = "SMSERVE_"
# field -> (environment variable, parser). The README's settings table lists these.
_VARIABLES: dict[str, tuple[str, Callable[[str], object]]] = {
    "port": ("SAGEMAKER_BIND_TO_PORT", parse.port),
    "workers": ("SAGEMAKER_MODEL_SERVER_WORKERS", lambda raw: _clamped("SAGEMAKER_MODEL_SERVER_WORKERS", raw)[0]),
    "workers_per_gpu": (PREFIX + "WORKERS_PER_GPU", parse.positive_int),
    "timeout": ("SAGEMAKER_MODEL_SERVER_TIMEOUT", lambda raw: _clamped("SAGEMAKER_MODEL_SERVER_TIMEOUT", raw)[0]),
    "default_accept": ("SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT", parse.media_type),
    "model_dir": ("SM_MODEL_DIR", parse.directory),
    "batch": ("SAGEMAKER_BATCH", parse.boolean),
    "batch_strategy": ("SAGEMAKER_BATCH_STRATEGY", parse.one_of(BATCH_STRATEGIES, upper=True)),
    "max_payload_mb": ("SAGEMAKER_MAX_PAYLOAD_IN_MB", parse.payload_mb),
    "max_concurrent_transforms": ("SAGEMAKER_MAX_CONCURRENT_TRANSFORMS", parse.concurrent_transforms),
    "graceful_timeout": (PREFIX + "GRACEFUL_TIMEOUT", parse.positive_int),
    "max_request_mb": (PREFIX + "MAX_REQUEST_MB", parse.positive_int),
    "max_batch_size": (PREFIX + "MAX_BATCH_SIZE", parse.positive_int),
    "max_batch_delay_ms": (PREFIX + "MAX_BATCH_DELAY_MS", parse.delay_ms),
    "inline_pass_ms": (PREFIX + "INLINE_PASS_MS", parse.delay_ms),
    "header_timeout": (PREFIX + "HEADER_TIMEOUT", parse.seconds),
    "body_timeout": (PREFIX + "BODY_TIMEOUT", parse.seconds),
    "send_timeout": (PREFIX + "SEND_TIMEOUT", parse.seconds),
    "max_connections": (PREFIX + "MAX_CONNECTIONS", parse.positive_int),
    "max_sessions": (PREFIX + "MAX_SESSIONS", parse.positive_int),
    "session_ttl_s": (PREFIX + "SESSION_TTL_S", parse.seconds),
    "session_idle_s": (PREFIX + "SESSION_IDLE_S", parse.seconds),
    "session_state_mb": (PREFIX + "SESSION_STATE_MB", parse.positive_int),
    "codec_threads": (PREFIX + "CODEC_THREADS", parse.positive_int),
    "hook_threads": (PREFIX + "HOOK_THREADS", parse.positive_int),
    "hook_processes": (PREFIX + "HOOK_PROCESSES", lambda raw: parse.whole_number(raw, 0, 256, "must be 0 (off) to 256")),
    "torch_threads": (PREFIX + "TORCH_THREADS", parse.positive_int),
    "device": (PREFIX + "DEVICE", parse.device),
    "autocast": (PREFIX + "AUTOCAST", parse.one_of(AUTOCAST_MODES)),
    "compile_mode": (PREFIX + "COMPILE", parse.one_of(COMPILE_MODES)),
    "log_level": (PREFIX + "LOG_LEVEL", parse.log_level),
    "log_format": (PREFIX + "LOG_FORMAT", parse.one_of(LOG_FORMATS)),
    "exit_on_load_error": (PREFIX + "EXIT_ON_LOAD_ERROR", parse.boolean),
    "multi_model": ("SAGEMAKER_MULTI_MODEL", parse.boolean),
    "models_memory_mb": (PREFIX + "MODELS_MEMORY_MB", parse.positive_int),
    "model_load_timeout": (PREFIX + "MODEL_LOAD_TIMEOUT", parse.positive_int),
    "models_root": (PREFIX + "MODELS_ROOT", parse.directory),
    "metrics": (PREFIX + "METRICS", parse.boolean),
    "program": ("SAGEMAKER_PROGRAM", parse.program),
    "submit_directory": ("SAGEMAKER_SUBMIT_DIRECTORY", str),
}
# Read when the field's own variable is unset: SageMaker's name for the same setting.
_FALLBACKS: dict[str, tuple[str, Callable[[str], object]]] = {
    "log_level": ("SAGEMAKER_CONTAINER_LOG_LEVEL", parse.log_level),
    # The SageMaker PyTorch containers' (TorchServe's) names for the same settings.
    "max_batch_size": ("SAGEMAKER_TS_BATCH_SIZE", lambda raw: _clamped("SAGEMAKER_TS_BATCH_SIZE", raw)[0]),
    "max_batch_delay_ms": ("SAGEMAKER_TS_MAX_BATCH_DELAY", lambda raw: _clamped("SAGEMAKER_TS_MAX_BATCH_DELAY", raw)[0]),
    "timeout": ("SAGEMAKER_TS_RESPONSE_TIMEOUT", lambda raw: _clamped("SAGEMAKER_TS_RESPONSE_TIMEOUT", raw)[0]),
}
# field -> (variable, whether an empty value counts), taken as written: set by `serve`
# (the folders) and the container runtime (the devices), not settings a user writes.
# An empty visible-devices list means no GPU.
_RUNTIME: dict[str, tuple[str, bool]] = {
    "state_dir": ("SMSERVE_STATE_DIR", False),
    "metrics_dir": ("PROMETHEUS_MULTIPROC_DIR", False),
    "cuda_visible_devices": ("CUDA_VISIBLE_DEVICES", True),
    "nvidia_visible_devices": ("NVIDIA_VISIBLE_DEVICES", True),
}


def toolkit_notes(env: Mapping[str, str] | None = None) -> list[str]:
    """One start-log line for each SAGEMAKER_TS_* variable set: the setting it became,
    that ours overrode it, or that nothing reads it and what does its work here; and one
    for each toolkit value this server takes otherwise than it is written (clamped)."""
    env = os.environ if env is None else env
    notes = []
    toolkits = sorted(v for v in env if (v.startswith(toolkit.TS_PREFIX) or v in toolkit.TS_UNUSED or v in _CLAMPED)
                      and env[v].strip())
    for variable in toolkits:
        raw = env[variable].strip()
        field = next((f for f, (name, _) in _FALLBACKS.items() if name == variable), None)
        if variable in toolkit.TS_UNUSED or (field is None and variable.startswith(toolkit.TS_PREFIX)):
            instead = toolkit.TS_UNUSED.get(variable, "see docs/migrating.md for this server's settings")
            notes.append(f"{variable} is not used by this server; instead: {instead}")
            continue
        ours = _VARIABLES[field][0] if field is not None else variable
        clamp = _clamp_note(variable, raw)
        if field is None:
            if clamp:
                notes.append(f"{variable}={raw}: {clamp}")
        elif (env.get(ours) or "").strip():
            notes.append(f"{variable}={raw} is overridden by {ours}={env[ours]} (both are set: {ours} wins)")
        else:
            notes.append(f"{variable}={raw} sets {ours}'s setting ({field})" + (f": {clamp}" if clamp else ""))
    return notes



def child_environment(**overrides: str) -> dict[str, str]:
    """The environment a process this server starts runs with: this one's, so that the
    child reads the same settings, with `overrides` on top."""
    return {**os.environ, **overrides}

"""One worker's model server: loads the model off the event loop and runs requests.

No Flask here: the routes call these methods and turn their exceptions into responses.
"""

from __future__ import annotations

import contextlib
import logging
import os
import traceback

import gevent
import numpy as np

from . import hardware
from .errors import BadRequest, HTTPError, ServerError, Unavailable
from .metadata import ModelMetadata
from .runner import Runner
from .settings import MAX_TRANSFORM_BUDGET_MB, Settings

log = logging.getLogger(__name__)

LOADING, READY, FAILED = "loading", "ready", "failed"
# Errors raised by a user's input_fn that mean "this body is bad", not "my code broke".
CLIENT_DATA_ERRORS = (ValueError, TypeError, KeyError, UnicodeDecodeError)
DEFAULT_PAYLOAD_MB = 6


class ModelServer:
    def __init__(self, settings: Settings, worker_index: int = 0, workers: int | None = None,
                 state_dir: str | None = None):
        self.settings = settings
        self.worker_index = worker_index
        self.workers = workers or settings.workers or hardware.default_workers()
        # Where workers leave a ready marker, so /ping on any worker can tell whether
        # all of them are ready (SageMaker sends traffic as soon as one ping is 200).
        self.state_dir = state_dir
        self.runner = Runner(max_delay_s=settings.max_batch_delay_ms / 1000.0)
        self.status = LOADING
        self.error: str | None = None
        self.model = None  # LoadedModel once ready

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Load in the background: /ping answers 503 meanwhile, and gunicorn's
        heartbeat keeps running however long a large model takes."""
        if self.state_dir:
            # A restarted worker must not inherit its predecessor's readiness.
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._marker(self.worker_index))
        gevent.spawn(self._load)

    def _marker(self, index: int) -> str:
        return os.path.join(self.state_dir, f"worker-{index}.ready")

    def _load(self) -> None:
        try:
            self.runner.call(self._load_on_inference_thread)
        except Exception as e:
            self.status, self.error = FAILED, f"{type(e).__name__}: {e}"
            log.error("model failed to load from %s: %s\n%s", self.settings.model_dir, self.error,
                      "".join(traceback.format_exception(e)))
            return
        max_batch = self.settings.max_batch_size or self.model.metadata.max_batch_size
        if self.model.metadata.max_batch_size == 0:
            max_batch = 0  # the model takes whole tensors; never concatenate requests
        self.runner.start(self.model.predict, max_batch)
        self.status = READY
        if self.state_dir:
            try:
                open(self._marker(self.worker_index), "w").close()
            except OSError as e:
                log.warning("cannot leave a ready marker in %s (%s): /ping speaks for this worker only", self.state_dir, e)
                self.state_dir = None
        log.info("worker %d ready: model %r on %s, max batch %d",
                 self.worker_index, self.model.metadata.name, self.model.device, max_batch)

    def _load_on_inference_thread(self) -> None:
        import torch  # only workers import torch: the master must not touch CUDA

        from . import model as model_module

        device = model_module.choose_device(self.settings.device, self.worker_index)
        if device.type == "cpu":
            torch.set_num_threads(self.settings.torch_threads or max(1, hardware.cpu_count() // self.workers))
        self.model = model_module.load_and_warm(self.settings.model_dir, device)

    def check_ready(self) -> None:
        if self.status == READY:
            return
        if self.status == FAILED:
            raise ServerError(f"model failed to load: {self.error}")
        raise Unavailable("model is loading")

    def check_all_ready(self) -> None:
        """This worker and every other one have loaded their model."""
        self.check_ready()
        if not self.state_dir or not os.path.isdir(self.state_dir):
            return
        loading = [i for i in range(self.workers) if not os.path.exists(self._marker(i))]
        if loading:
            raise Unavailable(f"model is loading in worker(s) {', '.join(map(str, loading))} of {self.workers}")

    @property
    def metadata(self) -> ModelMetadata:
        self.check_ready()
        return self.model.metadata

    # ------------------------------------------------------------ inference

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.check_ready()
        return self.runner.infer(inputs)

    @property
    def has_input_fn(self) -> bool:
        return self.status == READY and self.model.hooks.input_fn is not None

    @property
    def uses_byte_hooks(self) -> bool:
        return self.status == READY and self.model.hooks.handles_bytes

    def infer_with_hooks(self, body: bytes, content_type: str, accept: str, decode, encode) -> tuple[bytes, str]:
        """The SageMaker hook chain, each missing hook replaced by the built-in step,
        all on the inference thread (user code may be CPU-bound). decode and encode are
        the built-in steps (encode None: the user's output_fn)."""
        self.check_ready()
        model = self.model
        hooks = model.hooks

        def chain():
            if hooks.input_fn is not None:
                try:
                    data = hooks.input_fn(body, content_type)
                except HTTPError:
                    raise
                except CLIENT_DATA_ERRORS as e:
                    raise BadRequest(f"input_fn rejected the body: {type(e).__name__}: {e}") from e
            else:
                data = model.to_model_input(decode())
            try:
                prediction = model.predict_data(data)
            except HTTPError:
                raise
            except Exception as e:
                log.exception("predict failed")
                raise ServerError(f"model failed: {type(e).__name__}: {e}") from e
            if encode is None:
                result = hooks.output_fn(prediction, accept)
                if isinstance(result, tuple):
                    body_out, media = result
                else:
                    body_out, media = result, accept
                return (body_out.encode() if isinstance(body_out, str) else bytes(body_out)), media
            return encode(model.outputs_to_numpy(prediction))

        return self.runner.call(chain)

    # ------------------------------------------------------------ batch transform

    def execution_parameters(self) -> dict:
        """What this container sustains: a couple of requests per worker in flight
        (one computing, one arriving), within SageMaker's concurrency x payload <= 100 MB."""
        payload = self.settings.max_payload_mb or DEFAULT_PAYLOAD_MB
        concurrency = self.settings.max_concurrent_transforms or 2 * self.workers
        concurrency = max(1, min(concurrency, MAX_TRANSFORM_BUDGET_MB // payload))
        return {
            "MaxConcurrentTransforms": concurrency,
            "BatchStrategy": self.settings.batch_strategy,
            "MaxPayloadInMB": payload,
        }


def worker_slot_from_env() -> dict:
    """This worker's index, the worker count and the shared state folder: set by
    `serve` and gunicorn's post_fork hook, not by users."""
    workers = os.environ.get("SMSERVE_WORKERS")
    return {
        "worker_index": int(os.environ.get("SMSERVE_WORKER_INDEX", "0")),
        "workers": int(workers) if workers else None,
        "state_dir": os.environ.get("SMSERVE_STATE_DIR"),
    }

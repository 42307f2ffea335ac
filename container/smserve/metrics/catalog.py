"""Every metric the server exports, declared once (docs/observability.md lists them).

Built by `Catalog()` in each worker once metrics are enabled, never at import: in
multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set by `serve`) each value lives in a
file named after its type and the worker's pid, and /metrics merges the files of every
worker. Counters and histograms of a worker that died stay in their files, so their
sums never go backwards; the gauges are `live*` modes, whose files the master removes
when it reaps the worker (gunicorn_conf.child_exit).

Labels are bounded: `route` is a route's pattern (`/invocations`,
`/models/{name}/invoke`), never a raw path; `model` is a model's name, one per model
loaded; `code` an HTTP status.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Arrival to last byte: /ping in milliseconds up to a batch job's minutes-long bodies.
REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   300.0)
# A request's wait for its forward pass: none at all when the model is idle, up to the
# batch delay, more when passes queue up.
QUEUE_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Catalog:
    def __init__(self, registry: CollectorRegistry | None):
        """registry: where single-process mode collects them (None in multiprocess
        mode, where the files are what is collected)."""
        r = {"registry": registry}
        self.requests = Counter("smserve_requests", "HTTP requests answered, by route pattern and status code "
                                "(0: the client left before an answer was sent)", ("route", "code"), **r)
        self.request_duration = Histogram("smserve_request_duration_seconds", "From a request's arrival to the "
                                          "last byte of its answer sent", ("route",), buckets=REQUEST_BUCKETS, **r)
        self.inferences = Counter("smserve_inferences", "Records inferred: a request of 3 CSV lines counts 3",
                                  ("model",), **r)
        self.batches = Counter("smserve_batches", "Forward passes (inferences / batches is the mean batch size)",
                               ("model",), **r)
        self.queue_duration = Histogram("smserve_queue_duration_seconds", "A request's wait in the model's queue "
                                        "before its forward pass starts", ("model",), buckets=QUEUE_BUCKETS, **r)
        self.pending = Gauge("smserve_pending_requests", "Requests queued for or in a forward pass, every worker",
                             ("model",), multiprocess_mode="livesum", **r)
        self.model_ready = Gauge("smserve_model_ready", "1 when at least one live worker serves the model",
                                 ("model",), multiprocess_mode="livemax", **r)
        self.workers = Gauge("smserve_workers", "Live worker processes", multiprocess_mode="livesum", **r)
        self.sessions_open = Gauge("smserve_websocket_sessions_open", "WebSocket sessions open now",
                                   multiprocess_mode="livesum", **r)
        self.sessions = Counter("smserve_websocket_sessions", "WebSocket sessions opened", **r)
        self.messages = Counter("smserve_websocket_messages", "WebSocket messages received (whole messages, "
                                "however many frames each)", **r)
        self.streams = Counter("smserve_streamed_responses", "Streamed answers (a predict_fn that yields), "
                               "HTTP chunked or over a WebSocket", **r)
        self.chunks = Counter("smserve_stream_chunks", "Chunks (items) sent by streamed answers", **r)
        self.stateful_sessions_open = Gauge("smserve_sessions_open", "Stateful sessions (SageMaker's SessionId) "
                                            "open now, every worker", multiprocess_mode="livesum", **r)
        self.stateful_sessions = Counter("smserve_sessions", "Stateful sessions by what happened to them: opened, "
                                         "closed (by the client), expired, unloaded (with their model), shutdown, "
                                         "idle (to make room), memory (past the state budget)",
                                         ("how",), **r)
        self.handoffs = Counter("smserve_session_handoffs", "Connections handed to the worker that holds their "
                                "request's stateful session", **r)
        self.session_state = Gauge("smserve_session_state_bytes", "Memory the open sessions' state holds where it "
                                   "can be told (tensors, arrays, bytes, strings and their containers), every worker",
                                   multiprocess_mode="livesum", **r)
        self.cpu = Counter("smserve_process_cpu_seconds", "CPU time (user + system) of the worker processes, "
                           "the workers that exited included", **r)
        self.memory = Gauge("smserve_process_resident_memory_bytes", "Resident memory of the live worker "
                            "processes, summed", multiprocess_mode="livesum", **r)
        self.gpu_allocated = Gauge("smserve_gpu_memory_allocated_bytes", "GPU memory held by tensors "
                                   "(torch.cuda.memory_allocated), the live workers summed, per device",
                                   ("device",), multiprocess_mode="livesum", **r)
        self.gpu_reserved = Gauge("smserve_gpu_memory_reserved_bytes", "GPU memory held by torch's caching "
                                  "allocator (torch.cuda.memory_reserved), the live workers summed, per device",
                                  ("device",), multiprocess_mode="livesum", **r)

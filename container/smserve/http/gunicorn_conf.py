"""gunicorn configuration, as a Python module: `gunicorn -c python:smserve.http.gunicorn_conf`.

Read once by the master: the master's composition root, which reads the settings once
and hands values to gunicorn (and to prometheus_client, through `serve`'s environment),
and the settings themselves and each worker's index to the workers (pre_fork).
gunicorn's per-request hooks (pre_request, post_request) are not called: the worker
owns the request loop (docs/server-behavior.md).
The master never imports torch: each worker (worker.py) loads the model after fork
(CUDA cannot survive a fork).
"""

import shutil

# Imported here, in the master, before any fork: the workers inherit prometheus_client's
# value lock as a real thread lock, not the gevent one their monkey-patching would give.
from prometheus_client import multiprocess

from smserve import logs
from smserve.engine.multimodel.registry import MAX_NAME_CHARS
from smserve.engine.worker import hardware, readiness
from smserve.settings import Settings

_settings = Settings.from_env()

bind = f"0.0.0.0:{_settings.port}"
# gevent greenlets with read deadlines, a connection cap that evicts stalled clients,
# and a SIGTERM drain that loses no request (worker.py says how).
worker_class = "smserve.http.worker.GeventModelWorker"
if _settings.workers:
    workers, _workers_reason = _settings.workers, "SAGEMAKER_MODEL_SERVER_WORKERS"
else:
    _plan = hardware.default_plan(_settings)
    workers, _workers_reason = _plan.workers, _plan.reason
# The arbiter kills a worker whose event loop is silent this long. The loop never runs
# the model (that is the inference thread's job) so only a hung worker trips this; it
# still must exceed the longest request a client may wait for, and the heartbeat's
# lateness on a loaded machine (settings.silent_worker_timeout).
timeout = _settings.silent_worker_timeout
graceful_timeout = _settings.graceful_timeout
# Longer than the load balancer's idle timeout, so it never reuses a connection we closed.
keepalive = 75
# A multi-model name SageMaker may send (MAX_NAME_CHARS) is three times as long
# percent-encoded, in the path of its DELETE and invoke; 1 KB more for the method, the
# rest of the path, a query and the version (4,096 bytes; gunicorn's default is 4,094).
limit_request_line = 3 * MAX_NAME_CHARS + 1024
preload_app = False
# Loaded in each worker around the model server it started (GeventModelWorker.load_wsgi).
wsgi_app = "smserve.routes.app:create_app()"
logconfig_dict = logs.config_dict(_settings.log_level, _settings.log_format)
# The worker writes its own access lines (smserve.access: structured, /ping quiet).
accesslog = None
proc_name = "smserve"
# A runtime control socket is one more writable path and, with several servers on one
# host (tests, local runs), a shared one: nothing here needs it.
control_socket_disable = True


def when_ready(server):
    server.log.info("%d worker%s: %s", workers, "" if workers == 1 else "s", _workers_reason)


def pre_fork(server, worker):
    # Give each worker the lowest index no live worker holds, so a restarted worker
    # takes over its predecessor's GPU (worker i -> GPU i mod n).
    taken = {getattr(w, "smserve_index", None) for w in server.WORKERS.values()}
    worker.smserve_index = next(i for i in range(len(taken) + 1) if i not in taken)
    # The settings this master read, handed to the worker: it reads no environment itself.
    worker.smserve_settings = _settings


def child_exit(server, worker):
    # In the master, the moment a worker is reaped (a crash included): its model no
    # longer serves, so its ready marker goes now, not when a replacement starts.
    state_dir = _settings.state_dir
    if state_dir and getattr(worker, "smserve_index", None) is not None:
        readiness.clear(state_dir, worker.smserve_index)
    # Its live gauges (pending requests, memory, sessions open, model ready) go with it;
    # its counters' and histograms' files stay, so their sums never go backwards.
    if _settings.metrics_dir:
        multiprocess.mark_process_dead(worker.pid)


def worker_exit(server, worker):
    # Draining is gunicorn's: a worker reaches here after its in-flight requests ended.
    # Its buffered access lines go out first (GeventModelWorker.run flushes them on its
    # own way out; this is every other way a worker ends).
    from smserve.http import access

    access.flush()
    server.log.info("worker %s (index %s) exited", worker.pid, getattr(worker, "smserve_index", "?"))


def on_exit(server):
    # serve made these folders for the workers' ready markers and metric files.
    for folder in (_settings.state_dir, _settings.metrics_dir):
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
    server.log.info("shutdown complete")

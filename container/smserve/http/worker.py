"""The gunicorn worker: gevent greenlets for HTTP, with the guarantees SageMaker needs.

Used through `worker_class` in gunicorn_conf.py. gunicorn's own gevent worker parses
and answers requests well, but under the conditions SageMaker creates it loses work
and health: it drops requests already waiting on kept-alive connections at SIGTERM,
holds a client that stalls mid-body forever, lets a slow-client flood fill its
connection pool so `/ping` cannot get in, answers a truncated body as if it were
whole, and accepts connections while its model is still loading. This worker keeps
gunicorn's parser, WSGI environ and response writer and owns the connection loop:

- Each connection has deadlines: its request head must arrive within
  SMSERVE_HEADER_TIMEOUT, its body within SMSERVE_BODY_TIMEOUT, and a kept-alive
  connection may idle for `keepalive` seconds. The body is read whole, here, before
  the app runs: a body shorter than its Content-Length, a malformed chunk or one over
  the payload limit is answered with a JSON error and the connection closed.
- At most SMSERVE_MAX_CONNECTIONS connections; at the cap, a new connection evicts the
  one that has waited longest for request bytes (idle, or stalled inside a request's
  head; never one whose bytes have arrived), so a flood of stalled clients can never
  lock out SageMaker's health check. WebSocket sessions are never evicted, so past the
  cap a new one is refused (503).
- A chunked body holds at most MAX_CHUNKS chunks. After an error answer the connection
  lingers, reading what the client still sends, so that it reads the answer.
- SIGTERM: stop accepting, serve every request whose bytes already reached the
  server (on any connection, pipelined ones included; the accept backlog and siblings'
  hand-overs too), close connections with no request byte waiting at once, close the
  stateful sessions once the last answer is out, exit.
- After the first full start, a (re)started worker accepts connections only once its
  model is loaded, so it never answers 503 while the other workers serve. A
  multi-model server's workers also wait so at the first start, for each other.
- A request for /invocations-bidirectional-stream hands its connection to a WebSocket
  session (websocket.py); at SIGTERM sessions answer what they hold, then close 1001.
- An answer's bytes must keep leaving within SMSERVE_SEND_TIMEOUT: a client that stops
  reading is cut off rather than pinning the answer's memory.
- A request of a stateful session another worker holds moves there with its connection
  (handoff.py).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time

import gevent
from gevent import hub, monkey
from gevent.event import Event
from gevent import socket as gevent_socket
from gevent.server import StreamServer

from smserve import logs
from smserve.engine.runtime import main_lane
from smserve.http import access
from smserve.http.connection import Connection, SettledConfig, bytes_waiting, connection_cap, sweep_idle
from smserve.http.exchange import ExchangeWorker
from smserve.http.handoff import Handoff
from smserve.routes.table import RouteTable
from smserve.settings import Settings

log = logging.getLogger(__name__)

# The loop thread's short system calls each wait up to this to take the GIL back from a
# busy codec or inference thread: CPython's default (5 ms) would make /ping pay it often.
GIL_SWITCH_S = 0.001


class GeventModelWorker(ExchangeWorker):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.connections: dict[object, Connection] = {}
        self.sessions: set = set()  # open WebSocket sessions (websocket.WebSocket)
        self._stopping = Event()  # set at SIGTERM: the main loop starts draining at once
        self.servers: list[StreamServer] = []
        # Connections accepted whose greenlet has not run yet (so not in `connections`):
        # the drain must wait for them too, or a request accepted just before SIGTERM
        # is reset when the worker exits.
        self.starting: set = set()
        # Connections moved between workers for stateful sessions; None with one worker.
        self.handoff: Handoff | None = None
        self.index = 0
        self.stopped_while_starting = False

    # ------------------------------------------------------------ process set-up

    def init_process(self):
        # Until init_signals this process has the master's SIGTERM handler, which only
        # wakes the master: a SIGTERM the master forwards to a worker it has just forked
        # would be lost, and the worker would serve on until the graceful timeout.
        signal.signal(signal.SIGTERM, self._stop_while_starting)
        # gevent's subprocess works only on the thread that runs gevent's loop, but the
        # model is imported, loaded and run on the inference thread, and CUDA builds of
        # torch start a process on import there (cuda.pathfinder -> ctypes.util.
        # find_library -> ldconfig), as triton does when it compiles. The standard
        # subprocess blocks only the thread that calls it. os stays unpatched too: gevent's
        # os.close defers closing a pipe to the loop of the thread that opened it, and the
        # inference thread runs no loop, so a subprocess started there (torch.compile's
        # compiler workers, a user's model_fn) waited forever on a pipe it still held. (No
        # signal patch either: gevent's only matters to its own child watchers, and
        # without the os patch it warns at every start.)
        monkey.patch_all(subprocess=False, os=False, signal=False)
        logs.thread_safe_logging()  # (the patch gave logging gevent's locks, unsafe between threads)
        self.sockets = [
            gevent_socket.socket(s.FAMILY, socket.SOCK_STREAM, fileno=s.sock.detach()) for s in self.sockets
        ]
        hub.reinit()
        # The master's settings (gunicorn_conf.pre_fork): read once, handed down from here.
        self.settings: Settings = self.smserve_settings
        access.buffer_lines(self.settings.log_format)
        sys.setswitchinterval(GIL_SWITCH_S)  # the loop takes the GIL back sooner (the convoy effect)
        self.max_connections = connection_cap(self.settings.max_connections, self.cfg.workers)
        self.parser_cfg = SettledConfig(self.cfg)
        super().init_process()

    def _stop_while_starting(self, sig, frame):
        self.stopped_while_starting = True

    def init_signals(self):
        super().init_signals()
        # gunicorn's handle_exit only flips `alive`; ours also closes idle connections,
        # which must not run inside a signal handler (it switches greenlets).
        signal.signal(signal.SIGTERM, lambda sig, frame: gevent.spawn(self.begin_drain))
        if self.stopped_while_starting:  # nothing loaded or accepted yet: nothing to drain
            self.log.info("worker %s: SIGTERM while it started; exiting", self.pid)
            sys.exit(0)

    def handle_quit(self, sig, frame):
        gevent.spawn(super().handle_quit, sig, frame)

    def handle_usr1(self, sig, frame):
        gevent.spawn(super().handle_usr1, sig, frame)

    def notify(self):
        super().notify()
        if self.ppid != os.getppid():
            self.log.info("Parent changed, shutting down: %s", self)
            sys.exit(0)

    def load_wsgi(self):
        # The worker's composition root: its index (pre_fork) and count from gunicorn, the
        # settings the master read, the model server and the route table made here, and
        # wsgi_app's create_app() serving the same two.
        from smserve.routes import app, endpoints

        self.model_server = app.start_server(self.settings, getattr(self, "smserve_index", 0), self.cfg.workers)
        self.routes: RouteTable = endpoints.build(self.model_server, self.settings)
        with app.serving(self.settings, self.model_server, self.routes):
            super().load_wsgi()

    # ------------------------------------------------------------ main loop

    def run(self):
        # The worker's life runs in a greenlet; the main greenlet serves the main lane,
        # the one place on this thread where torch may run (engine/runtime/main_lane.py).
        main_lane.run(self._live)

    def _live(self):
        self.listener_names = {listener: listener.getsockname() for listener in self.sockets}
        self.index = self.model_server.worker_index
        if self.cfg.workers > 1 and self.model_server.state_dir:
            # Before the model loads: a sibling may hand over a request of a session it
            # thinks is here (this worker's predecessor's), to be refused with a 400 here.
            self.handoff = Handoff(self.model_server.state_dir, self.index)
            self.handoff.listen(self._take_over)
        if self.model_server.defers_accepting():
            self._wait_for_model()
        for listener in self.sockets if self.alive else ():  # (SIGTERM while the model loaded: accept nothing)
            listener.setblocking(1)
            server = StreamServer(listener, handle=self._handler(listener), spawn=self._spawn)
            if self.cfg.workers > 1:
                server.max_accept = 1  # spread a burst of connections over the workers
            server.start()
            self.servers.append(server)
        sweep = gevent.spawn(sweep_idle, self.connections)
        while self.alive:
            self.notify()
            self._stopping.wait(1.0)
        sweep.kill(block=False)
        self._drain()
        if self.handoff is not None:
            self.handoff.close()
        self.model_server.sessions.close_all()  # every request answered: through the model's hook
        from smserve.engine.hooks import processes as hook_processes

        hook_processes.end_all()  # a hung one included
        # Every answer is out and every connection closed. Python's own finalisation
        # (torch, thread pools) would keep the worker, and so the container's stop,
        # waiting seconds more for nothing.
        access.flush()  # os._exit runs no atexit hook
        self.log.info("Worker exiting (pid: %s)", self.pid)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def _wait_for_model(self):
        """A worker restarted after the first full start: the others serve meanwhile,
        so this one takes no connection until its model is ready (or failed to load).
        (A multi-model server's workers wait so at the first start too, for each other.)"""
        while self.alive and self.model_server.loading:
            self.notify()
            gevent.sleep(0.1)

    def begin_drain(self):
        """SIGTERM: stop accepting; close every connection that has no request waiting."""
        if not self.alive:
            return
        self.alive = False
        self._stopping.set()
        access.flush()  # what was answered before the signal is written now, not after the drain
        # Connections still queued in the listen backlog may carry whole requests: take
        # them before the listening socket closes (closing it resets every one of them).
        for server in self.servers:
            server.stop_accepting()
        if self.servers:  # (a worker still waiting for its model took none: its siblings serve those)
            for listener in self.sockets:
                self._accept_backlog(listener)
        for server in self.servers:
            server.close()
        for conn in list(self.connections.values()):
            self._close_if_idle(conn)
        for session in list(self.sessions):
            session.shutdown()

    def _accept_backlog(self, listener):
        while True:
            try:
                raw, addr = listener._sock._accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self.log.warning("cannot take the connections left in the accept backlog: %s", e)
                return
            client = gevent_socket.socket(listener.family, listener.type, fileno=raw)
            self._spawn(self.handle, listener, client, addr)

    def _close_if_idle(self, conn: Connection) -> None:
        """At SIGTERM: a connection with no request byte waiting ends; one in the middle
        of a request (its head included) is served."""
        if not conn.busy and not bytes_waiting(conn.sock):
            conn.end_wait()

    def _spawn(self, *args):
        greenlet = gevent.spawn(*args)
        self.starting.add(greenlet)
        return greenlet

    def _drain(self):
        deadline = time.monotonic() + self.cfg.graceful_timeout
        while (self.connections or self.starting) and time.monotonic() < deadline:
            self.notify()
            for conn in list(self.connections.values()):
                self._close_if_idle(conn)
            gevent.sleep(0.05)
        if self.connections:
            self.log.warning("Worker graceful timeout (pid:%s): %d connection(s) cut", self.pid, len(self.connections))
            for conn in list(self.connections.values()):
                conn.greenlet.kill(block=False)
            gevent.sleep(0.5)

    # ------------------------------------------------------------ connections

    def _handler(self, listener):
        def handle(client, addr):
            self.handle(listener, client, addr)

        return handle

    def _take_over(self, client, addr, ahead: bytes) -> None:
        """A connection a sibling handed over (handoff.py), with what it had read."""
        self._spawn(self.handle, self.sockets[0], client, addr, ahead)

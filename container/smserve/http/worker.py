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

import io
import logging
import os
import socket
import sys
import time

import gevent
from gevent import hub, monkey
from gevent.event import Event
from gevent import socket as gevent_socket
from gevent.server import StreamServer
from gunicorn.http import errors as http_errors
from gunicorn.http import wsgi
from gunicorn.workers import base

from smserve import logs
from smserve.engine.runtime import main_lane
from smserve.http import access
from smserve.http.handoff import Handoff, session_owner
from smserve.http.head import PlainHeadParser
from smserve.http.body import ClientError, asks_to_close, check_head, joined_headers, parse_error, read_body
from smserve.http.connection import (Close, Connection, RequestSource, SettledConfig, buffered, bytes_waiting,
                                     connection_cap, make_room, sweep_idle)
from smserve.http.sending import Sender, SendTimeout, answer_head, reset_on_close, send_error, wsgi_request
from smserve.routes.table import Request, RouteTable, reason
from smserve.settings import Settings
from smserve.http import websocket

log = logging.getLogger(__name__)

# CPython's switch interval is 5 ms: the loop thread's short system calls each wait up
# to that to take the GIL back from a busy codec or inference thread, and /ping pays it
# several times over (docs/performance.md has the figures).
GIL_SWITCH_S = 0.001


class GeventModelWorker(base.Worker):
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

    # ------------------------------------------------------------ process set-up

    def init_process(self):
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
        self.settings = Settings.from_env()  # this worker's one read: handed down from here
        access.buffer_lines(self.settings.log_format)
        # The loop thread makes many short system calls, each giving up the GIL and
        # waiting to take it back from a busy codec or inference thread, up to the
        # switch interval each time (the convoy effect): at CPython's 5 ms a /ping
        # that needs a few of them waited tens of ms behind a big CSV body.
        sys.setswitchinterval(GIL_SWITCH_S)
        self.max_connections = connection_cap(self.settings.max_connections, self.cfg.workers)
        self.parser_cfg = SettledConfig(self.cfg)
        super().init_process()

    def init_signals(self):
        super().init_signals()
        # gunicorn's handle_exit only flips `alive`; ours also closes idle connections,
        # which must not run inside a signal handler (it switches greenlets).
        import signal

        signal.signal(signal.SIGTERM, lambda sig, frame: gevent.spawn(self.begin_drain))

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
        # Index (pre_fork) and count from gunicorn, settings read once; wsgi_app's create_app() wraps this server.
        from smserve.routes import app

        self.model_server = app.start_server(self.settings, getattr(self, "smserve_index", 0), self.cfg.workers)
        with app.serving(self.settings, self.model_server):
            super().load_wsgi()
        self.routes: RouteTable = self.wsgi.extensions["smserve.routes"]

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

    def send_error(self, sock, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        send_error(sock, status, message, headers)

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

    def handle(self, listener, client, addr, ahead: bytes = b""):
        make_room(self.connections, self.max_connections)
        conn = Connection(client)
        self.connections[client] = conn
        self.starting.discard(conn.greenlet)
        try:
            client.setblocking(1)
            self._serve_connection(listener, conn, addr, ahead)
        except (Close, gevent.GreenletExit):
            pass
        except OSError as e:
            self.log.debug("connection ended: %s", e)
        except Exception:
            self.log.exception("error serving a connection")
        finally:
            self.connections.pop(client, None)
            try:
                client.close()
            except OSError:
                pass

    def _serve_connection(self, listener, conn: Connection, addr, ahead: bytes = b"") -> None:
        sock = conn.sock
        parser = PlainHeadParser(self.parser_cfg, RequestSource(conn), addr)
        if ahead:
            parser.unreader.unread(ahead)  # a handed-over request, read by a sibling
        # Not listener.getsockname(): at SIGTERM the listener closes while the
        # connections it accepted are still served.
        listener_name = self.listener_names[listener]
        first = True
        while True:
            conn.busy = False
            conn.waiting_since = time.monotonic()
            if not buffered(parser):
                if not self.alive and not bytes_waiting(sock):
                    return
                # The first request's head must come promptly; later ones may wait
                # for as long as a kept-alive connection may idle.
                idle = self.settings.header_timeout if first else self.cfg.keepalive
                conn.wait_idle(idle)
            conn.busy = True
            first = False
            started = time.monotonic()
            try:
                conn.expect_by(self.settings.header_timeout, 408, "request head not received in time")
                conn.reading_head = True
                try:
                    req = next(parser)
                finally:
                    conn.reading_head = False
            except StopIteration:
                return
            except http_errors.NoMoreData:
                return  # the client closed between requests
            except (ClientError, http_errors.ParseException) as e:
                status, message = (e.status, e.message) if isinstance(e, ClientError) else parse_error(e)
                self.send_error(sock, status, message)
                access.log_request((access.UNPARSED, addr), status, 0, started)  # counted and logged as any answer
                return
            if not self.handle_request(listener_name, req, sock, addr, parser):
                return

    def handle_request(self, listener_name, req, sock, addr, parser) -> bool:
        """Serve one request; True when the connection may carry another. Whatever the
        answer (the route's, an error before it, the WSGI app's), it is logged once, here."""
        started = time.monotonic()
        if req.version > (1, 1):
            req.version = (1, 1)  # a later HTTP/1.x is answered in the version we speak
        if self.handoff is not None:
            owner = session_owner(req)
            if owner is not None and owner != self.index:
                # A session another worker holds: the connection goes there.
                refusal = self.handoff.hand_off(owner, req, sock, addr, parser.unreader.take_buffered())
                if refusal is not None:
                    self.send_error(sock, 400, refusal)
                    access.log_request((req, addr), 400, 0, started)
                return False
        if req.path == websocket.PATH or (req.method == "GET" and websocket.offers_websocket(req)
                                          and not self.settings.multi_model and not self.routes.has_path(req.path)):
            # SageMaker's path, or a handshake (a GET: a POST /invocations is never looked
            # at) on a path the caller chose, any that is not a route: /ping with an Upgrade
            # header is still /ping. Sessions are for single-model endpoints (SageMaker's
            # bidirectional streams take no TargetModel).
            return self._open_session(req, sock, addr, parser, started)
        answered = access.Answered()
        try:
            return self._serve_request(listener_name, req, sock, addr, parser, answered)
        finally:
            access.log_request(answered.environ or (req, addr), answered.status,
                               answered.sent, started, answered.quiet, answered.route, answered.headers)

    def _open_session(self, req, sock, addr, parser, started) -> bool:
        if len(self.connections) > self.max_connections:
            # A session holds its connection for as long as the client likes and is
            # never evicted, so sessions must not take the room /ping needs.
            self.send_error(sock, 503, f"this worker is at its connection cap ({self.max_connections}, "
                                       "SMSERVE_MAX_CONNECTIONS): no new WebSocket session; try again later",
                            {"Retry-After": "1"})
            access.log_request((req, addr), 503, 0, started, route=websocket.PATH)
            return False
        # A WebSocket session takes the connection over until it closes.
        sender = Sender(sock, self.settings.send_deadline)
        websocket.serve(self, sock, sender, req, parser.unreader.take_buffered(), addr)
        return False

    def _send_answer(self, req, sock, sender: Sender, parser, answer, close: bool, answered: "access.Answered") -> bool:
        """A route's answer whose body is in hand: head and body gathered into one
        send. True when the connection may carry another request."""
        payload = answer.body
        status = answer.status
        no_body = status < 200 or status in (204, 304) or req.method == "HEAD"
        try:
            head = answer_head(req.version, status, answer.headers, None if status < 200 or status == 204 else len(payload),
                               close)
        except (ValueError, UnicodeEncodeError) as e:
            self.log.error("%s %s: the answer's head cannot be sent: %s", req.method, req.path, e)
            answered.status = 500
            self.send_error(sock, 500, "internal error: the answer's head cannot be sent")
            return False
        answered.status = status

        def send():
            if no_body:
                sender.sendall(head)
            else:
                sender.send_parts(head, payload)

        if not self._sent(sock, send):
            return False
        answered.sent = 0 if no_body else len(payload)
        return not close and self._goes_on(parser, sock)

    def _sent(self, sock, send) -> bool:
        """send() an answer; False when it could not all leave: cut off at the send
        deadline (the connection is then reset), or the client went away."""
        try:
            send()
        except SendTimeout as e:
            self.log.info("answer cut off: %s", e)
            reset_on_close(sock)
            return False
        except OSError as e:
            self.log.debug("client went away during the answer: %s", e)
            return False
        return True

    def _goes_on(self, parser, sock) -> bool:
        """After an answer that leaves the connection open: after SIGTERM, a connection
        goes on only while requests are already waiting."""
        return self.alive or buffered(parser) or bytes_waiting(sock)

    def _serve_request(self, listener_name, req, sock, addr, parser, answered: "access.Answered") -> bool:
        sender = Sender(sock, self.settings.send_deadline)
        try:
            # Before any 100 Continue: a body that will be refused is not invited.
            declared = check_head(req, self.settings)
            route, params = self.routes.match(req.method, req.path)
            answered.route = route.pattern if route is not None else None
            if route is not None:
                # The table's routes are answered without a WSGI environ or werkzeug objects.
                resp = None
                if req._expected_100_continue:
                    sender.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            else:
                resp, answered.environ = wsgi_request(req, sender, addr, listener_name, self.cfg)
            conn = self.connections[sock]
            conn.expect_by(self.settings.body_timeout, 408,
                           f"request body not received within {self.settings.body_timeout} s")
            body = read_body(req, declared, self.settings, parser.unreader)
        except ClientError as e:
            answered.status = e.status
            self.send_error(sock, e.status, e.message)
            return False
        self.nr += 1
        if self.nr >= self.max_requests and self.alive:
            self.log.info("Autorestarting worker after current request.")
            gevent.spawn(self.begin_drain)
        # The client's last request, or shutting down with no further request arrived:
        # this answer is the last on the connection.
        last = asks_to_close(req) or (not self.alive and not (buffered(parser) or bytes_waiting(sock)))
        if route is not None:
            answer = self.routes.dispatch(route, Request(req.method, req.path, joined_headers(req), body, params,
                                                         req.query))
            answered.quiet = route.quiet
            answered.headers = answer.headers
            if not answer.streamed:
                return self._send_answer(req, sock, sender, parser, answer, last or req.should_close(), answered)
            resp = wsgi.Response(req, sender, self.cfg)
            if last:
                resp.force_close()
            respiter = answer.body
            resp.start_response(f"{answer.status} {reason(answer.status)}", answer.headers)
        else:
            if last:
                resp.force_close()
            environ = answered.environ
            environ["smserve.body"] = body  # the app takes it as it is, without a copy
            environ["wsgi.input"] = io.BytesIO(body)
            environ["CONTENT_LENGTH"] = str(len(body))
            environ.pop("HTTP_TRANSFER_ENCODING", None)
            environ["smserve.worker"] = self
            respiter = self.wsgi(environ, resp.start_response)
        def send():
            for item in respiter:
                resp.write(item)
            resp.close()

        try:
            if not self._sent(sock, send):
                return False
        except Exception:
            if resp.headers_sent:
                # A streamed answer failed part-way: ending the connection without the
                # final chunk is how HTTP says the body is incomplete.
                self.log.exception("response failed after its headers were sent")
                return False
            raise
        finally:
            if hasattr(respiter, "close"):
                respiter.close()
            answered.status, answered.sent = resp.status_code or 0, resp.sent
        return not resp.should_close() and self._goes_on(parser, sock)


"""The connection loop and one request/answer exchange: what the worker does with each
connection it accepts, as gunicorn's base_async.py is to its gevent worker; and the
answer's way out (its head, the send deadline, gunicorn's writer for the app's answers).

A connection's requests are read one after another (kept alive, pipelined), each head
within SMSERVE_HEADER_TIMEOUT and each body whole, within SMSERVE_BODY_TIMEOUT and the
payload limit, before the route runs; the answer leaves within the send deadline, and
its access line is written once. A request of a stateful session another worker holds
moves there with its connection (handoff.py); a WebSocket handshake hands the connection
to a session (websocket.py). The worker's lifecycle (start, accept, drain) is worker.py's;
error answers and the connection's closing are connection.py's.
"""

from __future__ import annotations

import io
import re
import time

import gevent
from gevent import socket as gevent_socket
from gunicorn import SERVER
from gunicorn.http import errors as http_errors
from gunicorn.http import wsgi
from gunicorn.workers import base

from smserve.http import access, websocket
from smserve.http.body import ClientError, asks_to_close, check_head, joined_headers, parse_error, read_body
from smserve.http.connection import (Close, Connection, PlainHeadParser, RequestSource, SendTimeout, buffered,
                                     bytes_waiting, http_date, make_room, reset_on_close, send_error)
from smserve.http.handoff import session_owner
from smserve.routes.table import Request, reason

# What may not appear in a header's value: it would end the field, or the head.
_UNSAFE_VALUE = re.compile(r"[\r\n\0]")


def answer_head(version: tuple[int, int], status: int, headers: list[tuple[str, str]], length: int | None,
                close: bool) -> bytes:
    """The head of an answer our routes made, as gunicorn's response writer would send it
    (Server, Date, Connection, then the route's fields, Content-Length last), without
    its per-answer regular expressions and date formatting: the names are our code's,
    and a value is only checked for what would break the head. version: the request's
    (the answer speaks it, as gunicorn's does). length None: no Content-Length (a 204
    or 1xx)."""
    lines = [f"HTTP/{version[0]}.{version[1]} {status} {reason(status)}\r\nServer: {SERVER}\r\nDate: {http_date()}\r\n"
             f"Connection: {'close' if close else 'keep-alive'}\r\n"]
    for name, value in headers:
        if _UNSAFE_VALUE.search(value) is not None:
            raise ValueError(f"the answer's {name} field holds a line break or NUL")
        lines.append(f"{name}: {value}\r\n")
    if length is not None:
        lines.append(f"Content-Length: {length}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


class Sender:
    """The connection as the response writer sees it: every send must make progress
    within the send deadline, so a client that stops reading cannot hold the worker's
    connection and the answer's memory for ever. A slow reader that keeps reading is
    served to the end."""

    def __init__(self, sock, timeout: float):
        self._sock = sock
        self._timeout = timeout

    def sendall(self, data) -> None:
        self._send_all([memoryview(data).cast("B")])

    def send_parts(self, head: bytes, body) -> None:
        """head, then body, in one system call where the socket takes them (sendmsg
        gathers them: no third buffer to join them in, a copy of the whole answer)."""
        self._send_all([memoryview(head), memoryview(body).cast("B")])

    def _send_all(self, parts: list[memoryview]) -> None:
        """Every byte of parts, in order, each sendmsg resuming where the last stopped."""
        raw = self._sock._sock  # the non-blocking OS socket under gevent's
        parts = [part for part in parts if part]
        while parts:
            try:
                sent = raw.sendmsg(parts)
            except (BlockingIOError, InterruptedError):
                gevent_socket.wait_write(raw.fileno(), timeout=self._timeout, timeout_exc=SendTimeout(
                    f"the client read nothing of its answer for {self._timeout:g} s (SMSERVE_SEND_TIMEOUT)"))
                continue
            while parts and sent >= len(parts[0]):
                sent -= len(parts.pop(0))
            if sent:
                parts[0] = parts[0][sent:]

    def __getattr__(self, name):
        return getattr(self._sock, name)


def wsgi_request(req, sender, addr, listener_name, cfg):
    """gunicorn's response writer and WSGI environ for a request the app answers. A head
    the environ cannot be built from (a SCRIPT_NAME header that is no prefix of the
    path, say) is the client's error."""
    try:
        resp, environ = wsgi.create(req, sender, addr, listener_name, cfg)
    except Exception as e:  # noqa: BLE001 - gunicorn raises plain exceptions for bad heads
        raise ClientError(400, f"malformed request head: {type(e).__name__}: {e}") from None
    environ["wsgi.multithread"] = True
    return resp, environ


class ExchangeWorker(base.Worker):
    """Serves the connections a GeventModelWorker accepts. It reads what the worker set
    up: settings, routes and the WSGI app, the model server, connections (and those
    `starting`) and their cap, the parser's config, the listeners' names, the hand-off
    and this worker's index, the WebSocket sessions, `alive`; and starts its drain
    (`begin_drain`) past gunicorn's max_requests."""

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
                send_error(sock, status, message)
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
                    send_error(sock, 400, refusal)
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
            send_error(sock, 503, f"this worker is at its connection cap ({self.max_connections}, "
                                       "SMSERVE_MAX_CONNECTIONS): no new WebSocket session; try again later",
                            {"Retry-After": "1"})
            access.log_request((req, addr), 503, 0, started, route=websocket.PATH)
            return False
        # A WebSocket session takes the connection over until it closes.
        sender = Sender(sock, self.settings.send_deadline)
        websocket.serve(sock, sender, req, parser.unreader.take_buffered(), addr, server=self.model_server,
                        settings=self.settings, sessions=self.sessions, alive=lambda: self.alive)
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
            send_error(sock, 500, "internal error: the answer's head cannot be sent")
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
            route, params, resp, body = self._read_request(listener_name, req, sock, sender, addr, parser, answered)
        except ClientError as e:
            answered.status = e.status
            send_error(sock, e.status, e.message)
            return False
        self._count_request()
        # The client's last request, or shutting down with no further request arrived:
        # this answer is the last on the connection.
        last = asks_to_close(req) or (not self.alive and not (buffered(parser) or bytes_waiting(sock)))
        if route is None:
            if last:
                resp.force_close()
            respiter = self._call_app(answered.environ, body, resp)
            return self._send_iterable(sock, parser, resp, respiter, answered)
        answer = self.routes.dispatch(route, Request(req.method, req.path, joined_headers(req), body, params, req.query))
        answered.quiet = route.quiet
        answered.headers = answer.headers
        if not answer.streamed:
            return self._send_answer(req, sock, sender, parser, answer, last or req.should_close(), answered)
        resp = wsgi.Response(req, sender, self.cfg)
        if last:
            resp.force_close()
        resp.start_response(f"{answer.status} {reason(answer.status)}", answer.headers)
        return self._send_iterable(sock, parser, resp, answer.body, answered)

    def _read_request(self, listener_name, req, sock, sender, addr, parser, answered: "access.Answered"):
        """(route, its parameters, gunicorn's response writer where the WSGI app answers,
        the whole body); ClientError when the head or the body cannot be served."""
        # Before any 100 Continue: a body that will be refused is not invited.
        declared = check_head(req, self.settings)
        route, params = self.routes.match(req.method, req.path)
        answered.route = route.pattern if route is not None else None
        resp = None
        if route is not None:
            # The table's routes are answered without a WSGI environ or werkzeug objects.
            if req._expected_100_continue:
                sender.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        else:
            resp, answered.environ = wsgi_request(req, sender, addr, listener_name, self.cfg)
        self.connections[sock].expect_by(self.settings.body_timeout, 408,
                                         f"request body not received within {self.settings.body_timeout} s")
        return route, params, resp, read_body(req, declared, self.settings, parser.unreader)

    def _count_request(self) -> None:
        """gunicorn's max_requests: past it this worker drains, and a fresh one takes over."""
        self.nr += 1
        if self.nr >= self.max_requests and self.alive:
            self.log.info("Autorestarting worker after current request.")
            gevent.spawn(self.begin_drain)

    def _call_app(self, environ, body: bytes, resp):
        """The WSGI app's answer to a request no route of the table took."""
        environ["smserve.body"] = body  # the app takes it as it is, without a copy
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        environ.pop("HTTP_TRANSFER_ENCODING", None)
        environ["smserve.worker"] = self
        return self.wsgi(environ, resp.start_response)

    def _send_iterable(self, sock, parser, resp, respiter, answered: "access.Answered") -> bool:
        """An answer whose body is an iterable (the app's, or a streamed route's), written
        through gunicorn's response writer. True when the connection may carry another."""
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

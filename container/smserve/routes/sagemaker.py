"""SageMaker's own routes: the health check, inference, and batch transform's parameters;
and the data plane, the one path every inferring route takes (/invocations,
/models/<name>/invoke, /v2/models/<m>/infer): the body inflated within the worker's room
for inflated bodies, the answer made within the answer's deadline, the body's room given
back once the answer has left; and the reply as a response, with the custom attributes a
hook set."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import gevent
import orjson

from smserve.codecs import contentcoding
from smserve.core import session_ids
from smserve.core.context import CUSTOM_ATTRIBUTES, RequestContext, response_custom_attributes
from smserve.engine.worker import capacity
from smserve.engine.worker.served import ServedModel, Serving
from smserve.errors import AnswerTimeout, NotFound
from smserve.protocols import TABLE
from smserve.protocols.message import Message, ProtocolTable
from smserve.routes import sessions
from smserve.routes.table import Request, Response, json_response, when_answered
from smserve.settings import Settings

PING = "/ping"
INVOCATIONS = "/invocations"
EXECUTION_PARAMETERS = "/execution-parameters"

_PING_OK = [("Content-Type", "text/plain")]


class SageMakerRoutes:
    def __init__(self, server: Serving, settings: Settings, plane: DataPlane | None = None):
        """server: the worker's (a served model, or a multi-model endpoint's server);
        plane: the worker's data plane (made here when not given)."""
        self.server = server
        self.settings = settings
        self.plane = plane or DataPlane(settings, server.pools.offload)

    def ping(self, request: Request) -> Response:
        """200 once every worker's model is loaded and warm; 503 while loading; 500 if
        loading failed. SageMaker pings with GET; a container that takes bidirectional
        streams must answer POST too."""
        self.server.check_all_ready()
        return Response(200, list(_PING_OK), b"")

    def execution_parameters(self, request: Request) -> Response:
        return json_response(orjson.dumps(capacity.execution_parameters(self.settings, self.server.workers)))

    def invocations(self, request: Request) -> Response:
        return invocation(self.server, self.plane, request)

    def no_model_here(self, request: Request) -> Response:
        raise NotFound("this is a multi-model endpoint (SAGEMAKER_MULTI_MODEL=true): invoke a model with "
                       "POST /models/<name>/invoke (SageMaker: InvokeEndpoint with TargetModel)")


def invocation(server: ServedModel, plane: DataPlane, request: Request) -> Response:
    """An inference: the protocol is chosen by the protocol table; a route only moves the
    request in and the reply out."""
    settings, protocols = plane.settings, plane.protocols

    def respond(body: bytes) -> Response:
        message = Message.from_http(body, request.header, context_of(request))
        if request.header(session_ids.SESSION_ID) is not None:
            return sessions.answer(server, request, message, lambda m: protocols.answer(m, server, settings),
                                   reply_response)
        return reply_response(protocols.answer(message, server, settings), message)

    return plane.answer(request, respond)


class DataPlane:
    """One worker's: its settings, its codec offload (engine/runtime/threads.Pools.offload),
    its ledger of inflated bodies (codecs/contentcoding.InflatedBytes) and the protocol
    table that answers a message (protocols.TABLE)."""

    def __init__(self, settings: Settings, offload, protocols: ProtocolTable = TABLE):
        self.settings = settings
        self.offload = offload
        self.protocols = protocols
        self.inflated = contentcoding.InflatedBytes.for_worker(settings.codec_threads, settings.max_body_bytes)

    def answer(self, request: Request, respond: Callable[[bytes], Response]) -> Response:
        """respond(body) -> the request's response, made within the answer's deadline;
        body: the request's, its content coding undone."""
        if request.header("Content-Encoding") is None:  # nothing to undo, no room held
            with answer_deadline(self.settings):
                return respond(request.body)
        inflated = self.body(request)
        try:
            with answer_deadline(self.settings):
                response = respond(inflated.body)
        except BaseException:
            inflated.release()
            raise
        return when_answered(response, inflated.release)

    def body(self, request: Request) -> contentcoding.Inflated:
        """The body as the protocols read it (its `body`): a gzip or deflate body inflated
        (within the payload limit), any other body as it came. Release it once the request
        is done: an inflated body holds room among the worker's until then."""
        settings = self.settings
        return contentcoding.decode(request.body, request.header("Content-Encoding"), settings.max_body_bytes,
                                    settings.body_limit_setting, self.offload, self.inflated)


@contextlib.contextmanager
def answer_deadline(settings: Settings) -> Iterator[None]:
    """The answer's deadline (SAGEMAKER_MODEL_SERVER_TIMEOUT, or the PyTorch containers'
    SAGEMAKER_TS_RESPONSE_TIMEOUT), for every route that infers: past it the client gets
    a 504 at once, its work still queued is dropped unrun (engine/batching/runner.py), and a pass
    already running ends on the inference thread, its result dropped, so the worker and
    the other requests go on. A streamed answer's deadline is its first part."""
    deadline = gevent.Timeout(settings.request_timeout)
    deadline.start()
    try:
        yield
    except gevent.Timeout as e:
        if e is not deadline:
            raise
        raise AnswerTimeout(f"the model did not answer within {settings.request_timeout} s "
                            "(SAGEMAKER_MODEL_SERVER_TIMEOUT); the worker goes on") from None
    finally:
        deadline.close()


def context_of(request: Request):
    """Makes the request's context for the hooks that take one (only they call it): its
    headers, path and query, and the model a multi-model route names."""
    return lambda: RequestContext(request.headers, request.path, request.query, request.params.get("name"))


def reply_response(reply, message) -> Response:
    """The reply as a 200, with the custom attributes a hook set on the request's context
    (X-Amzn-SageMaker-Custom-Attributes). A streamed reply's headers leave with its
    first chunk, which is made before this: what a hook sets after it is not sent."""
    headers = list(reply.headers.items())
    if message.built_context is not None:
        attributes = response_custom_attributes(message.built_context)
        if attributes is not None:
            headers.append((CUSTOM_ATTRIBUTES, attributes))
    return Response(200, headers, reply.body)

"""SageMaker's own routes: the health check, inference, and batch transform's parameters."""

from __future__ import annotations

import contextlib
from typing import Iterator

import gevent
import orjson

from smserve.codecs import contentcoding
from smserve.core.context import CUSTOM_ATTRIBUTES, RequestContext, response_custom_attributes
from smserve.errors import AnswerTimeout, NotFound
from smserve.protocols import dispatch
from smserve.routes import sessions
from smserve.routes.table import Request, Response, json_response, when_answered
from smserve.settings import Settings

PING = "/ping"
INVOCATIONS = "/invocations"
EXECUTION_PARAMETERS = "/execution-parameters"

_PING_OK = [("Content-Type", "text/plain")]


class SageMakerRoutes:
    def __init__(self, server, settings: Settings):
        self.server = server
        self.settings = settings

    def ping(self, request: Request) -> Response:
        """200 once every worker's model is loaded and warm; 503 while loading; 500 if
        loading failed. SageMaker pings with GET; a container that takes bidirectional
        streams must answer POST too."""
        self.server.check_all_ready()
        return Response(200, list(_PING_OK), b"")

    def execution_parameters(self, request: Request) -> Response:
        return json_response(orjson.dumps(self.server.execution_parameters()))

    def invocations(self, request: Request) -> Response:
        return invocation(self.server, self.settings, request)

    def no_model_here(self, request: Request) -> Response:
        raise NotFound("this is a multi-model endpoint (SAGEMAKER_MULTI_MODEL=true): invoke a model with "
                       "POST /models/<name>/invoke (SageMaker: InvokeEndpoint with TargetModel)")


def invocation(server, settings: Settings, request: Request) -> Response:
    """An inference: the protocol is chosen by the protocol table; a route only moves the
    request in and the reply out."""
    body = request_body(server, settings, request)
    try:
        with answer_deadline(settings):
            message = dispatch.Message.from_http(body.body, request.header, context_of(request))
            if sessions.in_session(request):
                answer = sessions.answer(server, request, message, lambda m: dispatch.answer(m, server, settings),
                                         reply_response)
            else:
                answer = reply_response(dispatch.answer(message, server, settings), message)
    except BaseException:
        body.release()
        raise
    return when_answered(answer, body.release)


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


def request_body(server, settings: Settings, request: Request) -> contentcoding.Inflated:
    """The body as the protocols read it (its `body`): a gzip or deflate body inflated
    (within the payload limit), any other body as it came. Release it once the request
    is done: an inflated body holds room among the worker's until then."""
    return contentcoding.decode(request.body, request.header("Content-Encoding"), settings.max_body_bytes,
                                settings.body_limit_setting, server)

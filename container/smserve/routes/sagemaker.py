"""SageMaker's own routes: the health check, inference, and batch transform's parameters."""

from __future__ import annotations

import orjson

from smserve.engine.worker import capacity
from smserve.engine.worker.served import ServedModel, Serving
from smserve.errors import NotFound
from smserve.protocols import dispatch
from smserve.routes import sessions
from smserve.routes.dataplane import DataPlane, context_of, reply_response
from smserve.routes.table import Request, Response, json_response
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
    settings = plane.settings

    def respond(body: bytes) -> Response:
        message = dispatch.Message.from_http(body, request.header, context_of(request))
        if sessions.in_session(request):
            return sessions.answer(server, request, message, lambda m: dispatch.answer(m, server, settings),
                                   reply_response)
        return reply_response(dispatch.answer(message, server, settings), message)

    return plane.answer(request, respond)

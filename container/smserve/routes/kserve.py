"""KServe v2 REST, so tritonclient.http.InferenceServerClient works unmodified."""

from __future__ import annotations

import contextlib
from typing import Iterator

import orjson

from smserve import __version__
from smserve.codecs import v2
from smserve.core import session_ids
from smserve.core.metadata import ModelMetadata
from smserve.engine.worker.served import READY, ServedModel, Serving
from smserve.errors import BadRequest, HTTPError, NotFound
from smserve.protocols.kserve_v2 import v2_reply
from smserve.protocols.message import Message
from smserve.routes.sagemaker import DataPlane, context_of, reply_response
from smserve.routes.table import Request, Response, json_response
from smserve.settings import Settings

SERVER_METADATA = orjson.dumps({"name": "smserve", "version": __version__,
                                "extensions": ["binary_tensor_data", "classification"]})


class KServeRoutes:
    def __init__(self, server: Serving, settings: Settings, models=None, plane: DataPlane | None = None):
        """models: a multi-model endpoint's (engine/multimodel/server.MultiModelServer): each
        loaded model answers under its own name. plane: the worker's data plane, which
        /invocations shares (made here when not given)."""
        self.server = server
        self.settings = settings
        self.models = models
        self.plane = plane or DataPlane(settings, server.pools.offload)

    def server_metadata(self, request: Request) -> Response:
        return json_response(SERVER_METADATA)

    def live(self, request: Request) -> Response:
        return Response(200)

    def ready(self, request: Request) -> Response:
        try:
            self.server.check_all_ready()
        except HTTPError:
            return Response(400)
        return Response(200)

    def model_metadata(self, request: Request) -> Response:
        with self._model(request) as (server, metadata):
            return json_response(orjson.dumps(metadata.to_v2()))

    def model_ready(self, request: Request) -> Response:
        if self.models is None and self.server.status != READY:
            raise BadRequest("Model version not ready")
        with self._model(request):
            return Response(200)

    def infer(self, request: Request) -> Response:
        if request.header(session_ids.SESSION_ID) is not None:
            # Never served without its state: SageMaker's sessions are InvokeEndpoint's.
            raise BadRequest(f"{session_ids.SESSION_ID}: stateful sessions are served on /invocations (and "
                             "/models/<name>/invoke), not on /v2")
        with self._model(request) as (server, metadata):
            return self.plane.answer(request, lambda body: _infer(server, metadata, request, body))

    @contextlib.contextmanager
    def _model(self, request: Request) -> Iterator[tuple[ServedModel, ModelMetadata]]:
        """The named model's server and metadata, for as long as the request uses them."""
        model, version = request.params["model"], request.params.get("version")
        if self.models is not None:
            with self.models.using(model) as server:
                yield server, _versioned(model, version, server.metadata)
            return
        metadata = self.server.metadata
        if model != metadata.name:
            raise NotFound(f"Request for unknown model: '{model}' is not found")
        yield self.server, _versioned(model, version, metadata)


def _infer(server: ServedModel, metadata: ModelMetadata, request: Request, body: bytes) -> Response:
    header_length = v2.header_length_from_header(request.header(v2.HEADER_LENGTH_HEADER), len(body))
    inference = server.pools.offload(len(body), v2.decode_request, body, header_length, metadata)
    message = Message(body, context_of=context_of(request))  # (for its context)
    return reply_response(v2_reply(server, inference, sagemaker=False, message=message), message)


def _versioned(model: str, version: str | None, metadata: ModelMetadata) -> ModelMetadata:
    if version not in (None, "", metadata.version):
        raise NotFound(f"Request for unknown model: '{model}' version {version} is not found")
    return metadata

"""Every route the server answers, declared once: method(s), path pattern, handler.

Adding a route is one line here (its handler takes a routes.table.Request and returns a
routes.table.Response); both our gunicorn worker and the Flask app serve it.
"""

from __future__ import annotations

import orjson

from smserve.engine.worker.served import Serving
from smserve.routes import sagemaker
from smserve.routes.kserve import KServeRoutes
from smserve.routes.metrics import MetricsRoutes
from smserve.routes.models import MODELS, ModelRoutes
from smserve.routes.sagemaker import DataPlane, SageMakerRoutes
from smserve.routes.table import Request, Response, RouteTable, json_response
from smserve.settings import Settings


def build(server: Serving, settings: Settings) -> RouteTable:
    """server: the worker's, a served model or a multi-model endpoint's server."""
    table = RouteTable()
    multi = settings.multi_model
    plane = DataPlane(settings, server.pools.offload)  # every inferring route's, one per worker
    sm = SageMakerRoutes(server, settings, plane)
    table.add(("GET", "POST"), sagemaker.PING, sm.ping, quiet=True)
    table.add("POST", sagemaker.INVOCATIONS, sm.no_model_here if multi else sm.invocations)
    table.add("GET", sagemaker.EXECUTION_PARAMETERS, sm.execution_parameters)

    if multi:
        models = ModelRoutes(server, settings, plane)
        table.add("POST", MODELS, models.load)
        table.add("GET", MODELS, models.list)
        table.add("GET", MODELS + "/{name}", models.describe)
        table.add("DELETE", MODELS + "/{name}", models.unload)
        table.add("POST", MODELS + "/{name}/invoke", models.invoke)

    kserve = KServeRoutes(server, settings, models=server if multi else None, plane=plane)
    table.add("GET", "/v2", kserve.server_metadata)
    table.add("GET", "/v2/health/live", kserve.live, quiet=True)
    table.add("GET", "/v2/health/ready", kserve.ready, quiet=True)
    for model in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        table.add("GET", model, kserve.model_metadata)
        table.add("GET", model + "/ready", kserve.model_ready)
        table.add("POST", model + "/infer", kserve.infer)

    if settings.metrics:
        # Scraped every few seconds: a success is logged at DEBUG, like /ping.
        table.add("GET", "/metrics", MetricsRoutes(server).metrics, quiet=True)

    table.add("GET", "/", _index(table))
    return table


def _index(table: RouteTable):
    """GET /: what this server answers, one line of JSON, for a person trying it with curl."""

    def index(request: Request) -> Response:
        routes = [f"{' '.join(route.methods)} {route.pattern}" for route in table.routes]
        return json_response(orjson.dumps({"name": "smserve", "routes": routes}))

    return index

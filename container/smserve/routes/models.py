"""SageMaker's multi-model API (SAGEMAKER_MULTI_MODEL=true): load, list, describe,
invoke and unload models; engine/multimodel/server.py does the work."""

from __future__ import annotations

import re

import orjson

from smserve.errors import BadRequest
from smserve.routes.sagemaker import DataPlane, invocation
from smserve.routes.table import Request, Response, json_response, when_answered
from smserve.settings import Settings

MODELS = "/models"
# What a page of GET /models holds unless the caller asks for fewer (or more, up to MAX_PAGE).
DEFAULT_PAGE = 100
MAX_PAGE = 1000
TARGET_MODEL_HEADER = "X-Amzn-SageMaker-Target-Model"
# A page's numbers: ASCII digits, and no more than a page or a token can need.
_DIGITS = re.compile(r"[0-9]{1,9}")


class ModelRoutes:
    def __init__(self, models, settings: Settings, plane: DataPlane | None = None):
        """models: the worker's engine/multimodel/server.MultiModelServer; plane: the
        worker's data plane (made here when not given)."""
        self.models = models
        self.settings = settings
        self.plane = plane or DataPlane(settings, models.pools.offload)

    def load(self, request: Request) -> Response:
        try:
            spec = orjson.loads(request.body)
        except orjson.JSONDecodeError as e:
            raise BadRequest(f"the body must be JSON: {{\"model_name\": ..., \"url\": ...}} ({e})") from None
        if not isinstance(spec, dict) or not isinstance(spec.get("model_name"), str) or not spec["model_name"] \
                or not isinstance(spec.get("url"), str):
            raise BadRequest('the body must be {"model_name": "<name>", "url": "<the model\'s folder>"}')
        self.models.load(spec["model_name"], spec["url"])
        # The toolkit's model server's words, which its users' tests and tools match.
        return json_response(orjson.dumps({"status": f'Model "{spec["model_name"]}" Version: 1.0 registered with '
                                                     f'{self.models.workers} initial workers'}))

    def list(self, request: Request) -> Response:
        query = _query(request.query)
        limit = _number(query.get("limit", str(DEFAULT_PAGE)))
        if limit is None or not 1 <= limit <= MAX_PAGE:
            raise BadRequest(f"limit must be a whole number from 1 to {MAX_PAGE}")
        token = query.get("next_page_token") or "0"
        start = _number(token)
        if start is None:
            raise BadRequest(f"invalid next_page_token {token[:40]!r}: send the nextPageToken of the page before")
        return json_response(orjson.dumps(self.models.list(limit, start)))

    def describe(self, request: Request) -> Response:
        return json_response(orjson.dumps(self.models.describe(request.params["name"])))

    def unload(self, request: Request) -> Response:
        name = request.params["name"]
        self.models.unload(name)
        return json_response(orjson.dumps({"status": f'Model "{name}" unregistered'}))

    def invoke(self, request: Request) -> Response:
        """As /invocations answers, with the named model. It counts as in flight until its
        answer has left, streamed answers included: an unload waits for it."""
        local = self.models.model(request.params["name"])
        local.inflight += 1

        def done() -> None:
            local.inflight -= 1

        try:
            answer = invocation(local.server, self.plane, request)
        except BaseException:
            done()
            raise
        return when_answered(answer, done)


def _number(text: str) -> int | None:
    """A whole number in ASCII digits, else None. str.isdigit() takes '²' (which int()
    then refuses) and other scripts' digits (which int() reads), and int() refuses more
    than 4,300 digits: neither is a number a page takes."""
    return int(text) if _DIGITS.fullmatch(text) else None


def _query(query: str) -> dict[str, str]:
    from urllib.parse import parse_qsl

    return dict(parse_qsl(query or "", keep_blank_values=True))

"""The one path every inferring route takes (/invocations, /models/<name>/invoke,
/v2/models/<m>/infer): the body inflated within the worker's room for inflated bodies,
the answer made within the answer's deadline, the body's room given back once the
answer has left; and the reply as a response, with the custom attributes a hook set."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import gevent

from smserve.codecs import contentcoding
from smserve.core.context import CUSTOM_ATTRIBUTES, RequestContext, response_custom_attributes
from smserve.errors import AnswerTimeout
from smserve.routes.table import Request, Response, when_answered
from smserve.settings import Settings


class DataPlane:
    """One worker's: its settings, its codec offload (engine/runtime/pools.Pools.offload)
    and its ledger of inflated bodies (codecs/contentcoding.InflatedBytes)."""

    def __init__(self, settings: Settings, offload):
        self.settings = settings
        self.offload = offload
        self.inflated = contentcoding.InflatedBytes.for_worker(settings.codec_threads, settings.max_body_bytes)

    def answer(self, request: Request, respond: Callable[[bytes], Response]) -> Response:
        """respond(body) -> the request's response, made within the answer's deadline;
        body: the request's, its content coding undone."""
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

"""GET /metrics: SageMaker's detailed observability (and any Prometheus) scrapes it."""

from __future__ import annotations

from smserve import metrics
from smserve.engine.worker.served import Serving
from smserve.metrics import exposition, process
from smserve.routes.table import Request, Response


class MetricsRoutes:
    def __init__(self, server: Serving):
        self.server = server  # for its codec threads: a single- or multi-model server

    def metrics(self, request: Request) -> Response:
        # The answering worker's own counts, CPU and memory as of now; the others' counts
        # are at most tally.FLUSH_INTERVAL_S old, their CPU and memory
        # process.SAMPLE_INTERVAL_S.
        metrics.flush()
        process.sample()
        # Reading and merging every worker's files costs as much as decoding a large
        # body: a codec thread does it, so /ping never waits behind a scrape.
        ok, result = self.server.pools.codec.apply(_collect, (request.header("Accept"), metrics.registry()))
        if not ok:
            raise result
        body, content_type = result
        return Response(200, [("Content-Type", content_type)], body)


def _collect(accept, registry):
    # An exception goes back as a value: raised inside the pool, gevent's hub would
    # print its own traceback besides the table's 500.
    try:
        return True, exposition.collect(accept, registry)
    except Exception as e:  # noqa: BLE001 - raised again on the event loop's side
        return False, e

"""GET /metrics: every worker's metrics in one answer, Prometheus text or OpenMetrics.

Collecting reads and merges one file per metric type per worker (the exited ones'
counters too), so its cost grows with workers x series: the route runs it on a codec
thread, never on the event loop, and holds no lock the inference path takes (the files
are read without prometheus_client's value lock).
"""

from __future__ import annotations

# Imported with the metrics (enable), not at the first scrape: about 0.1 s of imports on
# a codec thread, holding the import lock the loop may need meanwhile.
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector


def every_worker(folder: str) -> CollectorRegistry:
    """Multiprocess mode's registry: the files in folder are the truth, read afresh at
    each collect."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=folder)
    return registry


def collect(accept: str | None, registry: CollectorRegistry) -> tuple[bytes, str]:
    """(body, Content-Type) as the scraper's Accept asks: OpenMetrics when it names
    application/openmetrics-text, else Prometheus text 0.0.4. registry:
    metrics.registry()."""
    encode, content_type = choose_encoder(accept or "")
    return encode(registry), content_type

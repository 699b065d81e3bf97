"""Prometheus metrics of the HTTP service (``GET /metrics``).

Kept in the ingress process, in a registry of its own (not the process-global
one, so nothing else's metrics leak in). Product labels are used only for
products that exist, so unknown names sent by clients cannot blow up the
label space.
"""

from __future__ import annotations

from collections import Counter as Tally

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "ServiceMetrics"]

disable_created_metrics()  # no *_created series: they only add noise to scrapes

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "hetmm_requests",
            "requests by route (grpc_*: hetmm.v1.Inspection calls) and HTTP status",
            ["route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "hetmm_request_seconds",
            "request latency by route",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_images = Histogram(
            "hetmm_batch_images", "images per scoring batch", buckets=BATCH_BUCKETS, registry=self.registry
        )
        self.images = Counter("hetmm_images_scored", "images scored", ["product"], registry=self.registry)
        self.anomalies = Counter("hetmm_anomalies", "images judged anomalous", ["product"], registry=self.registry)
        self.version = Gauge(
            "hetmm_template_version",
            "template version that scored the latest request",
            ["product"],
            registry=self.registry,
        )
        # The three-way verdict (core/review.py): ok | review | reject per product.
        self.verdicts = Counter(
            "hetmm_verdicts", "images by verdict (ok, review, reject)", ["product", "verdict"], registry=self.registry
        )

    def register(self, collector: object) -> None:
        """Another source of series in this registry (the drift alarms: serve/inspections.py)."""
        self.registry.register(collector)  # type: ignore[arg-type]

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def observe_results(self, product: str, results: list[dict]) -> None:
        # once per request, not per image: the same counts, fewer label lookups
        self.images.labels(product).inc(len(results))
        anomalies = sum(1 for r in results if r["is_anomaly"])
        if anomalies:
            self.anomalies.labels(product).inc(anomalies)
        verdicts = Tally(r.get("verdict") or ("reject" if r["is_anomaly"] else "ok") for r in results)
        for v, n in verdicts.items():
            self.verdicts.labels(product, v).inc(n)
        if results:
            self.version.labels(product).set(results[0]["version"])
            # Every image of a batch reports the batch; count the batch once per request.
            self.batch_images.observe(results[0]["timing"]["batch_images"])

    def render(self) -> bytes:
        return generate_latest(self.registry)

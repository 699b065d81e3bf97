"""A line PC's stations on ``/metrics`` (Prometheus text format), for ``hetmm station run --metrics-port``.

Exact semantics (one registry per process, every station of the line in it, labelled ``station``):

- ``hetmm_station_parts_total{station, status, verdict}``: results published, by the part's status
  (``scored``, ``timeout``, ``error``) and, when scored, its verdict (``ok``, ``review``, ``reject``;
  ``""`` otherwise: hetmm_ray/result.py); a part late past its deadline counts twice, as ``timeout``
  and then as scored with its verdict.
- ``hetmm_station_queue_depth{station}``: parts waiting in the station's on-disk queue.
- ``hetmm_station_latency_seconds{station}``: frame taken to verdict, for scored results only
  (a histogram; the buckets span a reject gate's deadlines, 5 ms to 60 s).
- ``hetmm_station_state{station, state}``: 1 for the station's state, 0 for the others: ``ok``
  (nothing waiting), ``degraded`` (parts waiting for an absent service) or ``offline`` (stopped).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["STATES", "StationMetrics"]

STATES = ("ok", "degraded", "offline")
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class StationMetrics:
    """The registry and the metrics of the module docstring."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.parts = Counter(
            "hetmm_station_parts",
            "Results published, by status and verdict",
            ["station", "status", "verdict"],
            registry=self.registry,
        )
        self.queue = Gauge(
            "hetmm_station_queue_depth", "Parts waiting in the on-disk queue", ["station"], registry=self.registry
        )
        self.latency = Histogram(
            "hetmm_station_latency_seconds",
            "Frame taken to verdict (scored results)",
            ["station"],
            buckets=BUCKETS_S,
            registry=self.registry,
        )
        self.state = Gauge(
            "hetmm_station_state", "1 for the station's state", ["station", "state"], registry=self.registry
        )

    def result(self, result: Any) -> None:
        self.parts.labels(result.station, result.status, result.verdict or "").inc()
        if result.status == "scored":
            self.latency.labels(result.station).observe(result.latency_ms / 1000)

    def station(self, name: str, *, state: str, queued: int) -> None:
        self.queue.labels(name).set(queued)
        for s in STATES:
            self.state.labels(name, s).set(1 if s == state else 0)

    def serve(self, port: int, host: str = "127.0.0.1") -> Any:
        """``/metrics`` over HTTP on ``host:port`` (loopback by default); returns the server."""
        from prometheus_client import start_http_server

        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server

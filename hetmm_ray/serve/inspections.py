"""The ingress's side of the inspection record and the drift alarms.

Exact semantics:

- :meth:`Inspections.submit` is the predict path's one call (through ``Console.remember``): it
  hands the request's uploads and results to the recorder (record/writer.py: no I/O, no hashing,
  never waits) under a fresh request id.
- The recorder's background thread makes the rows, feeds them to the drift monitor
  (record/monitor.py), re-evaluates the windows at most once a second, and writes the rows to the
  store when ``ServiceConfig.record`` is on (else it writes nothing and only the monitor sees them).
- :class:`DriftCollector` exports the monitor's state at each scrape of ``/metrics`` (gauges, with
  the product and the version as labels; the names are in :data:`DRIFT_METRICS`), and the record's
  row counters.
- :meth:`Inspections.chart` is the console's drift chart: from the record over a time range when
  the record is on (it survives restarts), else from the monitor's in-memory history.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

from ..config import ServiceConfig
from ..core.drift import QUANTILES
from ..record.monitor import DriftMonitor, DriftSettings, series, state_code
from ..record.writer import InspectionRecorder, RecordSettings
from ..store import VersionedStore

__all__ = ["DRIFT_METRICS", "DriftCollector", "Inspections"]

EVALUATE_EVERY_S = 1.0
DRIFT_METRICS = (
    "hetmm_drift_expected_rate",
    "hetmm_drift_flagged_share",
    "hetmm_drift_parts",
    "hetmm_drift_flag_pvalue",
    "hetmm_drift_score_quantile",
    "hetmm_drift_oof_quantile",
    "hetmm_drift_shift",
    "hetmm_drift_state",
    "hetmm_record_rows",
    "hetmm_record_pending_rows",
)


class Inspections:
    """The recorder and the drift monitor of one ingress (module docstring)."""

    def __init__(self, service: ServiceConfig, store: VersionedStore) -> None:
        self.service = service
        self.store = store
        self.monitor = DriftMonitor(DriftSettings.of(service), self._calibration)
        self._evaluated = 0.0
        self.recorder = InspectionRecorder(
            store.backend if service.record else None, RecordSettings.of(service), sink=self._sink
        )

    def _calibration(self, product: str, version: int) -> Any:
        return self.store.record(product, version).calibration

    def _sink(self, product: str, rows: list[dict[str, Any]]) -> None:
        self.monitor.observe(product, rows)
        if time.monotonic() - self._evaluated >= EVALUATE_EVERY_S:
            self._evaluated = time.monotonic()
            self.monitor.evaluate()

    @property
    def recording(self) -> bool:
        return self.service.record

    def submit(self, product: str, uploads: list[tuple[str, bytes]], results: list[dict[str, Any]]) -> None:
        self.recorder.submit(product, uploads, results, uuid.uuid4().hex)

    def forget(self, product: str) -> None:
        self.monitor.forget(product)

    def chart(self, product: str, hours: float, buckets: int) -> dict[str, Any]:
        """The drift chart's data (module docstring); blocking (the record is read): run in a thread."""
        now = time.time()
        since = now - hours * 3600.0
        self.monitor.evaluate()
        live = self.monitor.snapshot().get(product)
        body: dict[str, Any] = {
            "product": product,
            "since": since,
            "until": now,
            "alpha": self.service.drift_alpha,
            "quantiles": list(QUANTILES),
            "live": None if live is None else _live_json(live),
        }
        if self.service.record:
            from ..record.reader import read_rows

            table = read_rows(
                self.store.backend,
                product,
                since=since,
                columns=["time", "is_anomaly", "score", "expected_rate", "version"],
                labels=False,
            )
            cols = table.to_pydict()
            body["source"] = "record"
            body["points"] = series(
                cols["time"],
                cols["is_anomaly"],
                cols["score"],
                cols["expected_rate"],
                buckets=buckets,
                alpha=self.service.drift_alpha,
                since=since,
                until=now,
            )
        else:
            body["source"] = "memory"
            body["points"] = [p for p in self.monitor.history(product) if p["time"] >= since]
        return body


def _live_json(live: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": live["version"],
        "threshold": live["threshold"],
        "expected_rate": live["expected_rate"],
        "reference_quantiles": live["reference_quantiles"],
        "windows": {
            name: {
                "parts": s.parts,
                "flagged": s.flagged,
                "flagged_share": s.flagged_share,
                "flag_p": s.flag_p,
                "score_quantiles": list(s.score_quantiles),
                "shift": s.shift,
                "shift_p": s.shift_p,
                "state": s.state,
            }
            for name, s in live["windows"].items()
        },
    }


class DriftCollector:
    """A Prometheus collector of the monitor's state and the record's counters (read at each scrape)."""

    def __init__(self, inspections: Inspections) -> None:
        self.inspections = inspections

    def describe(self) -> list[Any]:
        return []  # unchecked collector: the series depend on what the line sent

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        pv, pvw = ["product", "version"], ["product", "version", "window"]
        pvwq, pvq = [*pvw, "quantile"], [*pv, "quantile"]
        expected = GaugeMetricFamily(
            "hetmm_drift_expected_rate", "calibrated false-alarm rate of the version", labels=pv
        )
        share = GaugeMetricFamily("hetmm_drift_flagged_share", "flagged share of the window's parts", labels=pvw)
        parts = GaugeMetricFamily("hetmm_drift_parts", "parts in the window", labels=pvw)
        flag_p = GaugeMetricFamily(
            "hetmm_drift_flag_pvalue", "binomial p-value of the flagged count (tolerance x expected rate)", labels=pvw
        )
        score_q = GaugeMetricFamily("hetmm_drift_score_quantile", "passed parts' score quantile", labels=pvwq)
        oof_q = GaugeMetricFamily(
            "hetmm_drift_oof_quantile", "out-of-fold good scores' quantile (at or below the threshold)", labels=pvq
        )
        shift = GaugeMetricFamily("hetmm_drift_shift", "KS distance of passed scores to out-of-fold", labels=pvw)
        state = GaugeMetricFamily("hetmm_drift_state", "0 ok, 1 defects, 2 drift (core/drift.py)", labels=pvw)
        for product, snap in self.inspections.monitor.snapshot().items():
            v = str(snap["version"])
            if snap["expected_rate"] is not None:
                expected.add_metric([product, v], float(snap["expected_rate"]))
            for q, value in zip(QUANTILES, snap["reference_quantiles"], strict=True):
                if value is not None:
                    oof_q.add_metric([product, v, f"{q:g}"], value)
            for name, s in snap["windows"].items():
                labels = [product, v, name]
                parts.add_metric(labels, s.parts)
                if s.flagged_share is not None:
                    share.add_metric(labels, s.flagged_share)
                flag_p.add_metric(labels, s.flag_p)
                shift.add_metric(labels, s.shift)
                state.add_metric(labels, state_code(s.state))
                for q, value in zip(QUANTILES, s.score_quantiles, strict=True):
                    if value is not None:
                        score_q.add_metric([*labels, f"{q:g}"], value)
        yield from (expected, share, parts, flag_p, score_q, oof_q, shift, state)
        recorder = self.inspections.recorder
        rows = CounterMetricFamily(
            "hetmm_record_rows", "inspection record rows by outcome (written, dropped)", labels=["product", "outcome"]
        )
        for product, counts in sorted(list(recorder.by_product.items())):  # a copy: the writer adds products
            for outcome, n in dict(counts).items():
                rows.add_metric([product, outcome], n)
        yield rows
        yield GaugeMetricFamily(
            "hetmm_record_pending_rows", "rows held in memory (what a crash now would lose)", value=recorder.pending
        )

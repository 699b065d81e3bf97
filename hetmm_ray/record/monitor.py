"""Drift alarms per product: sliding windows of inspected parts, judged by core/drift.py.

Exact semantics (the statistics and states are core/drift.py's):

- Each product keeps the parts scored by **one version**, the latest one seen: a part of another
  version starts the product's windows afresh (a new version has its own threshold and
  calibration; mixing them would measure the change, not the line).
- Windows: the last ``n`` parts for each ``n`` of ``windows`` (named ``"200"``, ``"2000"``), and
  the parts of the last ``window_s`` seconds (named e.g. ``"3600s"``; at most 100,000 parts).
- Reference of a (product, version): the version's out-of-fold scores (``Calibration.scores`` of
  its stored record, read through ``reference(product, version)``), those at or below the
  threshold the parts were judged at; the expected rate is the parts' ``expected_rate`` (the
  operating point's estimated false-alarm rate). A version without calibration: no tests, ``ok``.
- :meth:`DriftMonitor.evaluate` recomputes every window of the products that got parts since
  the last evaluation and appends one point per product to a bounded history (``history``
  points), which the console's chart shows when the record is off; with the record on, the chart
  is computed from the record (:func:`series`) and survives restarts.
- Everything here runs on the recorder's background thread (record/writer.py ``sink``), never on
  the predict path; :meth:`snapshot` is read by the Prometheus collector under the same lock.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.drift import QUANTILES, STATES, WindowStats, binomial_band, quantiles, window_stats
from ..core.scoring import Calibration

__all__ = ["DriftMonitor", "DriftSettings", "ProductDrift", "series"]

MAX_TIME_WINDOW_PARTS = 100_000


@dataclass(frozen=True)
class DriftSettings:
    """``ServiceConfig.drift_*`` (the defaults are there)."""

    windows: tuple[int, ...]
    window_s: float
    alpha: float
    tolerance: float
    min_shift: float
    min_parts: int

    @classmethod
    def of(cls, service: Any) -> DriftSettings:
        return cls(
            windows=tuple(sorted({service.drift_parts_short, service.drift_parts_long})),
            window_s=service.drift_window_s,
            alpha=service.drift_alpha,
            tolerance=service.drift_rate_tolerance,
            min_shift=service.drift_min_shift,
            min_parts=service.drift_min_parts,
        )

    def names(self) -> list[str]:
        return [str(n) for n in self.windows] + [f"{self.window_s:g}s"]


@dataclass
class ProductDrift:
    """One product's windows and their latest statistics."""

    version: int
    threshold: float
    expected_rate: float | None
    reference: tuple[float, ...] | None  # OOF scores at or below the threshold; None: not loaded / none
    parts: deque[tuple[float, float, bool]]  # (time, score, flagged), the longest parts window
    timed: deque[tuple[float, float, bool]]  # the time window
    stats: dict[str, WindowStats] = field(default_factory=dict)
    history: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=2000))
    dirty: bool = False

    def reference_quantiles(self) -> list[float | None]:
        return quantiles(self.reference or ())


class DriftMonitor:
    """Per-product windows and their drift state (module docstring)."""

    def __init__(
        self,
        settings: DriftSettings,
        reference: Callable[[str, int], Calibration | None],
        *,
        clock: Callable[[], float] = time.time,
        history: int = 2000,
    ) -> None:
        self.settings = settings
        self.reference = reference
        self.clock = clock
        self.history_points = history
        self._products: dict[str, ProductDrift] = {}
        self._calibrations: dict[tuple[str, int], Calibration | None] = {}
        self._lock = threading.Lock()

    def _calibration(self, product: str, version: int) -> Calibration | None:
        key = (product, version)
        if key not in self._calibrations:
            try:
                self._calibrations[key] = self.reference(product, version)
            except Exception:  # noqa: BLE001 - a store hiccup: no reference now, asked again next time
                return None
        return self._calibrations[key]

    def observe(self, product: str, rows: Sequence[dict[str, Any]]) -> None:
        """Add parts (rows as the record has them: time, version, score, threshold, is_anomaly,
        expected_rate) to the product's windows."""
        if not rows:
            return
        longest = max(self.settings.windows)
        with self._lock:
            state = self._products.get(product)
            for r in rows:
                version = int(r["version"])
                if state is None or state.version != version:
                    state = ProductDrift(
                        version=version,
                        threshold=float(r["threshold"]),
                        expected_rate=r.get("expected_rate"),
                        reference=None,
                        parts=deque(maxlen=longest),
                        timed=deque(maxlen=MAX_TIME_WINDOW_PARTS),
                        history=deque(maxlen=self.history_points),
                    )
                    self._products[product] = state
                state.threshold = float(r["threshold"])
                state.expected_rate = r.get("expected_rate")
                part = (float(r["time"]), float(r["score"]), bool(r["is_anomaly"]))
                state.parts.append(part)
                state.timed.append(part)
                state.dirty = True

    def evaluate(self) -> None:
        """Recompute the windows of every product with new parts (module docstring)."""
        with self._lock:
            todo = [(p, s) for p, s in self._products.items() if s.dirty]
        for product, state in todo:
            if state.reference is None:
                cal = self._calibration(product, state.version)
                if cal is not None:
                    state.reference = tuple(s for s in cal.scores if s <= state.threshold)
            with self._lock:
                now = self.clock()
                while state.timed and state.timed[0][0] < now - self.settings.window_s:
                    state.timed.popleft()
                windows: dict[str, list[tuple[float, float, bool]]] = {}
                for n in self.settings.windows:
                    windows[str(n)] = list(state.parts)[-n:]
                windows[f"{self.settings.window_s:g}s"] = list(state.timed)
                state.dirty = False
                expected, reference = state.expected_rate, state.reference
            stats = {}
            for name, parts in windows.items():
                stats[name] = window_stats(
                    [p[1] for p in parts],
                    [p[2] for p in parts],
                    expected_rate=float(expected or 0.0),
                    reference=reference or (),
                    alpha=self.settings.alpha if expected is not None and reference else 0.0,
                    tolerance=self.settings.tolerance,
                    min_shift=self.settings.min_shift,
                    min_parts=self.settings.min_parts,
                )
            with self._lock:
                state.stats = stats
                state.history.append(
                    {
                        "time": now,
                        "version": state.version,
                        "expected_rate": expected,
                        "windows": {
                            name: {
                                "parts": s.parts,
                                "flagged_share": s.flagged_share,
                                "band": list(binomial_band(s.parts, float(expected or 0.0), self.settings.alpha)),
                                "score_quantiles": list(s.score_quantiles),
                                "shift": s.shift,
                                "state": s.state,
                            }
                            for name, s in stats.items()
                        },
                    }
                )

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """product -> version, threshold, expected rate, reference quantiles and window stats."""
        with self._lock:
            return {
                p: {
                    "version": s.version,
                    "threshold": s.threshold,
                    "expected_rate": s.expected_rate,
                    "reference_quantiles": s.reference_quantiles(),
                    "windows": dict(s.stats),
                }
                for p, s in self._products.items()
            }

    def history(self, product: str) -> list[dict[str, Any]]:
        with self._lock:
            state = self._products.get(product)
            return [] if state is None else list(state.history)

    def forget(self, product: str) -> None:
        with self._lock:
            self._products.pop(product, None)
            for key in [k for k in self._calibrations if k[0] == product]:
                del self._calibrations[key]


def state_code(state: str) -> int:
    """The gauge value of a state: its index in :data:`~hetmm_ray.core.drift.STATES`."""
    return STATES.index(state)


def series(
    times: Sequence[float],
    flagged: Sequence[bool],
    scores: Sequence[float],
    expected: Sequence[float | None],
    *,
    buckets: int,
    alpha: float,
    since: float | None = None,
    until: float | None = None,
) -> list[dict[str, Any]]:
    """The drift chart's points from record rows (time-sorted or not): ``buckets`` equal spans of
    ``[since, until]`` (default: the rows' own range); per span its parts, flagged share, the
    expected rate (the mean of its rows' ``expected_rate``), the expected band of the share for
    that many parts (core/drift.py ``binomial_band``) and the passed parts' score quantiles.
    Spans without parts are left out."""
    if not times:
        return []
    lo = min(times) if since is None else since
    hi = max(times) if until is None else until
    width = max((hi - lo) / max(buckets, 1), 1e-9)
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(times):
        b = min(buckets - 1, max(0, int((t - lo) / width)))
        groups.setdefault(b, []).append(i)
    out = []
    for b in sorted(groups):
        idx = groups[b]
        n = len(idx)
        k = sum(1 for i in idx if flagged[i])
        rates: list[float] = [e for i in idx if (e := expected[i]) is not None]
        rate = sum(rates) / len(rates) if rates else None
        band = binomial_band(n, rate, alpha) if rate is not None else (None, None)
        passed = [scores[i] for i in idx if not flagged[i]]
        out.append(
            {
                "start": lo + b * width,
                "end": lo + (b + 1) * width,
                "parts": n,
                "flagged_share": k / n,
                "expected_rate": rate,
                "band": list(band),
                "score_quantiles": dict(zip((str(q) for q in QUANTILES), quantiles(passed), strict=True)),
            }
        )
    return out

"""The review band: a three-way verdict ``ok | review | reject`` beside the boolean ``is_anomaly``.

Exact semantics:

- A product may set ``threshold.review_false_alarm_rate`` = ``r`` (None: no band, the default).
  The *review threshold* is the far rule's threshold at rate ``r`` on the version's out-of-fold
  scores (:meth:`~hetmm_ray.core.scoring.Calibration.operating_point` ``("far", r)``): the score
  above which an estimated share ``r`` of good parts lies. ``r`` is meant to be larger than the
  operating rate, so the review threshold is the lower one.
- ``verdict(score)``: ``reject`` when ``score > threshold`` (exactly when ``is_anomaly``, which
  stays as it is); else ``review`` when a band is set and ``score > review_threshold``; else ``ok``.
  A review threshold at or above the threshold leaves the band empty (no ``review`` verdict).
- Without calibration there is no threshold to speak of (``inf``): every verdict is ``ok``, as
  ``is_anomaly`` is False.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: the verdict's words load without torch (a station, the record's writer)
    from .scoring import Calibration

__all__ = ["VERDICTS", "review_threshold", "verdict"]

VERDICTS = ("ok", "review", "reject")


def review_threshold(calibration: Calibration | None, rate: float | None) -> float | None:
    """The review threshold at ``rate`` (module docstring); None without a band or a calibration."""
    if rate is None or calibration is None:
        return None
    return float(calibration.operating_point("far", false_alarm_rate=rate).threshold)


def verdict(score: float, threshold: float, review: float | None) -> str:
    """``ok`` | ``review`` | ``reject`` of one score (module docstring)."""
    if score > threshold:
        return "reject"
    if review is not None and score > review:
        return "review"
    return "ok"

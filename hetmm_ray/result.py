"""The result record: what every path answers for one scored image, built by one function.

Exact semantics (the schema, field by field, is docs/result-record.md):

- :func:`result_record` is the one builder. ``hetmm predict --json``, the service's HTTP predict
  and gRPC ``Predict`` (through the replicas), a station's payload, ``hetmm inspect``'s Parquet
  rows, the inspection record and ``hetmm compare``'s flips all take their fields from it, so the
  same image scored by the same version reads the same everywhere.
- The record's fields are :data:`RECORD_FIELDS`, always all present (``None`` where a field does
  not apply): ``record_version`` (:data:`RECORD_VERSION`, raised when a field changes meaning or
  goes), ``score``, ``threshold``, ``is_anomaly``, ``verdict``, ``review_threshold``, the rule
  fields ``threshold_rule``, ``rule_target``, ``estimated_false_alarm_rate`` (the operating point
  that set the threshold; ``None`` before calibration) and ``version``. Scores and thresholds are
  the detector's floats widened, never rounded.
- One verdict vocabulary, :data:`VERDICTS` = ``ok | review | reject`` (core/review.py):
  ``reject`` exactly when ``is_anomaly`` (``score > threshold``); ``review`` when the product sets a
  review band (``threshold.review_false_alarm_rate``) and the score lies above its lower threshold;
  else ``ok``. :func:`review_threshold_of` is the band of a loaded detector, so every path that
  has the product has the band.
- :func:`rejudged` is a record under another threshold (gRPC's admin override): ``is_anomaly`` and
  ``verdict`` follow it, the rule fields say ``override``.
- A station's part has a ``status`` (:data:`PART_STATUSES`): ``scored`` (its record is there),
  ``timeout`` (no verdict by its deadline yet) or ``error`` (it could not be scored); those are
  never verdicts. A station counts its parts by :data:`PART_OUTCOMES`: a scored part under its
  verdict, another under its status.
- :func:`verdict_word` reads a verdict written by older code: the archive's ``anomaly`` and a
  station's ``good`` / ``anomaly`` become ``reject`` / ``ok``; the current words pass unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .core.review import VERDICTS, review_threshold, verdict

if TYPE_CHECKING:
    from .core.scoring import OperatingPoint

__all__ = [
    "LEGACY_VERDICTS",
    "PART_OUTCOMES",
    "PART_STATUSES",
    "RECORD_FIELDS",
    "RECORD_VERSION",
    "RULE_FIELDS",
    "VERDICTS",
    "rejudged",
    "result_record",
    "result_records",
    "review_threshold_of",
    "verdict_word",
]

RECORD_VERSION = 1
PART_STATUSES = ("scored", "timeout", "error")
PART_OUTCOMES = (*VERDICTS, "timeout", "error")
RULE_FIELDS = ("threshold_rule", "rule_target", "estimated_false_alarm_rate")
RECORD_FIELDS = (
    "record_version",
    "score",
    "threshold",
    "is_anomaly",
    "verdict",
    "review_threshold",
    *RULE_FIELDS,
    "version",
)
# The words older code wrote for a scored part: the archive's Parquet column and a station's payload.
LEGACY_VERDICTS = {"anomaly": "reject", "good": "ok"}


def review_threshold_of(detector: Any) -> float | None:
    """The review band's lower threshold of a loaded detector (its product's
    ``threshold.review_false_alarm_rate`` on its calibration); None when the product sets no band
    or the detector is not calibrated."""
    rate = detector.config.threshold.review_false_alarm_rate
    return review_threshold(detector.calibration, rate)


def result_record(
    *,
    score: float,
    threshold: float,
    review_threshold: float | None,
    operating_point: OperatingPoint | None,
    version: int | None,
) -> dict[str, Any]:
    """The result record of one image scored ``score`` against ``threshold`` (module docstring)."""
    score, threshold = float(score), float(threshold)
    review = None if review_threshold is None else float(review_threshold)
    rule = dict.fromkeys(RULE_FIELDS) if operating_point is None else operating_point.to_json()
    return {
        "record_version": RECORD_VERSION,
        "score": score,
        "threshold": threshold,
        "is_anomaly": score > threshold,
        "verdict": verdict(score, threshold, review),
        "review_threshold": review,
        **{k: rule[k] for k in RULE_FIELDS},
        "version": None if version is None else int(version),
    }


def result_records(prediction: Any, *, review_threshold: float | None) -> list[dict[str, Any]]:
    """The record of every image of a detector's ``Prediction`` (in its order)."""
    return [
        result_record(
            score=s,
            threshold=prediction.threshold,
            review_threshold=review_threshold,
            operating_point=prediction.operating_point,
            version=prediction.version,
        )
        for s in prediction.scores
    ]


def rejudged(record: Mapping[str, Any], *, threshold: float) -> dict[str, Any]:
    """``record`` judged at ``threshold`` instead (an override): rule ``override``, no target or rate."""
    out = dict(record)
    out.update(
        threshold=float(threshold),
        is_anomaly=float(record["score"]) > threshold,
        verdict=verdict(float(record["score"]), float(threshold), record.get("review_threshold")),
        threshold_rule="override",
        rule_target=None,
        estimated_false_alarm_rate=None,
    )
    return out


def verdict_word(word: str | None) -> str | None:
    """The verdict in :data:`VERDICTS` of a word read back from older records (module docstring);
    None stays None; another word is a ValueError."""
    if word is None or word in VERDICTS:
        return word
    if word in LEGACY_VERDICTS:
        return LEGACY_VERDICTS[word]
    raise ValueError(f"verdict {word!r}: expected one of {', '.join(VERDICTS)}")

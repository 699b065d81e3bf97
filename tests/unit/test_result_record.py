"""The one result record (hetmm_ray/result.py): its fields, the verdict rule, an override, old words."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetmm_ray.core.scoring import Calibration
from hetmm_ray.result import (
    RECORD_FIELDS,
    RECORD_VERSION,
    rejudged,
    result_record,
    result_records,
    review_threshold_of,
    verdict_word,
)


def _expected_verdict(score: float, threshold: float, review: float | None) -> str:
    """The rule written out plainly: above the threshold rejects; above the band's lower edge reviews."""
    if score > threshold:
        return "reject"
    if review is not None and review < score:
        return "review"
    return "ok"


def test_every_field_is_present_and_the_verdict_follows_the_rule() -> None:
    calibration = Calibration(tuple(float(x) for x in np.linspace(0.0, 1.0, 50)))
    op = calibration.operating_point("far", false_alarm_rate=0.05)
    review = calibration.operating_point("far", false_alarm_rate=0.3).threshold
    assert review < op.threshold
    for score in np.linspace(-0.5, 2.0, 101):
        for band in (None, review):
            rec = result_record(score=np.float32(score), threshold=op.threshold, review_threshold=band,
                                operating_point=op, version=3)  # fmt: skip
            assert tuple(rec) == RECORD_FIELDS and rec["record_version"] == RECORD_VERSION
            assert rec["verdict"] == _expected_verdict(float(np.float32(score)), op.threshold, band)
            assert rec["is_anomaly"] == (rec["verdict"] == "reject")
            assert type(rec["score"]) is float and rec["version"] == 3 and rec["review_threshold"] == band
            assert (rec["threshold_rule"], rec["rule_target"]) == ("far", 0.05)
    blank = result_record(score=0.4, threshold=math.inf, review_threshold=None, operating_point=None, version=None)
    assert blank["verdict"] == "ok" and blank["threshold_rule"] is None and blank["estimated_false_alarm_rate"] is None


def test_a_prediction_gives_one_record_per_image_and_the_band_of_its_detector() -> None:
    from types import SimpleNamespace

    calibration = Calibration(tuple(float(x) for x in np.linspace(0.0, 1.0, 50)))
    op = calibration.operating_point("far", false_alarm_rate=0.05)
    pred = SimpleNamespace(scores=np.array([0.1, 0.9, 5.0]), threshold=op.threshold, operating_point=op, version=2)
    config = SimpleNamespace(threshold=SimpleNamespace(review_false_alarm_rate=0.3))
    band = review_threshold_of(SimpleNamespace(config=config, calibration=calibration))
    assert band == pytest.approx(calibration.operating_point("far", false_alarm_rate=0.3).threshold)
    none = SimpleNamespace(threshold=SimpleNamespace(review_false_alarm_rate=None))
    assert review_threshold_of(SimpleNamespace(config=none, calibration=calibration)) is None
    records = result_records(pred, review_threshold=band)
    assert [r["verdict"] for r in records] == [_expected_verdict(s, op.threshold, band) for s in pred.scores]
    assert [r["score"] for r in records] == [0.1, 0.9, 5.0]


def test_an_override_judges_again_and_says_so() -> None:
    rec = result_record(score=0.5, threshold=1.0, review_threshold=0.4, operating_point=None, version=1)
    assert rec["verdict"] == "review"
    low = rejudged(rec, threshold=0.45)
    assert (low["is_anomaly"], low["verdict"], low["threshold_rule"], low["threshold"]) == (
        True,
        "reject",
        "override",
        0.45,
    )
    assert low["rule_target"] is None and low["estimated_false_alarm_rate"] is None and rec["verdict"] == "review"


def test_old_words_are_read_as_the_one_vocabulary() -> None:
    assert [verdict_word(w) for w in ("anomaly", "good", "ok", "review", "reject", None)] == [
        "reject",
        "ok",
        "ok",
        "review",
        "reject",
        None,
    ]
    with pytest.raises(ValueError, match="verdict 'timeout'"):
        verdict_word("timeout")  # a status, never a verdict

"""A threshold set far above every good score is reported (core/scoring.OperatingPoint.warning).

The rule is checked against its definition (threshold > THRESHOLD_WARN_OVER_HIGHEST x the highest
out-of-fold score) over seeded score samples of several shapes and sizes, and the image count the
far rule's rank needs against a brute-force search of TailModel's own regimes.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from hetmm_ray.cli.common import _describe_operating_point
from hetmm_ray.config import THRESHOLD_WARN_OVER_HIGHEST
from hetmm_ray.core.calibration import TailModel, empirical_min_images
from hetmm_ray.core.scoring import Calibration, OperatingPoint
from hetmm_ray.workflows.evaluation import EvaluationResult


@pytest.mark.parametrize("rate", [0.003, 0.01, 0.02, 0.05, 0.1, 0.25])
def test_empirical_min_images_is_the_first_n_whose_rank_exists(rate: float) -> None:
    first = next(n for n in range(1, 20_000) if TailModel(np.arange(1.0, n + 1)).regime(rate) == "empirical")
    assert empirical_min_images(rate) == first
    assert all(TailModel(np.arange(1.0, n + 1)).regime(rate) == "empirical" for n in range(first, first + 50))


def _samples() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    out = []
    for n in (12, 37, 100, 300):
        out += [
            (f"lognormal(0.3) n={n}", rng.lognormal(0.0, 0.3, n)),
            (f"lognormal(1.5) n={n}", rng.lognormal(0.0, 1.5, n)),
            # battery_weld's shape: near-copies of other images score ~0, the rest spread widely, so the
            # log scores spread over decades and the log-normal's upper tail runs far past the sample
            (f"log-uniform n={n}", np.exp(rng.uniform(np.log(1e-4), 0.0, n))),
        ]
    return out


@pytest.mark.parametrize("rule", ["far", "sigmas"])
def test_a_warning_exactly_when_the_threshold_is_far_above_every_good_score(rule: str) -> None:
    warned = quiet = 0
    for name, scores in _samples():
        op = Calibration(tuple(scores)).operating_point(rule, sigmas=6.0, false_alarm_rate=0.01)
        far_above = op.threshold > THRESHOLD_WARN_OVER_HIGHEST * float(scores.max())
        assert (op.warning() is not None) == far_above, name
        warned += far_above
        quiet += not far_above
    assert warned and quiet  # both outcomes occur among the samples, so the check above can fail either way


def test_the_warning_says_how_far_why_and_what_to_do() -> None:
    rng = np.random.default_rng(1)
    scores = np.exp(rng.uniform(np.log(1e-4), 0.0, 37))  # 37 images, log scores over four decades
    op = Calibration(tuple(scores)).operating_point("far", false_alarm_rate=0.01)
    ratio = op.threshold / scores.max()
    assert ratio > THRESHOLD_WARN_OVER_HIGHEST  # the case under test
    text = op.warning()
    assert text is not None
    assert f"{ratio:.1f}x" in text and f"{scores.max():.4f}" in text
    assert "37 good images" in text and "from 299 images" in text and "1% false-alarm point" in text
    assert "hetmm calibrate --val" in text
    # shown with the operating point wherever the CLI prints one, on a line of its own
    first, second = _describe_operating_point(op).split("\n")
    assert first.startswith(f"{op.threshold:.4f} (rule far 1%") and second == f"warning: {text}"
    # a point that is no longer the product's (the "before" of a before -> after line) is shown without it
    assert _describe_operating_point(op, warn=False) == first


def test_no_warning_for_labelled_thresholds_or_without_scores() -> None:
    cal = Calibration((0.1, 0.2, 0.3), validation={"threshold": 9.0, "objective": "f1"})
    assert cal.operating_point("validation").warning() is None  # chosen on labelled images: not judged
    assert OperatingPoint(9.0, "far", 0.01, 0.01).warning() is None  # nothing known of the good scores
    op = cal.operating_point("far", false_alarm_rate=0.01)
    assert "\n" not in _describe_operating_point(dataclasses.replace(op, threshold=0.3))
    # the seen scores never change what a point is (stored, compared, sent as JSON)
    assert op == dataclasses.replace(op, highest_good=None, n_good=0)
    assert set(op.to_json()) == {"threshold", "threshold_rule", "rule_target", "estimated_false_alarm_rate"}


def test_evaluate_json_carries_the_warning_only_when_there_is_one() -> None:
    base = EvaluationResult(
        category="c",
        backbone="b",
        weights="w",
        templates="all",
        sheets=3,
        n_train=3,
        n_test=2,
        image_auroc=100.0,
        pixel_auroc=None,
        pro=None,
        images_per_s=1.0,
        fit_seconds=1.0,
        threshold=1.0,
        true_positives=1,
        false_positives=0,
        true_negatives=1,
        false_negatives=0,
    )
    assert "threshold_warning" not in base.to_json() and "warning" not in base.table()
    flagged = dataclasses.replace(base, threshold_warning="the threshold 3.3 is 3.0x ...")
    assert flagged.to_json()["threshold_warning"] == "the threshold 3.3 is 3.0x ..."
    assert re.search(r"^warning\s+the threshold 3\.3 is 3\.0x", flagged.table(), re.MULTILINE)

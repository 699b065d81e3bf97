"""Good frames held more than once (core/good_outliers.py, "Repeated frames", "Which bank frames a drop
list names", "How much of the threshold rests on them"), each against a slow, obvious implementation
of the stated rule."""

from __future__ import annotations

import random

import numpy as np
import pytest

from hetmm_ray.config import DetectorConfig, ThresholdConfig
from hetmm_ray.core.calibration import TailModel, fold_plan
from hetmm_ray.core.good_outliers import (
    LaterCopies,
    calibration_order,
    drop_positions,
    outlier_report,
    repeated_frames,
    threshold_without,
)
from hetmm_ray.core.scoring import Calibration


def _slow_groups(digests: list[str]) -> list[tuple[str, tuple[int, ...]]]:
    """Every digest seen twice or more, in the order of its first index, with all its indices."""
    out = []
    seen: list[str] = []
    for d in digests:
        if d in seen:
            continue
        seen.append(d)
        indices = tuple(i for i in range(len(digests)) if digests[i] == d)
        if len(indices) >= 2:
            out.append((d, indices))
    return out


def _slow_positions(held: list[str], named: list[str]) -> list[int]:
    """Each bank index named: by a plain digest always, by a LaterCopies one unless it is the first."""
    out = []
    for i, d in enumerate(held):
        first = held.index(d) == i
        if any(n == d and not isinstance(n, LaterCopies) for n in named):
            out.append(i)
        elif any(n == d and isinstance(n, LaterCopies) for n in named) and not first:
            out.append(i)
    return out


def test_repeated_frames_matches_the_slow_rule_on_random_banks() -> None:
    rng = random.Random(3)
    for trial in range(400):
        n = rng.randint(0, 30)
        alphabet = [f"{k:02x}" * 16 for k in range(rng.randint(1, 40))]
        digests = [rng.choice(alphabet) for _ in range(n)]
        groups = repeated_frames(digests)
        assert [(g.digest, g.indices) for g in groups] == _slow_groups(digests), (trial, digests)
        assert all(g.later == g.indices[1:] and g.scores == () for g in groups)
    assert repeated_frames(["a", "b", "c"]) == []
    assert [(g.digest, g.indices) for g in repeated_frames(["b", "a", "b", "a", "b"])] == [
        ("b", (0, 2, 4)),
        ("a", (1, 3)),
    ]


def test_drop_positions_matches_the_slow_rule_and_refuses_what_names_nothing() -> None:
    rng = random.Random(5)
    for trial in range(400):
        alphabet = [f"{k:02x}" * 16 for k in range(rng.randint(1, 12))]
        held = [rng.choice(alphabet) for _ in range(rng.randint(2, 20))]
        present = sorted(set(held))
        twice = [g.digest for g in repeated_frames(held)]
        named: list[str] = [d for d in present if rng.random() < 0.3]
        named += [LaterCopies(d) for d in twice if rng.random() < 0.5]
        rng.shuffle(named)
        assert drop_positions(held, named) == _slow_positions(held, named), (trial, held, named)
    # by digest: every copy; as later copies: all but the first; both given: every copy
    held = ["a", "b", "a", "c", "a"]
    assert drop_positions(held, ["a"]) == [0, 2, 4]
    assert drop_positions(held, [LaterCopies("a")]) == [2, 4]
    assert drop_positions(held, [LaterCopies("a"), "a"]) == [0, 2, 4]
    assert drop_positions(held, []) == []
    with pytest.raises(ValueError, match="holds no frame with digest z"):
        drop_positions(held, ["z"])
    with pytest.raises(ValueError, match="holds no frame with digest z"):
        drop_positions(held, [LaterCopies("z")])
    with pytest.raises(ValueError, match="one copy of b: no later copy"):
        drop_positions(held, [LaterCopies("b")])


def _bank_with_repeats(config: DetectorConfig, n: int, copies: dict[int, int]) -> list[str]:
    """``n`` distinct digests, then for each (source, count) ``count`` more copies of frame ``source``."""
    digests = [f"{i:02d}" * 16 for i in range(n)]
    for src, count in copies.items():
        digests += [digests[src]] * count
    return digests


def test_outlier_report_names_the_repeats_and_the_threshold_without_their_later_copies() -> None:
    config = DetectorConfig(threshold=ThresholdConfig(folds=4))
    digests = _bank_with_repeats(config, 30, {4: 1, 11: 2})  # 4 held twice, 11 three times
    order = calibration_order(len(digests), config, digests)
    plan = fold_plan(len(digests), folds=4, max_images=config.threshold.max_images, seed=0, keys=digests)
    rng = np.random.default_rng(2)
    by_image = {i: float(rng.gamma(6.0, 0.05)) for i in order}
    for i, d in enumerate(digests):  # a copy's fold holds its twin: it scores near 0
        if digests.count(d) > 1:
            by_image[i] = 0.0002
    cal = Calibration(tuple(by_image[i] for i in order))
    report = outlier_report(cal, config, digests, mads=5.0)
    assert [(g.digest, g.indices) for g in report.repeats] == [(digests[4], (4, 30)), (digests[11], (11, 31, 32))]
    assert all(g.scores == tuple(by_image[i] for i in g.indices) for g in report.repeats)
    # the slow rule: a copy's fold leaves another copy in the bank
    fold_of = {i: f for f, held in enumerate(plan) for i in held}
    for g in report.repeats:
        want = all(any(fold_of[j] != fold_of[i] for j in g.indices if j != i) for i in g.indices)
        assert g.twin_in_bank == want
    assert report.repeats[0].twin_in_bank  # two copies, 4 folds: always in different folds
    later = {30, 31, 32}
    kept = [by_image[i] for i in order if i not in later]
    assert report.threshold == TailModel(cal.scores).threshold(0.01)
    assert report.threshold_without_repeats == TailModel(kept).threshold(0.01) != report.threshold
    assert report.to_json()["repeats"][1] == {
        "digest": digests[11],
        "indices": [11, 31, 32],
        "scores": [0.0002] * 3,
        "twin_in_bank": report.repeats[1].twin_in_bank,
    }
    assert report.to_json()["threshold_without_repeats"] == report.threshold_without_repeats

    names = [f"good/{i:03d}.png" for i in range(len(digests))]
    text = report.describe(frame_names=names, product="weld")
    assert "repeated good frames: 2 frame(s) held more than once, 3 later copies" in text, text
    assert "  good/004.png = 030.png  held twice, out-of-fold 0.0002 each: each copy's fold holds another copy" in text
    assert "  good/011.png = 031.png = 032.png  held 3 times, out-of-fold 0.0002 each" in text
    assert (
        f"threshold (far) {report.threshold:.4f} with them, {report.threshold_without_repeats:.4f} without the "
        "later copies" in text
    )
    assert text.rstrip().endswith("hetmm drop --product weld --repeats")
    # without file names: the digest's first 12 hex digits and the bank indices
    assert f"  {digests[4][:12]} (bank frames 4 = 30)  held twice" in report.describe()


def test_no_repeats_nothing_said_and_the_threshold_unchanged() -> None:
    config = DetectorConfig(threshold=ThresholdConfig(folds=4))
    digests = [f"{i:02d}" * 16 for i in range(12)]
    cal = Calibration(tuple(float(x) for x in np.random.default_rng(0).gamma(6.0, 0.05, 12)))
    report = outlier_report(cal, config, digests, mads=5.0)
    assert report.repeats == () and report.threshold_without_repeats == report.threshold
    assert report.describe_repeats() is None and "repeated" not in report.describe()


def test_a_later_copy_beyond_max_images_has_no_score_to_remove() -> None:
    config = DetectorConfig(threshold=ThresholdConfig(folds=3, max_images=10))
    digests = [f"{i:02d}" * 16 for i in range(12)]
    order = calibration_order(12, config, digests)
    unscored = next(i for i in range(12) if i not in order)
    digests.append(digests[unscored])  # a frame beyond max_images, held twice
    order = calibration_order(13, config, digests)
    scores = tuple(float(x) for x in np.random.default_rng(1).gamma(6.0, 0.05, len(order)))
    report = outlier_report(Calibration(scores), config, digests, mads=5.0)
    (g,) = report.repeats
    # equal keys sort side by side in the fold plan's draw: the copy is beyond max_images as well
    assert g.indices == (unscored, 12) and unscored not in order and 12 not in order
    assert g.scores == (None, None) and not g.twin_in_bank
    assert report.threshold_without_repeats == report.threshold
    assert "held twice, no out-of-fold score (beyond threshold.max_images)" in report.describe()


def test_threshold_without_is_the_rule_on_the_remaining_scores() -> None:
    scores = tuple(float(x) for x in np.random.default_rng(4).gamma(6.0, 0.05, 40))
    cal = Calibration(scores)
    far = DetectorConfig(threshold=ThresholdConfig(rule="far", false_alarm_rate=0.02))
    gone = {0, 7, 39}
    kept = [s for i, s in enumerate(scores) if i not in gone]
    assert threshold_without(cal, far, gone) == TailModel(kept).threshold(0.02)
    assert threshold_without(cal, far, []) == TailModel(scores).threshold(0.02)
    assert threshold_without(cal, far, range(40)) == TailModel(scores).threshold(0.02)  # nothing would be left
    sigmas = DetectorConfig(threshold=ThresholdConfig(rule="sigmas", sigmas=3.0))
    assert threshold_without(cal, sigmas, gone) == pytest.approx(np.mean(kept) + 3.0 * np.std(kept, ddof=1))
    # the validation rule's threshold was chosen on labelled images: removing good scores leaves it
    labelled = Calibration(scores, validation={"threshold": 0.5, "objective": "f1"})
    validation = DetectorConfig(threshold=ThresholdConfig(rule="validation"))
    assert threshold_without(labelled, validation, gone) == 0.5

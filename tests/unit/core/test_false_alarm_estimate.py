"""The false-alarm estimate reported with a threshold (core/calibration.py, "The estimate reported with
a threshold"), the far rule at a few rates (``rate_choices``) and the good frames standing apart
(core/good_outliers.py), each against a slow, obvious implementation of the stated rule."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from hetmm_ray.config import DetectorConfig, ThresholdConfig
from hetmm_ray.core.calibration import (
    ESTIMATE_CONFIDENCE,
    MIN_RATE,
    TailModel,
    beta_quantile,
    clopper_pearson,
    describe_rate_choices,
    fold_plan,
    rate_choices,
)
from hetmm_ray.core.good_outliers import MAD_TO_SIGMA, calibration_order, outlier_report, standing_apart
from hetmm_ray.core.scoring import Calibration


def _slow_estimate(scores: np.ndarray, t: float) -> tuple[float, int, float, float]:
    """The stated rule, literally: (rate, above, low, high)."""
    x = np.sort(np.asarray(scores, dtype=np.float64))
    n = len(x)
    m = sum(1 for s in x if s > t)
    alpha = 1 - ESTIMATE_CONFIDENCE
    low = 0.0 if m == 0 else stats.beta.ppf(alpha / 2, m, n - m + 1)
    high = 1.0 if m == n else stats.beta.ppf(1 - alpha / 2, m + 1, n - m)
    floor = x[max(0, n - 3)]
    if t <= floor:
        return (m + 1) / (n + 1), m, low, high
    logs = np.log(np.maximum(x, 1e-6))
    mu = float(np.median(logs))
    upper = logs[logs > mu] - mu
    s = float(np.median(upper)) / stats.norm.ppf(0.75) if len(upper) else 0.0
    tail = stats.norm.sf((math.log(max(t, 1e-6)) - mu) / s) if s > 0 else 0.0
    at_floor = (sum(1 for v in x if v > floor) + 1) / (n + 1)
    return max(MIN_RATE, low, min(tail, at_floor)), m, low, high


def _binomial_tail(n: int, p: Fraction, k: int) -> Fraction:
    """P(Binomial(n, p) >= k), exactly."""
    return sum((math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1)), Fraction(0))


@pytest.mark.parametrize(("q", "a", "b"), [(0.025, 1, 20), (0.975, 3, 17), (0.5, 4, 4), (0.1, 7, 30), (0.9, 12, 3)])
def test_beta_quantile_against_the_binomial_sum(q, a, b):
    # For integer a, b: I_x(a, b) = P(Binomial(a + b - 1, x) >= a), summed exactly at the quantile found.
    x = beta_quantile(q, a, b)
    assert float(_binomial_tail(a + b - 1, Fraction(x), a)) == pytest.approx(q, abs=1e-9)
    assert x == pytest.approx(stats.beta.ppf(q, a, b), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(("m", "n"), [(0, 10), (1, 10), (10, 10), (2, 278), (150, 300), (3, 5000)])
def test_clopper_pearson_against_scipy(m, n):
    lo, hi = clopper_pearson(m, n, 0.95)
    assert lo == (0.0 if m == 0 else pytest.approx(stats.beta.ppf(0.025, m, n - m + 1), rel=1e-8))
    assert hi == (1.0 if m == n else pytest.approx(stats.beta.ppf(0.975, m + 1, n - m), rel=1e-8))


@pytest.mark.parametrize("n", [5, 37, 120, 278, 299, 600])
def test_the_estimate_is_the_stated_rule_at_every_threshold(n):
    rng = np.random.default_rng(n)
    scores = np.concatenate([rng.gamma(4.0, 0.05, size=n - 2), [0.9, 1.4]])  # two good frames far out
    tail = TailModel(scores.tolist())
    rates = [0.001, 0.005, 0.01, 0.02, 0.05, 0.2, 0.5]
    probes = sorted({*(tail.threshold(r) for r in rates), *scores.tolist(), *np.linspace(-0.1, 2.0, 41).tolist()})
    last = math.inf
    for t in probes:
        est = tail.estimate(t)
        rate, above, low, high = _slow_estimate(scores, t)
        assert est.rate == pytest.approx(rate, rel=1e-9), t
        assert est.above == above and est.n == n
        assert est.low == pytest.approx(low, rel=1e-7, abs=1e-12) and est.high == pytest.approx(high, rel=1e-7)
        assert est.low <= est.rate <= est.high
        assert est.rate <= last + 1e-15  # never rises with the threshold
        last = est.rate
        assert tail.false_alarm_rate(t) == est.rate


def test_when_the_floor_decides_the_estimate_is_the_floors_own_rate():
    # 278 good frames, two of them far out: at 1 % no rank exists (299 needed), the tail model lands
    # below the third-highest score, so the floor sets the threshold; 2 of 278 scores lie above it.
    rng = np.random.default_rng(7)
    scores = np.concatenate([rng.gamma(6.0, 0.05, size=276), [0.75, 0.74]])
    tail = TailModel(scores.tolist())
    t = tail.threshold(0.01)
    assert t == tail.floor and tail.regime(0.01) == "parametric"
    est = tail.estimate(t)
    assert est.regime == "empirical" and est.above == 2
    assert est.rate == pytest.approx(3 / 279)  # not the tail model's share beyond the floor
    z = (math.log(t) - tail.mu) / tail.log_scale
    assert stats.norm.sf(z) < 0.01 < est.rate  # the tail model alone claims fewer than asked; the data more
    assert est.low < 2 / 278 < est.high


def test_the_interval_covers_the_true_rate_of_far_thresholds():
    # The stated error, checked where the truth is known: draws from a family, the far rule's
    # threshold, its true share above from the family's survival function.
    families = {"lognormal": stats.lognorm(0.4), "gamma": stats.gamma(4.0), "weibull": stats.weibull_min(2.0)}
    rng = np.random.default_rng(11)
    for name, dist in families.items():
        for n, rate in ((60, 0.05), (278, 0.01), (300, 0.01)):
            hits = point_err = 0
            draws = 100
            for _ in range(draws):
                x = dist.rvs(size=n, random_state=rng)
                tail = TailModel(x.tolist())
                t = tail.threshold(rate)
                est = tail.estimate(t)
                truth = float(dist.sf(t))
                hits += est.low <= truth <= est.high
                point_err += abs(est.rate - truth)
            assert hits / draws >= 0.9, (name, n, rate, hits / draws)
            assert point_err / draws < 1.5 * rate, (name, n, rate)


def test_rate_choices_against_counting():
    rng = np.random.default_rng(3)
    oof = rng.lognormal(-1.0, 0.3, size=150)
    bad = rng.lognormal(-0.3, 0.4, size=25)
    good = rng.lognormal(-1.0, 0.3, size=30)
    tail = TailModel(oof.tolist())
    rows = rate_choices(oof.tolist(), (0.01, 0.02, 0.05), defective_scores=bad.tolist(), good_scores=good.tolist())
    assert [r.rate for r in rows] == [0.01, 0.02, 0.05]
    for r in rows:
        assert r.threshold == tail.threshold(r.rate)
        assert r.estimate.above == sum(1 for s in oof if s > r.threshold)
        assert r.defective_flagged == sum(1 for s in bad if s > r.threshold) and r.defective == 25
        assert r.good_flagged == sum(1 for s in good if s > r.threshold) and r.good == 30
        assert r.recall == r.defective_flagged / 25
    assert rows[0].threshold >= rows[1].threshold >= rows[2].threshold
    table = describe_rate_choices([r.to_json() for r in rows])
    assert "recall on labelled defects" in table and f"{rows[2].estimate.above} of 150" in table
    assert rate_choices(oof.tolist(), (0.01,))[0].recall is None


def test_standing_apart_is_median_plus_k_scaled_mads():
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.gamma(6.0, 0.05, size=200), [0.9, 1.2, 0.33]])
    med, spread, cut, pos = standing_apart(x.tolist(), mads=5.0)
    assert cut == pytest.approx(med + 5.0 * spread)
    # The scale of a normal's MAD, from its quantile function: the constant is rounded to 4 decimals.
    assert MAD_TO_SIGMA == pytest.approx(1 / stats.norm.ppf(0.75), rel=1e-4)
    assert med == pytest.approx(np.median(x)) and spread == pytest.approx(
        MAD_TO_SIGMA * np.median(np.abs(x - np.median(x)))
    )
    want = [i for i in np.argsort(-x, kind="stable") if x[i] > np.median(x) + 5.0 * spread]
    assert pos == want and {200, 201} <= set(pos)
    assert standing_apart([1.0, 1.0, 1.0, 2.0], mads=3.0)[2:] == (None, [])  # no spread: nothing named
    with pytest.raises(ValueError):
        standing_apart([1.0], mads=0)


def test_outlier_report_names_the_frames_by_the_fold_plan_and_recomputes_the_threshold():
    config = DetectorConfig(threshold=ThresholdConfig(folds=4, max_images=10))
    digests = [f"{i:02d}" * 16 for i in range(12)]  # two beyond max_images: never scored, never named
    order = calibration_order(12, config, digests)
    plan = fold_plan(12, folds=4, max_images=10, seed=config.threshold.seed, keys=digests)
    assert order == [i for fold in plan for i in fold] and len(order) == 10
    rng = np.random.default_rng(1)
    by_image = {i: float(rng.gamma(6.0, 0.05)) for i in order}
    marked = order[3]
    by_image[marked] = 5.0
    cal = Calibration(tuple(by_image[i] for i in order))
    report = outlier_report(cal, config, digests, mads=5.0)
    assert [(f.index, f.digest, f.score) for f in report.frames] == [(marked, digests[marked], 5.0)]
    kept = [by_image[i] for i in order if i != marked]
    assert report.threshold == TailModel(cal.scores).threshold(0.01)
    assert report.threshold_without == TailModel(kept).threshold(0.01) != report.threshold
    assert "standing apart: 1 of 10" in report.describe({digests[marked]: "marked.png"})
    assert "marked.png  5.0000" in report.describe({digests[marked]: "marked.png"})
    with pytest.raises(ValueError, match="not computed from this bank"):
        outlier_report(cal, config, digests[:9], mads=5.0)

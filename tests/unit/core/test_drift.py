"""core/drift.py and core/review.py against slow, obvious implementations (and scipy where it has one)."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import numpy as np
import pytest

from hetmm_ray.core.drift import (
    STATES,
    binom_cdf,
    binom_sf,
    binomial_band,
    drift_state,
    ks_distance,
    ks_pvalue,
    quantiles,
    window_stats,
)
from hetmm_ray.core.review import review_threshold, verdict
from hetmm_ray.core.scoring import Calibration


def slow_binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) in exact rationals."""
    q = Fraction(p)
    return float(sum(math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(max(k, 0), n + 1)))


@pytest.mark.parametrize(("n", "p"), [(1, 0.5), (10, 0.01), (37, 0.2), (200, 0.01), (200, 0.05)])
def test_binomial_tails_equal_exact_rational_sums(n: int, p: float) -> None:
    for k in sorted({0, 1, 2, 3, n // 10, n // 2, n - 1, n, n + 1}):
        assert binom_sf(k, n, p) == pytest.approx(slow_binom_sf(k, n, p), rel=1e-9, abs=1e-300)
        assert binom_cdf(k, n, p) == pytest.approx(1 - slow_binom_sf(k + 1, n, p), rel=1e-9, abs=1e-12)


def test_binomial_tail_equals_scipy_for_a_long_window() -> None:
    stats = pytest.importorskip("scipy.stats")
    for k in (0, 20, 40, 60, 100):
        assert binom_sf(k, 2000, 0.01) == pytest.approx(stats.binom.sf(k - 1, 2000, 0.01), rel=1e-7, abs=1e-300)


def float_binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) summed term by term in floats (fine to ~1e-12 for these sizes)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(max(k, 0), n + 1))


def test_binomial_band_is_the_narrowest_by_the_stated_rule() -> None:
    slow_binom_sf = float_binom_sf
    for n, p, alpha in [(200, 0.01, 0.01), (50, 0.1, 0.05), (500, 0.02, 0.001)]:
        lo, hi = binomial_band(n, p, alpha)
        klo, khi = round(lo * n), round(hi * n)
        # the largest lo with P(X < lo) <= alpha/2, the smallest hi with P(X > hi) <= alpha/2
        assert slow_binom_sf(0, n, p) - slow_binom_sf(klo, n, p) <= alpha / 2
        assert slow_binom_sf(0, n, p) - slow_binom_sf(klo + 1, n, p) > alpha / 2 or klo == n
        assert slow_binom_sf(khi + 1, n, p) <= alpha / 2
        assert khi == 0 or slow_binom_sf(khi, n, p) > alpha / 2
        assert lo <= p <= hi


def test_quantiles_are_numpys_linear() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100):
        x = rng.normal(size=n)
        assert quantiles(list(x), (0.0, 0.1, 0.5, 0.9, 0.99, 1.0)) == pytest.approx(
            list(np.quantile(x, [0.0, 0.1, 0.5, 0.9, 0.99, 1.0]))
        )
    assert quantiles([], (0.5,)) == [None]


def slow_ks(a: list[float], b: list[float]) -> float:
    """sup over every real x (each sample value, and between them) of |F_a(x) - F_b(x)|, by counting."""
    d = 0.0
    for x in itertools.chain(a, b):
        fa = sum(v <= x for v in a) / len(a)
        fb = sum(v <= x for v in b) / len(b)
        d = max(d, abs(fa - fb))
    return d


def test_ks_distance_equals_counting_and_scipy() -> None:
    rng = random.Random(1)
    for _ in range(20):
        a = [round(rng.gauss(0, 1), 1) for _ in range(rng.randint(1, 40))]  # ties on purpose
        b = [round(rng.gauss(0.3, 1), 1) for _ in range(rng.randint(1, 40))]
        assert ks_distance(a, b) == pytest.approx(slow_ks(a, b))
    stats = pytest.importorskip("scipy.stats")
    a = [rng.gauss(0, 1) for _ in range(300)]
    b = [rng.gauss(0.2, 1) for _ in range(500)]
    ref = stats.ks_2samp(a, b, method="asymp")
    assert ks_distance(a, b) == pytest.approx(ref.statistic)
    # Stephens' corrected series vs scipy's asymptotic: the same order, a few % apart at these sizes
    assert ks_pvalue(ref.statistic, 300, 500) == pytest.approx(ref.pvalue, rel=0.15)
    assert ks_pvalue(0.0, 10, 10) == 1.0
    assert ks_pvalue(0.5, 0, 10) == 1.0


def test_states_tell_defects_from_drift() -> None:
    rng = random.Random(2)
    ref = [rng.gauss(1.0, 0.1) for _ in range(500)]
    threshold = 1.25
    common = {"expected_rate": 0.01, "reference": ref, "alpha": 1e-4, "tolerance": 2.0, "min_shift": 0.2}
    # a stable line: good parts like the reference, flagged at about the calibrated rate
    good = [rng.gauss(1.0, 0.1) for _ in range(2000)]
    stable = window_stats(good, [s > threshold for s in good], min_parts=50, **common)
    assert stable.state == "ok"
    # real defects: 10 % far above the threshold, the passed parts unchanged
    batch = good[:1800] + [2.0] * 200
    defects = window_stats(batch, [s > threshold for s in batch], min_parts=50, **common)
    assert defects.state == "defects" and defects.flagged_share > 0.09
    # drift: every score up by 0.1 (a lamp, a camera): passed parts shifted
    shifted = [s + 0.1 for s in good]
    drift = window_stats(shifted, [s > threshold for s in shifted], min_parts=50, **common)
    assert drift.state == "drift" and drift.shift >= 0.2
    # too few parts: ok, whatever they look like
    assert window_stats(shifted[:10], [True] * 10, min_parts=50, **common).state == "ok"


def test_drift_state_rule_table() -> None:
    kw = {"alpha": 0.01, "min_shift": 0.2, "min_parts": 10}
    assert drift_state(parts=5, flag_p=0.0, shift=1.0, shift_p=0.0, **kw) == "ok"
    assert drift_state(parts=50, flag_p=0.5, shift=0.5, shift_p=0.001, **kw) == "drift"
    assert drift_state(parts=50, flag_p=0.001, shift=0.5, shift_p=0.001, **kw) == "drift"
    assert drift_state(parts=50, flag_p=0.001, shift=0.1, shift_p=0.001, **kw) == "defects"  # shift too small
    assert drift_state(parts=50, flag_p=0.001, shift=0.5, shift_p=0.5, **kw) == "defects"
    assert drift_state(parts=50, flag_p=0.5, shift=0.1, shift_p=0.5, **kw) == "ok"
    assert set(STATES) == {"ok", "defects", "drift"}


def test_review_band_verdicts() -> None:
    cal = Calibration(tuple(float(x) for x in np.linspace(0.0, 1.0, 201)))
    main = cal.operating_point("far", false_alarm_rate=0.01).threshold
    review = review_threshold(cal, 0.1)
    assert review is not None and review < main
    assert review == cal.operating_point("far", false_alarm_rate=0.1).threshold
    assert verdict(main + 1e-6, main, review) == "reject"
    assert verdict(main, main, review) == "review"  # is_anomaly is score > threshold: equal is not
    assert verdict((main + review) / 2, main, review) == "review"
    assert verdict(review, main, review) == "ok"
    assert verdict(main + 1, main, None) == "reject" and verdict(0.5, main, None) == "ok"
    assert verdict(0.99, float("inf"), None) == "ok"
    assert review_threshold(None, 0.1) is None and review_threshold(cal, None) is None


def test_review_band_setting_is_stored_only_when_set() -> None:
    from hetmm_ray.config import ConfigError, DetectorConfig, stored_config

    plain = DetectorConfig().stored_dict()
    assert "review_false_alarm_rate" not in plain["threshold"]  # manifests without a band: as before
    banded = DetectorConfig.from_dict({"threshold": {"review_false_alarm_rate": 0.05}})
    stored = banded.stored_dict()
    assert stored["threshold"]["review_false_alarm_rate"] == 0.05
    assert stored_config(stored).threshold.review_false_alarm_rate == 0.05
    assert stored_config(plain).threshold.review_false_alarm_rate is None
    with pytest.raises(ConfigError, match=r"threshold\.review_false_alarm_rate"):
        DetectorConfig.from_dict({"threshold": {"review_false_alarm_rate": 0.9}})

"""Drift statistics of a line: pure functions over one window of inspected parts.

Exact semantics (each function below states its own):

- A *window* is the last ``n`` parts scored by one template version (a window of parts) or the
  parts of the last ``s`` seconds (a window of time); ``flagged`` counts the parts judged
  anomalous (``is_anomaly``), the *passed* parts are the others.
- **Flagged share test.** Under a calibrated line each good part is flagged with probability
  ``p0`` = the operating point's estimated false-alarm rate. The test asks whether the flagged
  count ``k`` of ``n`` parts is too high for a rate of ``tolerance * p0``: its p-value is the
  exact binomial upper tail ``P(X >= k)``, ``X ~ Binomial(n, min(1, tolerance * p0))``
  (:func:`binom_sf`). ``tolerance`` (>= 1) absorbs the known optimism of out-of-fold rates (a
  fold scores against fewer templates than a live part sees), so a stable line does not alarm.
- **Score shift test.** The passed parts' scores against the out-of-fold scores of the version's
  good images that pass the same threshold (the reference): the two-sample Kolmogorov-Smirnov
  distance ``D = sup_x |F_window(x) - F_ref(x)|`` (:func:`ks_distance`) and its asymptotic
  p-value (:func:`ks_pvalue`, Kolmogorov's series with Stephens' small-sample correction).
  Comparing *passed* parts only is what tells the two causes apart: a bad batch of real
  defects raises the flagged share and leaves the passed parts' scores where calibration put
  them; a drifting line (a lamp, a bumped camera, another material) moves every part's score,
  the passed ones included.
- **State** (:func:`drift_state`), one of :data:`STATES` (the gauge's value is its index):

  * ``ok`` (0): neither test fires, or fewer than ``min_parts`` parts in the window;
  * ``defects`` (1): the flagged share is too high (``flag_p < alpha``) and the passed scores
    have not shifted: real defects at the line, the threshold still calibrated;
  * ``drift`` (2): the passed scores shifted (``shift_p < alpha`` and ``D >= min_shift``),
    whatever the flagged share: the threshold no longer means its rate; recalibrate or look at
    the camera. ``min_shift`` is an effect size: with thousands of parts KS finds shifts too
    small to matter.

- Quantiles are linear interpolation between order statistics (numpy's default, Hyndman-Fan
  type 7): ``q`` of sorted ``x[0..n-1]`` is ``x[f] + (x[f+1]-x[f]) * (h-f)`` with ``h = q (n-1)``,
  ``f = floor(h)``.
- :func:`binomial_band`: the expected band of the flagged share for ``n`` parts at rate ``p``:
  the largest ``lo`` with ``P(X < lo) <= alpha/2`` and the smallest ``hi`` with ``P(X > hi) <= alpha/2``,
  divided by ``n`` (the console draws it around the expected rate).

Pure Python over floats (no torch, numpy optional for speed nowhere): windows hold at most a few
thousand parts and these run on a background thread, never on the predict path.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "QUANTILES",
    "STATES",
    "WindowStats",
    "binom_cdf",
    "binom_sf",
    "binomial_band",
    "drift_state",
    "ks_distance",
    "ks_pvalue",
    "quantiles",
    "window_stats",
]

STATES = ("ok", "defects", "drift")
QUANTILES = (0.5, 0.9, 0.99)  # the score quantiles exported and compared


def _log_pmf(i: int, n: int, p: float) -> float:
    if p <= 0.0:
        return 0.0 if i == 0 else -math.inf
    if p >= 1.0:
        return 0.0 if i == n else -math.inf
    return math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p) + (n - i) * math.log1p(-p)


def _sum_exp(logs: list[float]) -> float:
    top = max(logs, default=-math.inf)
    if top == -math.inf:
        return 0.0
    return min(1.0, math.exp(top) * sum(math.exp(v - top) for v in logs))


def binom_sf(k: int, n: int, p: float) -> float:
    """``P(X >= k)`` for ``X ~ Binomial(n, p)``, exact (a log-space sum of the pmf); 1 for k <= 0."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return _sum_exp([_log_pmf(i, n, p) for i in range(k, n + 1)])


def binom_cdf(k: int, n: int, p: float) -> float:
    """``P(X <= k)`` for ``X ~ Binomial(n, p)``, exact; 0 for k < 0, 1 for k >= n."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return _sum_exp([_log_pmf(i, n, p) for i in range(0, k + 1)])


def binomial_band(n: int, p: float, alpha: float) -> tuple[float, float]:
    """The expected band ``(lo, hi)`` of the flagged *share* of ``n`` parts at rate ``p``: see the
    module docstring. ``(0, 1)`` for ``n == 0``."""
    if n <= 0:
        return 0.0, 1.0
    pmf = [math.exp(_log_pmf(i, n, p)) for i in range(n + 1)]  # one pass: O(n), not a tail per candidate
    lo, below = 0, pmf[0]
    while lo < n and below <= alpha / 2:  # P(X <= lo) small: lo + 1 is still in the band
        lo += 1
        below += pmf[lo]
    hi, above = n, pmf[n]
    while hi > 0 and above <= alpha / 2:  # P(X >= hi) small: hi - 1 is still in the band
        hi -= 1
        above += pmf[hi]
    return lo / n, hi / n


def quantiles(values: Sequence[float], qs: Sequence[float] = QUANTILES) -> list[float | None]:
    """Type-7 quantiles of ``values`` (module docstring); None for each when ``values`` is empty."""
    x = sorted(float(v) for v in values)
    if not x:
        return [None for _ in qs]
    out: list[float | None] = []
    for q in qs:
        h = q * (len(x) - 1)
        f = math.floor(h)
        c = min(f + 1, len(x) - 1)
        out.append(x[f] + (x[c] - x[f]) * (h - f))
    return out


def ks_distance(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sample KS distance ``sup |F_a - F_b|`` over the pooled values (right-continuous ECDFs);
    0 when either sample is empty."""
    if not a or not b:
        return 0.0
    xa, xb = sorted(a), sorted(b)
    d = 0.0
    for v in sorted(set(xa) | set(xb)):
        fa = bisect.bisect_right(xa, v) / len(xa)
        fb = bisect.bisect_right(xb, v) / len(xb)
        d = max(d, abs(fa - fb))
    return d


def ks_pvalue(d: float, n: int, m: int) -> float:
    """Asymptotic p-value of a two-sample KS distance ``d`` of samples of sizes ``n`` and ``m``:
    ``Q(lambda) = 2 sum_{j>=1} (-1)^(j-1) exp(-2 j^2 lambda^2)`` with
    ``lambda = (sqrt(ne) + 0.12 + 0.11 / sqrt(ne)) d``, ``ne = n m / (n + m)`` (Stephens 1970, as in
    Numerical Recipes ``probks``); 1 when a sample is empty or ``d <= 0``."""
    if n <= 0 or m <= 0 or d <= 0:
        return 1.0
    ne = n * m / (n + m)
    lam = (math.sqrt(ne) + 0.12 + 0.11 / math.sqrt(ne)) * d
    if lam < 0.2:  # the series converges slowly there; Q is 1 to many digits
        return 1.0
    total, sign = 0.0, 1.0
    for j in range(1, 101):
        term = sign * math.exp(-2.0 * j * j * lam * lam)
        total += term
        if abs(term) < 1e-12:
            break
        sign = -sign
    return min(1.0, max(0.0, 2.0 * total))


@dataclass(frozen=True)
class WindowStats:
    """One window's statistics (module docstring); ``state`` is one of :data:`STATES`."""

    parts: int
    flagged: int
    flagged_share: float | None
    expected_rate: float
    flag_p: float
    score_quantiles: tuple[float | None, ...]  # of the passed parts, at QUANTILES
    shift: float  # KS distance of the passed scores to the reference
    shift_p: float
    state: str


def drift_state(
    *, parts: int, flag_p: float, shift: float, shift_p: float, alpha: float, min_shift: float, min_parts: int
) -> str:
    """``ok`` | ``defects`` | ``drift`` by the rule of the module docstring."""
    if parts < min_parts:
        return "ok"
    if shift_p < alpha and shift >= min_shift:
        return "drift"
    if flag_p < alpha:
        return "defects"
    return "ok"


def window_stats(
    scores: Sequence[float],
    flagged: Sequence[bool],
    *,
    expected_rate: float,
    reference: Sequence[float],
    alpha: float,
    tolerance: float,
    min_shift: float,
    min_parts: int,
) -> WindowStats:
    """The statistics and state of one window: ``scores`` and ``flagged`` per part (same order),
    ``reference`` the out-of-fold scores of good images that pass the threshold."""
    n = len(scores)
    k = sum(1 for f in flagged if f)
    passed = [float(s) for s, f in zip(scores, flagged, strict=True) if not f]
    flag_p = binom_sf(k, n, min(1.0, tolerance * expected_rate)) if n else 1.0
    shift = ks_distance(passed, reference)
    shift_p = ks_pvalue(shift, len(passed), len(reference))
    state = drift_state(
        parts=n, flag_p=flag_p, shift=shift, shift_p=shift_p, alpha=alpha, min_shift=min_shift, min_parts=min_parts
    )
    return WindowStats(
        parts=n,
        flagged=k,
        flagged_share=k / n if n else None,
        expected_rate=expected_rate,
        flag_p=flag_p,
        score_quantiles=tuple(quantiles(passed)),
        shift=shift,
        shift_p=shift_p,
        state=state,
    )

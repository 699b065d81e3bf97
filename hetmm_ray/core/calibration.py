"""Out-of-fold plans and the false-alarm threshold rule (pure math: no I/O, no Ray).

Out-of-fold (OOF) scores
    ``fold_plan(n, folds, max_images, seed)`` draws ``min(n, max_images)`` of the
    ``n`` training images (seeded permutation) and deals them into ``folds``
    folds (``chosen[f::folds]``). Each fold is scored against templates built
    from every training image *not* in that fold (the kept images include the
    ones beyond the cap), so every scored image is a part its templates have
    never seen, exactly like a new part on the line. :class:`OutOfFold` holds
    the result: the training-image index and score of every scored image.

The ``far`` rule (default): estimated false-alarm rate -> threshold
    :class:`TailModel` turns the OOF scores ``x`` (n of them) into a threshold
    ``t(a)`` such that the estimated share of good parts scoring above ``t`` is
    ``a``. Two regimes, chosen by how many OOF scores lie beyond the quantile:

    * **empirical (conformal)** when the rank ``k = ceil((n + 1) * (1 - a))``
      leaves at least ``TAIL_POINTS - 1`` scores above it (``k <= n - 2``):
      ``t = x_(k)``, the k-th smallest score. Distribution-free: for an
      exchangeable new good part ``P(score > t) <= a`` and ``>= a - 1/(n+1)``,
      and up to two unusual training images cannot move it past a normal one.
      For ``a = 1 %`` this needs n >= 299; for 5 %, n >= 59.
    * **robust parametric tail** below that: a log-normal fitted to the
      upper half of the log scores, ``mu = median(log x)``,
      ``s = median(log x - mu | log x > mu) / 0.6745`` (the upper semi-MAD, so
      a right-skewed score distribution widens the tail, and a few outliers
      cannot move either number), ``t = max(x_(n-2), exp(mu + z_{1-a} * s))``.
      The ``x_(n-2)`` floor keeps ``t`` monotone across the two regimes and
      never below where the data themselves put the tail.

    Why these (``benchmarks/bench_threshold.py estimators``, seeded, 400 draws per cell, true
    false-alarm rate from the family's own survival function): the empirical
    rank is unbiased for every family once it exists (n = 300, a = 1 %: medians
    0.85-0.91 %, 10-90 % band about 0.4-1.8 %), while every parametric family
    is off on some tail shape at large n (normal-on-log with the plain MAD: 3.3 %
    on Gumbel, 0.01 % on Weibull(2)). At n = 20-100 no rank exists at 1 % and
    the upper semi-MAD log-normal has the smallest worst case over normal,
    log-normal, Gumbel, gamma, Weibull and Student-t tails (medians 0.07-3 %
    at a = 1 %; it errs towards fewer false alarms on light tails).

The estimate reported with a threshold: :meth:`TailModel.estimate` (a :class:`FalseAlarmEstimate`)
    The estimate comes from the regime that sets a threshold there, so the rate printed
    beside a threshold is the one it came from, the floor included. With ``m`` the number
    of the ``n`` OOF scores strictly above ``t``, and ``floor = x_(n-2)``:

    * ``t <= floor`` (every threshold the empirical rank or the floor gives):
      ``rate = (m + 1) / (n + 1)``, the conformal rate: for an exchangeable new good
      part and ``t`` the ``(n - m)``-th smallest score, ``P(score > t)`` is exactly that
      (the far rule's ``x_(k)`` reports ``(n + 1 - k) / (n + 1)``, at most the asked rate
      and at least ``1/(n+1)`` below it). When the floor decides a parametric-regime rate,
      this is the floor's own rate, which may exceed the asked one: the data put the
      threshold there, not the tail model.
    * ``t > floor`` (the tail model's own thresholds): ``rate = 1 - Phi((ln t - mu) / s)``,
      at most the rate at the floor (the estimate never rises with the threshold) and
      at least the interval's lower bound below (never fewer false alarms than the scores
      above ``t`` allow), and at least ``MIN_RATE``.

    Its error, stated wherever the estimate is shown: the Clopper-Pearson interval at
    ``ESTIMATE_CONFIDENCE`` of the share of good parts above ``t`` given ``m`` of ``n``,
    ``[B(alpha/2; m, n - m + 1), B(1 - alpha/2; m + 1, n - m)]`` (``B(q; a, b)``: the
    Beta quantile; 0 below at ``m = 0``, 1 above at ``m = n``). It needs no tail shape:
    for a fixed ``t``, ``m`` is binomial; for ``t = x_(k)`` the share above is
    ``Beta(n + 1 - k, k)``, inside the same bounds. Out-of-fold scores come from templates
    without the scored image's fold, so a part scored by the full product sits at or a
    little below them: the interval is of the OOF scores' own tail.

    ``false_alarm_rate(t)`` is ``estimate(t).rate``.

The far rule at a few rates: :func:`rate_choices`
    For each rate: the threshold ``t(a)``, its :meth:`TailModel.estimate` (so the good frames above
    it), and given labelled scores the confirmed defects and labelled good parts above it
    (``score > t``, as every verdict). One function for the fit's output, the labelled
    calibration's record and the console.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from statistics import NormalDist
from typing import Any

import torch

__all__ = [
    "ESTIMATE_CONFIDENCE",
    "MAX_RATE",
    "MIN_RATE",
    "TAIL_POINTS",
    "FalseAlarmEstimate",
    "OutOfFold",
    "RateChoice",
    "TailModel",
    "beta_quantile",
    "clopper_pearson",
    "describe_rate_choices",
    "empirical_min_images",
    "fold_plan",
    "rate_choices",
]

TAIL_POINTS = 3
"""The empirical regime needs the quantile's rank to leave TAIL_POINTS - 1 scores above it."""
MIN_RATE = 1e-6
"""Smallest false-alarm rate estimated (thresholds beyond it report this)."""
MAX_RATE = 0.5
"""Largest false-alarm rate a threshold rule may ask for (beyond it the median is the threshold)."""
ESTIMATE_CONFIDENCE = 0.95
"""Two-sided confidence of the interval stated with every false-alarm estimate."""
_SEMI_MAD_TO_SIGMA = 0.6744897501960817  # median of |Z| for a standard normal Z
_LOG_FLOOR = 1e-6  # scores of 0 (a training image identical to another) have no logarithm


def fold_plan(
    n_images: int, *, folds: int, max_images: int, seed: int, keys: Sequence[str] | None = None
) -> list[list[int]]:
    """Held-out training-image indices per fold (each sorted); see the module docstring.

    ``keys`` (the images' content digests): the draw then depends on the images, not on the
    order they arrived in, so the same good images give the same folds and threshold whether
    they came through the CLI (sorted file names) or an HTTP upload (the client's order).
    Without keys, a seeded permutation of the positions.
    """
    if n_images < 2:
        raise ValueError("threshold calibration needs at least 2 good images")
    if keys is not None:
        if len(keys) != n_images:
            raise ValueError("fold_plan: one key per image")
        order = sorted(range(n_images), key=lambda i: (hashlib.sha256(f"{seed}:{keys[i]}".encode()).digest(), i))
        chosen = order[: min(max_images, n_images)]
    else:
        g = torch.Generator().manual_seed(seed)
        chosen = torch.randperm(n_images, generator=g)[: min(max_images, n_images)].tolist()
    folds = min(folds, len(chosen))
    return [sorted(chosen[f::folds]) for f in range(folds)]


@dataclass(frozen=True)
class OutOfFold:
    """Out-of-fold scores: ``scores[i]`` is training image ``images[i]`` scored without its fold."""

    images: tuple[int, ...]
    scores: tuple[float, ...]
    folds: int
    scoring_seconds: float = 0.0  # ATMM scoring time of all folds (selection excluded): the ladder's ms/img

    def by_image(self) -> dict[int, float]:
        return dict(zip(self.images, self.scores, strict=True))


class TailModel:
    """Threshold <-> estimated false-alarm rate from good-image scores (the ``far`` rule).

    Build once from the OOF scores; :meth:`threshold` and :meth:`false_alarm_rate`
    are inverse to each other (up to the steps of the empirical regime).
    """

    def __init__(self, scores: Sequence[float]) -> None:
        xs = sorted(float(s) for s in scores)
        if not xs or not all(math.isfinite(s) for s in xs):
            raise ValueError("the false-alarm rule needs at least one finite good-image score")
        self.sorted = xs
        self.n = len(xs)
        logs = [math.log(max(s, _LOG_FLOOR)) for s in xs]
        self.mu = _median(logs)
        upper = [v - self.mu for v in logs if v > self.mu]
        self.log_scale = _median(upper) / _SEMI_MAD_TO_SIGMA if upper else 0.0
        # The floor of the parametric regime: the score with TAIL_POINTS - 1 scores above it.
        self.floor = xs[max(0, self.n - TAIL_POINTS)]

    def regime(self, rate: float) -> str:
        return "empirical" if self._rank(rate) <= self.n - (TAIL_POINTS - 1) else "parametric"

    def _rank(self, rate: float) -> int:
        return self.rank(self.n, rate)

    @staticmethod
    def rank(n: int, rate: float) -> int:
        """The conformal rank of the quantile ``1 - rate`` among ``n`` scores (1-based)."""
        return math.ceil((n + 1) * (1.0 - rate) - 1e-9)

    def threshold(self, rate: float) -> float:
        """Score above which an estimated share ``rate`` of good parts falls."""
        check_rate(rate)
        k = self._rank(rate)
        if k <= self.n - (TAIL_POINTS - 1):
            return self.sorted[max(k, 1) - 1]
        z = NormalDist().inv_cdf(1.0 - rate)
        return max(self.floor, math.exp(self.mu + z * self.log_scale))

    def above(self, threshold: float) -> int:
        """How many of the OOF scores lie strictly above ``threshold``."""
        return self.n - bisect.bisect_right(self.sorted, threshold)

    def estimate(self, threshold: float) -> FalseAlarmEstimate:
        """The estimated share of good parts scoring above ``threshold``, from the regime that
        sets a threshold there, and its interval (module docstring)."""
        if math.isnan(threshold):
            raise ValueError("threshold is NaN")
        m = self.above(threshold)
        if threshold <= self.floor:
            return FalseAlarmEstimate((m + 1) / (self.n + 1), m, self.n, "empirical")
        at_floor = (self.above(self.floor) + 1) / (self.n + 1)
        if self.log_scale > 0:
            z = (math.log(max(threshold, _LOG_FLOOR)) - self.mu) / self.log_scale
            tail = NormalDist().cdf(-z)
        else:  # every upper score equal: the model has no tail beyond them
            tail = 0.0
        low = clopper_pearson(m, self.n, ESTIMATE_CONFIDENCE)[0]
        return FalseAlarmEstimate(max(MIN_RATE, low, min(tail, at_floor)), m, self.n, "parametric")

    def false_alarm_rate(self, threshold: float) -> float:
        """Estimated share of good parts scoring above ``threshold``: ``estimate(threshold).rate``."""
        return self.estimate(threshold).rate


@dataclass(frozen=True)
class FalseAlarmEstimate:
    """An estimated false-alarm rate above a threshold and what it rests on (module docstring).

    ``rate``: the point estimate (a fraction); ``above`` of ``n`` out-of-fold good scores lie above
    the threshold; ``regime``: ``empirical`` (read off the scores) or ``parametric`` (the tail
    model, beyond the floor); ``low`` / ``high``: the Clopper-Pearson interval at
    ``ESTIMATE_CONFIDENCE`` from ``above`` of ``n``.
    """

    rate: float
    above: int
    n: int
    regime: str

    @cached_property
    def interval(self) -> tuple[float, float]:
        return clopper_pearson(self.above, self.n, ESTIMATE_CONFIDENCE)

    @property
    def low(self) -> float:
        return self.interval[0]

    @property
    def high(self) -> float:
        return self.interval[1]

    def describe(self) -> str:
        """``1.08% (95% interval 0.22-3.11%; 2 of 278 out-of-fold good scores above)``."""
        lo, hi = self.interval
        model = "" if self.regime == "empirical" else "tail model; "
        return (
            f"{100 * self.rate:.2f}% ({model}{100 * ESTIMATE_CONFIDENCE:g}% interval {100 * lo:.2f}-{100 * hi:.2f}%; "
            f"{self.above} of {self.n} out-of-fold good scores above)"
        )

    def to_json(self) -> dict[str, Any]:
        lo, hi = self.interval
        return {
            "rate": self.rate,
            "low": lo,
            "high": hi,
            "confidence": ESTIMATE_CONFIDENCE,
            "above": self.above,
            "n": self.n,
            "regime": self.regime,
        }


@lru_cache(maxsize=4096)  # pure in its three numbers; every operating point of a product asks the same few
def clopper_pearson(successes: int, trials: int, confidence: float) -> tuple[float, float]:
    """The two-sided Clopper-Pearson interval of a binomial share from ``successes`` of ``trials``."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"clopper_pearson: need 0 <= successes <= trials >= 1, got {successes} of {trials}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"clopper_pearson: confidence must lie in (0, 1), got {confidence!r}")
    alpha = 1.0 - confidence
    lo = 0.0 if successes == 0 else beta_quantile(alpha / 2, successes, trials - successes + 1)
    hi = 1.0 if successes == trials else beta_quantile(1 - alpha / 2, successes + 1, trials - successes)
    return lo, hi


def beta_quantile(q: float, a: float, b: float) -> float:
    """The ``q``-quantile of Beta(a, b) (a, b > 0), by bisection on the regularized incomplete beta."""
    lo, hi = 0.0, 1.0
    for _ in range(80):  # 2^-80: below a float's resolution of [0, 1]
        mid = 0.5 * (lo + hi)
        if _betainc(a, b, mid) < q:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta ``I_x(a, b)`` by its continued fraction (modified Lentz),
    on whichever side of the mean it converges fast."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def empirical_min_images(rate: float) -> int:
    """Fewest out-of-fold scores for which :class:`TailModel` reads the threshold at ``rate`` off the
    scores themselves (the empirical regime): ``k = ceil((n + 1)(1 - rate)) <= n - (TAIL_POINTS - 1)``,
    that is ``n >= TAIL_POINTS / rate - 1`` (299 at 1 %, 59 at 5 %)."""
    n = max(TAIL_POINTS, math.ceil(TAIL_POINTS / check_rate(rate) - 1 - 1e-9))
    while TailModel.rank(n, rate) > n - (TAIL_POINTS - 1):  # float rounding of the bound
        n += 1
    return n


def check_rate(rate: float) -> float:
    """``rate`` if it is a finite false-alarm rate in (0, MAX_RATE], else ValueError."""
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate):
        raise ValueError(f"false-alarm rate must be a finite number, got {rate!r}")
    if not 0.0 < rate <= MAX_RATE:
        raise ValueError(f"false-alarm rate must be in (0, {MAX_RATE}], got {rate!r}")
    return float(rate)


def _median(values: Sequence[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


# --- labelled validation (``hetmm calibrate --val``, ``hetmm evaluate``'s operating point) ---------
OBJECTIVES = ("f1", "recall")
"""``f1``: the threshold of best F1; ``recall``: best recall with at most a given share of good images flagged."""


@dataclass(frozen=True)
class LabelledCut:
    """One verdict threshold on labelled scores (``is_anomaly = score > threshold``) and its counts."""

    threshold: float
    true_positives: int
    false_positives: int
    false_negatives: int
    true_negatives: int

    @property
    def recall(self) -> float:
        pos = self.true_positives + self.false_negatives
        return self.true_positives / pos if pos else 0.0

    @property
    def false_alarm_rate(self) -> float:
        neg = self.false_positives + self.true_negatives
        return self.false_positives / neg if neg else 0.0

    @property
    def f1(self) -> float:
        denom = 2 * self.true_positives + self.false_positives + self.false_negatives
        return 2 * self.true_positives / denom if denom else 0.0

    def to_json(self) -> dict[str, float | int]:
        return {
            "threshold": self.threshold,
            "recall": self.recall,
            "false_alarm_rate": self.false_alarm_rate,
            "f1": self.f1,
            "true_positives": self.true_positives,
            "false_positives": self.false_positives,
            "false_negatives": self.false_negatives,
            "true_negatives": self.true_negatives,
        }


def labelled_cuts(scores: Sequence[float], labels: Sequence[int]) -> list[LabelledCut]:
    """Every distinct verdict on labelled scores (1 = defective), from flagging none to flagging all.

    Thresholds sit halfway between consecutive distinct scores (the flag-none cut at the
    highest score, the flag-all cut just below the lowest), so a cut keeps its verdicts
    under small score noise.
    """
    if len(scores) != len(labels) or not scores:
        raise ValueError("labelled validation needs as many labels as scores, and at least one")
    pairs = sorted(zip((float(s) for s in scores), (int(v) for v in labels), strict=True), reverse=True)
    pos = sum(v for _, v in pairs)
    neg = len(pairs) - pos
    distinct = sorted({s for s, _ in pairs}, reverse=True)
    cuts = [LabelledCut(distinct[0], 0, 0, pos, neg)]
    tp = fp = i = 0
    for j, u in enumerate(distinct):
        while i < len(pairs) and pairs[i][0] >= u:
            tp += pairs[i][1]
            fp += 1 - pairs[i][1]
            i += 1
        below = distinct[j + 1] if j + 1 < len(distinct) else u - max(abs(u), 1.0) * 1e-6
        cuts.append(LabelledCut(0.5 * (u + below), tp, fp, pos - tp, neg - fp))
    return cuts


def best_f1_cut(cuts: Sequence[LabelledCut]) -> LabelledCut:
    """The cut of highest F1 (ties: the higher threshold, i.e. fewer false alarms)."""
    return max(cuts, key=lambda c: (c.f1, c.threshold))


def recall_cut(cuts: Sequence[LabelledCut], max_false_alarm_rate: float) -> LabelledCut:
    """The cut of highest recall flagging at most ``max_false_alarm_rate`` of the good images
    (ties: the higher threshold). The flag-none cut always qualifies."""
    ok = [c for c in cuts if c.false_alarm_rate <= max_false_alarm_rate + 1e-12]
    return max(ok, key=lambda c: (c.recall, c.threshold))


# --- the rate chosen with the facts in view (fit / update / calibrate output, the console) ----------
@dataclass(frozen=True)
class RateChoice:
    """The far rule's threshold at one false-alarm ``rate`` and what it costs.

    ``estimate``: :meth:`TailModel.estimate` of the threshold (``estimate.above`` of ``estimate.n``
    out-of-fold good scores lie above it). With labelled scores: ``defective_flagged`` of
    ``defective`` confirmed defects and ``good_flagged`` of ``good`` labelled good parts score above
    the threshold (``is_anomaly = score > threshold``, as every verdict)."""

    rate: float
    threshold: float
    estimate: FalseAlarmEstimate
    defective: int = 0
    defective_flagged: int = 0
    good: int = 0
    good_flagged: int = 0

    @property
    def recall(self) -> float | None:
        """Share of the labelled defects flagged; None without any."""
        return self.defective_flagged / self.defective if self.defective else None

    def to_json(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "threshold": self.threshold,
            "good_above": self.estimate.above,
            "n_good": self.estimate.n,
            "estimate": self.estimate.to_json(),
            "recall": self.recall,
            "defective": self.defective,
            "defective_flagged": self.defective_flagged,
            "labelled_good": self.good,
            "labelled_good_flagged": self.good_flagged,
        }


def rate_choices(
    scores: Sequence[float],
    rates: Sequence[float],
    *,
    defective_scores: Sequence[float] = (),
    good_scores: Sequence[float] = (),
) -> list[RateChoice]:
    """The far rule at each of ``rates`` on the out-of-fold good ``scores`` (:class:`RateChoice`), and,
    given labelled scores, how many confirmed defects and labelled good parts each flags."""
    tail = TailModel(scores)
    bad = [float(s) for s in defective_scores]
    good = [float(s) for s in good_scores]
    out = []
    for rate in rates:
        t = tail.threshold(rate)
        out.append(
            RateChoice(
                rate=float(rate),
                threshold=t,
                estimate=tail.estimate(t),
                defective=len(bad),
                defective_flagged=sum(s > t for s in bad),
                good=len(good),
                good_flagged=sum(s > t for s in good),
            )
        )
    return out


def describe_rate_choices(rows: Sequence[dict[str, Any]]) -> str:
    """The table ``hetmm fit``, ``update`` and ``calibrate`` print, from :meth:`RateChoice.to_json` rows:
    per rate the threshold, the good scores above it, the estimate with its interval, and the
    recall where defects are labelled."""
    labelled = any(r["defective"] for r in rows)
    conf = f"{100 * ESTIMATE_CONFIDENCE:g}%"
    head = f"{'far rate':>8}  {'threshold':>9}  {'good above':>10}  estimated false alarms ({conf} interval)"
    lines = [head + ("" if not labelled else "  recall on labelled defects")]
    for r in rows:
        e = r["estimate"]
        above = f"{e['above']} of {e['n']}"
        row = (
            f"{100 * r['rate']:>7g}%  {r['threshold']:>9.4f}  {above:>10}  "
            f"{100 * e['rate']:.2f}% ({100 * e['low']:.2f}-{100 * e['high']:.2f}%)"
        )
        if labelled:
            row = f"{row:<74}  {100 * (r['recall'] or 0.0):.1f}% ({r['defective_flagged']} of {r['defective']})"
        lines.append(row)
    return "\n".join(lines)

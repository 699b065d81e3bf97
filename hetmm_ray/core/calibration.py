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

    ``false_alarm_rate(t)`` inverts ``t(a)`` by bisection on ``log a``, so the
    rate reported with a threshold is the one that would have produced it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import torch

__all__ = [
    "MAX_RATE",
    "MIN_RATE",
    "TAIL_POINTS",
    "OutOfFold",
    "TailModel",
    "empirical_min_images",
    "fold_plan",
]

TAIL_POINTS = 3
"""The empirical regime needs the quantile's rank to leave TAIL_POINTS - 1 scores above it."""
MIN_RATE = 1e-6
"""Smallest false-alarm rate estimated (thresholds beyond it report this)."""
MAX_RATE = 0.5
"""Largest false-alarm rate a threshold rule may ask for (beyond it the median is the threshold)."""
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

    def false_alarm_rate(self, threshold: float) -> float:
        """Estimated share of good parts scoring above ``threshold`` (in [MIN_RATE, MAX_RATE])."""
        if math.isnan(threshold):
            raise ValueError("threshold is NaN")
        if self.threshold(MIN_RATE) <= threshold:
            return MIN_RATE
        if self.threshold(MAX_RATE) > threshold:
            return MAX_RATE
        lo, hi = math.log(MIN_RATE), math.log(MAX_RATE)  # threshold(e^lo) > t >= threshold(e^hi)
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if self.threshold(math.exp(mid)) > threshold:
                lo = mid
            else:
                hi = mid
        return math.exp(hi)


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

"""Good frames whose out-of-fold score stands apart, and how much of the threshold rests on them
(pure math: no I/O, no Ray).

The rule (stated with every report)
    With ``x`` the out-of-fold (OOF) scores of a product's good frames, ``med = median(x)`` and
    ``spread = 1.4826 * median(|x - med|)`` (the MAD scaled to a normal's standard deviation), a
    frame stands apart when its score exceeds ``cut = med + mads * spread``; ``mads`` is
    ``config.OUTLIER_MADS`` unless a caller gives another. Neither number moves with a few
    outliers, so a handful of marked frames cannot hide one another. A spread of 0 (half the
    scores equal) names nothing: there is no scale to stand apart on.

Which frame a score belongs to
    A template set's OOF scores are stored in the order its fold plan scored them
    (:func:`~hetmm_ray.core.calibration.fold_plan` with the set's ``threshold.folds``,
    ``max_images`` and ``seed`` and its image digests as keys: fold 0's frames in bank order, then
    fold 1's, ...). :func:`calibration_order` rebuilds that order, so score ``i`` is bank frame
    ``calibration_order(...)[i]``. Frames beyond ``max_images`` have no OOF score and are never named.

How much of the threshold rests on them
    :func:`outlier_report` gives the threshold of the product's own rule on every OOF score and on
    the scores without the frames standing apart (the rule's other settings unchanged): what
    dropping them would do to the threshold before any refit (a refit without them also re-selects
    the templates, so its threshold can differ a little). Nothing here drops anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..config import DetectorConfig
from .calibration import _median, fold_plan
from .scoring import Calibration, operating_point

__all__ = ["MAD_TO_SIGMA", "OutlierReport", "StandingApart", "calibration_order", "outlier_report", "standing_apart"]

MAD_TO_SIGMA = 1.4826
"""1 / Phi^-1(3/4): the MAD of a normal sample times this estimates its standard deviation."""


@dataclass(frozen=True)
class StandingApart:
    """One good frame standing apart: its bank position, content digest and OOF score."""

    index: int
    digest: str
    score: float

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "digest": self.digest, "score": self.score}


@dataclass(frozen=True)
class OutlierReport:
    """The rule's numbers, the frames standing apart (highest score first), and the threshold of the
    product's rule with every OOF score and without those frames (equal when none stands apart)."""

    mads: float
    median: float
    spread: float
    cut: float | None  # None: a spread of 0, nothing can stand apart
    frames: tuple[StandingApart, ...]
    n_scores: int
    rule: str
    threshold: float
    threshold_without: float

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": f"out-of-fold score > median + {self.mads:g} x 1.4826 x MAD",
            "mads": self.mads,
            "median": self.median,
            "spread": self.spread,
            "cut": self.cut,
            "frames": [f.to_json() for f in self.frames],
            "n_scores": self.n_scores,
            "threshold_rule": self.rule,
            "threshold": self.threshold,
            "threshold_without": self.threshold_without,
        }

    def describe(self, names: dict[str, str] | None = None) -> str:
        """What ``hetmm fit``, ``update`` and ``drop`` print: the rule, each frame by name (else its
        digest's first 12 hex digits) and score, and the threshold with and without them."""
        names = names or {}
        if self.cut is None:
            return f"good frames standing apart: none (the {self.n_scores} out-of-fold scores have no spread)"
        rule = (
            f"out-of-fold score > {self.cut:.4f} = median {self.median:.4f} + {self.mads:g} x {self.spread:.4f} "
            f"(1.4826 x MAD)"
        )
        if not self.frames:
            return f"good frames standing apart: none of {self.n_scores} ({rule})"
        lines = [f"good frames standing apart: {len(self.frames)} of {self.n_scores} ({rule}):"]
        lines += [f"  {names.get(f.digest, f.digest[:12])}  {f.score:.4f}" for f in self.frames]
        lines.append(
            f"threshold ({self.rule}) {self.threshold:.4f} with them, {self.threshold_without:.4f} without them; "
            "to drop them from the bank and the calibration as a new version: hetmm drop --product P NAME..."
        )
        return "\n".join(lines)


def calibration_order(n_images: int, config: DetectorConfig, digests: Sequence[str]) -> list[int]:
    """The bank positions of a template set's OOF scores, in their stored order (module docstring)."""
    th = config.threshold
    plan = fold_plan(n_images, folds=th.folds, max_images=th.max_images, seed=th.seed, keys=digests)
    return [i for held in plan for i in held]


def standing_apart(scores: Sequence[float], *, mads: float) -> tuple[float, float, float | None, list[int]]:
    """``(median, spread, cut, positions)``: the positions in ``scores`` above the cut (module
    docstring), highest score first; ``cut`` None (and no position) for a spread of 0."""
    if not scores:
        raise ValueError("standing_apart needs at least one score")
    if not mads > 0:
        raise ValueError(f"mads must be > 0, got {mads!r}")
    xs = [float(s) for s in scores]
    med = _median(xs)
    spread = MAD_TO_SIGMA * _median([abs(s - med) for s in xs])
    if spread <= 0:
        return med, spread, None, []
    cut = med + mads * spread
    above = sorted((i for i, s in enumerate(xs) if s > cut), key=lambda i: (-xs[i], i))
    return med, spread, cut, above


def outlier_report(
    calibration: Calibration, config: DetectorConfig, digests: Sequence[str], *, mads: float
) -> OutlierReport:
    """The frames of a template set (``digests``: its bank's, in bank order) whose OOF score stands
    apart, and its rule's threshold with and without them (module docstring)."""
    scores = list(calibration.scores)
    order = calibration_order(len(digests), config, digests)
    if len(order) != len(scores):
        raise ValueError(
            f"the calibration holds {len(scores)} out-of-fold scores, the fold plan of {len(digests)} frames "
            f"{len(order)}: it was not computed from this bank"
        )
    med, spread, cut, positions = standing_apart(scores, mads=mads)
    frames = tuple(StandingApart(order[p], digests[order[p]], scores[p]) for p in positions)
    op = operating_point(calibration, config)
    assert op is not None  # a calibration is given
    threshold_without = op.threshold
    dropped = set(positions)
    kept = [s for i, s in enumerate(scores) if i not in dropped]
    if dropped and kept:
        without = operating_point(Calibration(tuple(kept), validation=calibration.validation), config)
        assert without is not None
        threshold_without = without.threshold
    return OutlierReport(mads, med, spread, cut, frames, len(scores), op.rule, op.threshold, threshold_without)

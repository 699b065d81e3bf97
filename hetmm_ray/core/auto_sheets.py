"""``templates.sheets: auto``: the smallest template size K whose verdicts match ALL's.

A compressed selection (PTS, or an ablation baseline) of K sheets scores a part against
fewer templates than ALL (every good image), so it is faster and its scores are higher
(a max over fewer candidates). How many sheets a product needs depends on how varied its
good parts are: 60 is plenty for a uniform bottle and far too few for a product of varied
tiles. So K is measured per product, on its own good images:

1. ALL's out-of-fold scores ``a`` of the good images (each scored as a new part would be,
   never against its own templates) and ALL's verdict threshold on them.
2. For K on the ladder :data:`LADDER` (below N; N itself is ALL), the selection's
   out-of-fold scores ``s`` of the same images and its own threshold on them.
3. K *agrees* with ALL when all three hold (``templates.auto_*`` settings):

   - rank agreement: Spearman correlation of ``s`` and ``a`` >= ``auto_min_rank_corr``
     (the selection orders good parts as ALL does);
   - score agreement: ``max_i |s_i - a_i| / median(a)`` <= ``auto_max_rel_diff`` (no image's
     score moves by more than that share of a typical good score; the median, not ``a_i``,
     so that an image scoring ~0 against a duplicate of itself does not divide by ~0);
   - verdict agreement: the share of images whose verdict (score above the threshold
     calibrated from the same scores) is the same under K as under ALL >=
     ``auto_min_verdict_agreement``.

4. The choice is the smallest agreeing K. With ``auto_max_ms_per_image`` the walk stops at
   the first K slower than the budget and takes the largest K within it, agreeing or not
   (the report says so). If no K below N agrees, K = N: ALL itself.

The walk stops at the first agreeing K, so it costs one selection and one out-of-fold
scoring per rung tried. PTS's selection at K is not a prefix of its selection at a larger
K (OPTICS's ``min_samples = max(2, N // K)`` changes with K, so the easy normals differ),
so each rung runs its own selection.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

__all__ = ["LADDER", "Rung", "agreement", "choose_sheets", "ladder", "spearman"]

LADDER = (10, 20, 40, 60, 100, 150, 200, 300, 400, 600, 800, 1000, 1500, 2000)


def ladder(n_images: int) -> list[int]:
    """The rungs below ``n_images`` (ALL needs no selection)."""
    return [k for k in LADDER if k < n_images]


def _ranks(x: Sequence[float]) -> torch.Tensor:
    """Average ranks (ties share the mean of their positions), float64."""
    v = torch.tensor(list(x), dtype=torch.float64)
    order = torch.argsort(v, stable=True)
    ranks = torch.empty_like(v)
    ranks[order] = torch.arange(len(v), dtype=torch.float64)
    for value in torch.unique(v):
        tied = v == value
        if int(tied.sum()) > 1:
            ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (Pearson on average ranks); 1.0 when either side is constant."""
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = math.sqrt(float((ra * ra).sum()) * float((rb * rb).sum()))
    return 1.0 if denom == 0 else float((ra * rb).sum()) / denom


@dataclass(frozen=True)
class Rung:
    """One K on the ladder and how far it is from ALL."""

    sheets: int
    rank_corr: float
    max_rel_diff: float
    verdict_agreement: float
    ms_per_image: float
    agrees: bool

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 5) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def agreement(
    sheets: int,
    scores: Sequence[float],
    threshold: float,
    reference: Sequence[float],
    reference_threshold: float,
    ms_per_image: float,
    *,
    min_rank_corr: float,
    max_rel_diff: float,
    min_verdict_agreement: float,
) -> Rung:
    """How ``scores`` (K sheets) agree with ``reference`` (ALL), by the module's definition."""
    if len(scores) != len(reference) or not scores:
        raise ValueError("agreement: scores and reference must be non-empty and of the same length")
    s = torch.tensor(list(scores), dtype=torch.float64)
    a = torch.tensor(list(reference), dtype=torch.float64)
    typical = float(torch.quantile(a, 0.5))  # the usual median (mean of the middle two)
    rel = float((s - a).abs().max()) / typical if typical > 0 else (0.0 if torch.equal(s, a) else math.inf)
    same = ((s > threshold) == (a > reference_threshold)).double().mean().item()
    rho = spearman(scores, reference)
    ok = rho >= min_rank_corr and rel <= max_rel_diff and same >= min_verdict_agreement
    return Rung(sheets, rho, rel, same, ms_per_image, ok)


def choose_sheets(
    n_images: int,
    evaluate: Callable[[int], Rung],
    *,
    max_ms_per_image: float | None = None,
    report: Callable[[Rung], None] | None = None,
) -> tuple[int, list[Rung], str]:
    """Walk the ladder: ``evaluate(K)`` measures one rung. Returns (K, rungs tried, why)."""
    tried: list[Rung] = []
    for k in ladder(n_images):
        rung = evaluate(k)
        tried.append(rung)
        if report is not None:
            report(rung)
        if max_ms_per_image is not None and rung.ms_per_image > max_ms_per_image:
            within = [r for r in tried if r.ms_per_image <= max_ms_per_image]
            if not within:
                return k, tried, f"no K within {max_ms_per_image} ms/img; the smallest tried"
            return within[-1].sheets, tried, f"time budget {max_ms_per_image} ms/img reached before agreement"
        if rung.agrees:
            return k, tried, "smallest K that agrees with ALL"
    return n_images, tried, "no K below N agrees with ALL: all N images"

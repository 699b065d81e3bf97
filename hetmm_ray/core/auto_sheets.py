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

4. The choice: the ladder is searched, not walked. Rungs are tried at indices 0, 1, 3, 7,
   ... (doubling) until one agrees, then the gap below it is bisected, so a product that
   needs a handful of sheets costs one or two rungs and one that needs hundreds costs
   about ``2 log2(rungs)`` instead of every rung (each rung is ``threshold.folds``
   selections plus one out-of-fold scoring: the expensive part of a fit). The result is
   the smallest agreeing K when agreement grows with K, as it did on every ladder measured
   (BENCHMARKS.md); where it does not, the chosen K still agrees with ALL by itself (it is
   only ever a rung that was measured to agree), it may just not be the smallest.
   If no K below N agrees, K = N: ALL itself.
5. With ``auto_max_ms_per_image`` a rung slower than the budget counts as "too big" (the
   search goes lower); if no agreeing K within the budget is found, the largest tried K
   within it is taken, agreeing or not (the reason says so).

PTS's selection at K is not a prefix of its selection at a larger K (OPTICS's
``min_samples = max(2, N // K)`` changes with K, so the easy normals differ), so each rung
runs its own selection.
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
    """Search the ladder (doubling, then bisection; see the module docstring): ``evaluate(K)``
    measures one rung. Returns (K, the rungs tried in order of K, why)."""
    rungs = ladder(n_images)
    tried: dict[int, Rung] = {}

    def too_big(i: int) -> bool:
        """Whether the answer lies at or below rung ``i``: it agrees, or it is over the budget."""
        rung = evaluate(rungs[i])
        tried[rung.sheets] = rung
        if report is not None:
            report(rung)
        return rung.agrees or _over_budget(rung, max_ms_per_image)

    lo, hi, i = 0, len(rungs), 0  # the answer's index lies in [lo, hi]; hi == len: none
    while i < len(rungs):  # doubling: indices 0, 1, 3, 7, ...
        if too_big(i):
            hi = i
            break
        lo, i = i + 1, 2 * i + 1
    while lo < hi:  # bisection of the gap: rungs lo..hi-1 are untried
        mid = (lo + hi) // 2
        if too_big(mid):
            hi = mid
        else:
            lo = mid + 1
    ordered = [tried[k] for k in sorted(tried)]
    if hi == len(rungs):
        return n_images, ordered, "no K below N agrees with ALL: all N images"
    found = tried[rungs[hi]]
    if not _over_budget(found, max_ms_per_image):
        return found.sheets, ordered, "smallest K that agrees with ALL (ladder searched by doubling + bisection)"
    within = [r for r in ordered if not _over_budget(r, max_ms_per_image)]
    if not within:
        return ordered[0].sheets, ordered, f"no K within {max_ms_per_image} ms/img; the smallest tried"
    return within[-1].sheets, ordered, f"time budget {max_ms_per_image} ms/img reached before agreement"


def _over_budget(rung: Rung, max_ms_per_image: float | None) -> bool:
    return max_ms_per_image is not None and rung.ms_per_image > max_ms_per_image

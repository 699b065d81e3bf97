"""``templates.sheets: auto``: the smallest template size K whose verdicts match ALL's.

A compressed selection (PTS, or an ablation baseline) of K sheets scores a part against
fewer templates than ALL (every good image), so it is faster and its scores are higher
(a max over fewer candidates). How many sheets a product needs depends on how varied its
good parts are: 60 is plenty for a uniform bottle and far too few for a product of varied
tiles. So K is measured per product, on its own good images.

Exact semantics:

1. ALL's out-of-fold scores ``a`` of the good images (each scored as a new part would be,
   never against its own templates) and ALL's verdict threshold ``t_ALL`` on them (the
   product's threshold rule; ``far`` while a labelled ``validation`` threshold cannot exist yet).
2. For K on the ladder :data:`LADDER` (below N; N itself is ALL), the selection's
   out-of-fold scores ``s`` of the same images and its own threshold ``t_K`` on them, by the
   same rule. Each side is judged against its OWN calibrated threshold, because that is how
   each would judge a part: a selection whose scores are all 1.3x ALL's has a threshold 1.3x
   ALL's and gives the same verdicts (the raw scores differing says nothing about accuracy).
3. K *agrees* with ALL when all three hold (``templates.auto_*`` settings):

   - rank agreement: Spearman correlation of ``s`` and ``a`` >= ``auto_min_rank_corr``
     (the selection orders good parts as ALL does; invariant to any rescaling);
   - normalised score agreement: ``norm_diff = max_i |s_i / t_K - a_i / t_ALL|`` <=
     ``auto_max_norm_diff``: each image's score as a share of its own side's threshold (1.0 =
     on the threshold) moves by at most that much, so no good part comes closer to (or
     further from) being flagged than that, whatever the raw scale. A threshold that is not
     a positive finite number makes ``norm_diff`` 0 when ``s == a`` exactly, else infinite;
   - verdict agreement: the share of images whose verdict is the same, each side cut at its
     own threshold (``s_i > t_K`` against ``a_i > t_ALL``), >= ``auto_min_verdict_agreement``.

   (``auto_max_rel_diff``, the raw ``max|s - a| / median(a)`` of earlier versions, is retired:
   a compressed selection's raw scores are higher by construction, so it rejected almost every
   K. Stored products that carry it load unchanged; ``config.stored_config`` drops it.)
4. The choice: the ladder is searched, not walked. Rungs are tried at indices 0, 1, 3, 7,
   ... (doubling) until one is "too big" (agrees, or is over the time budget), then the gap
   below it is bisected, so a product that needs a handful of sheets costs one or two rungs
   and one that needs hundreds costs about ``2 log2(rungs)`` instead of every rung (each rung
   is ``threshold.folds`` selections plus one out-of-fold scoring: the expensive part of a
   fit). The result is the smallest tried K that agrees and is within the budget: the
   smallest agreeing K when agreement grows with K, as it did on every ladder measured
   (docs/performance.md); where it does not, the chosen K still agrees with ALL by itself (it is
   only ever a rung that was measured to agree), it may just not be the smallest.
   If no K below N agrees, K = N: ALL itself.
5. Time budget ``auto_max_ms_per_image``: the whole frame's scoring cost in milliseconds, as a
   user reads "ms per image": the backbone pass of all the frame's canvases (its tiles, or the image)
   plus ATMM of every scored canvas, estimated on the fitting host (``frame_cost.FrameCost``, the
   estimate ``hetmm fit`` prints). Each rung carries ``ms_per_frame``, that estimate with its K at
   every scored canvas; a tiled product chooses K per tile position, each position judged by that
   figure, so each keeps its ATMM within ``(budget - backbone) / scored`` and the frame with all its
   tiles meets the budget. (``ms_per_image``, the rung's measured out-of-fold ATMM time per image
   scaled by ``sheets(final) / sheets(fold)`` (:func:`scaled_ms`; ATMM's cost grows linearly with
   the sheets plus a fixed part per image, docs/performance.md, so the scaled
   figure is never below the true one), is reported only.) With a budget, a rung over it counts as
   "too big" (the search goes lower) and is never chosen; if no agreeing K within the budget is
   found, the largest tried K within it is taken, agreeing or not, and ALL only when ALL itself is
   within it (the reason says so). Only when even the ladder's first rung is over the budget is that
   rung taken over budget (the reason says so, and the fit warns: ``frame_cost.TimeBudgetWarning``,
   naming the backbone's share when it alone is over). Without a budget nothing is timed for it.

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

__all__ = [
    "LADDER",
    "Rung",
    "agreement",
    "choose_sheets",
    "ladder",
    "normalised_diff",
    "scaled_ms",
    "spearman",
]

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
    """One K on the ladder and how far it is from ALL (the module docstring, 3 and 5)."""

    sheets: int
    rank_corr: float
    norm_diff: float  # max_i |s_i / t_K - a_i / t_ALL|
    verdict_agreement: float
    ms_per_image: float  # ATMM ms per image (per tile for a tiled product) at the final sheet count
    agrees: bool
    scale: float = 1.0  # t_K / t_ALL: how much higher this selection's scores run (reported only)
    # estimated ms per frame with this K at every scored canvas, backbone included (module
    # docstring, 5); what the time budget is compared with; None: no budget, nothing measured
    ms_per_frame: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {k: (round(v, 5) if isinstance(v, float) else v) for k, v in asdict(self).items()}
        if self.ms_per_frame is None:
            del out["ms_per_frame"]  # records without a budget stay as they were
        return out


def normalised_diff(
    scores: Sequence[float], threshold: float, reference: Sequence[float], reference_threshold: float
) -> float:
    """``max_i |s_i / t_K - a_i / t_ALL|`` (module docstring, 3); 0 or infinite when a threshold
    is not a positive finite number (0 exactly when the scores are equal)."""
    s = torch.tensor(list(scores), dtype=torch.float64)
    a = torch.tensor(list(reference), dtype=torch.float64)
    usable = all(math.isfinite(t) and t > 0 for t in (threshold, reference_threshold))
    if not usable:
        return 0.0 if torch.equal(s, a) else math.inf
    return float((s / threshold - a / reference_threshold).abs().max())


def agreement(
    sheets: int,
    scores: Sequence[float],
    threshold: float,
    reference: Sequence[float],
    reference_threshold: float,
    ms_per_image: float,
    *,
    min_rank_corr: float,
    max_norm_diff: float,
    min_verdict_agreement: float,
) -> Rung:
    """How ``scores`` (K sheets, threshold ``t_K``) agree with ``reference`` (ALL, ``t_ALL``), by
    the module's definition: each side judged against its own threshold."""
    if len(scores) != len(reference) or not scores:
        raise ValueError("agreement: scores and reference must be non-empty and of the same length")
    s = torch.tensor(list(scores), dtype=torch.float64)
    a = torch.tensor(list(reference), dtype=torch.float64)
    diff = normalised_diff(scores, threshold, reference, reference_threshold)
    same = ((s > threshold) == (a > reference_threshold)).double().mean().item()
    rho = spearman(scores, reference)
    ok = rho >= min_rank_corr and diff <= max_norm_diff and same >= min_verdict_agreement
    usable = math.isfinite(threshold) and math.isfinite(reference_threshold) and reference_threshold > 0
    scale = threshold / reference_threshold if usable else math.nan
    return Rung(sheets, rho, diff, same, ms_per_image, ok, scale)


def scaled_ms(measured_ms: float, final_sheets: int, fold_sheets: float) -> float:
    """A rung's ATMM ms per image at its final sheet count from the out-of-fold measurement
    against ``fold_sheets`` (module docstring, 5): proportional scaling, an upper bound of an
    affine cost."""
    return measured_ms * max(1.0, final_sheets / fold_sheets) if fold_sheets > 0 else measured_ms


def choose_sheets(
    n_images: int,
    evaluate: Callable[[int], Rung],
    *,
    max_ms_per_frame: float | None = None,
    all_ms_per_frame: float | None = None,
    report: Callable[[Rung], None] | None = None,
) -> tuple[int, list[Rung], str]:
    """Search the ladder (doubling, then bisection; see the module docstring): ``evaluate(K)``
    measures one rung; ``max_ms_per_frame``: the time budget, compared with each rung's
    ``ms_per_frame`` (``ms_per_image`` where that is None); ``all_ms_per_frame``: ALL's figure,
    checked against the budget before ALL is chosen (None: not known, ALL taken as within it).
    Returns (K, the rungs tried in order of K, why)."""
    rungs = ladder(n_images)
    tried: dict[int, Rung] = {}

    def too_big(i: int) -> bool:
        """Whether the answer lies at or below rung ``i``: it agrees, or it is over the budget."""
        rung = evaluate(rungs[i])
        tried[rung.sheets] = rung
        if report is not None:
            report(rung)
        return rung.agrees or _over_budget(_cost(rung), max_ms_per_frame)

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
    within = [r for r in ordered if not _over_budget(_cost(r), max_ms_per_frame)]
    budget = "" if max_ms_per_frame is None else f" within {max_ms_per_frame:g} ms/frame"
    agreeing = [r for r in within if r.agrees]
    if agreeing:
        return (
            agreeing[0].sheets,
            ordered,
            f"smallest K that agrees with ALL{budget} (ladder searched by doubling + bisection)",
        )
    all_over = max_ms_per_frame is not None and all_ms_per_frame is not None and all_ms_per_frame > max_ms_per_frame
    if len(within) == len(ordered) and not all_over:
        return n_images, ordered, f"no K below N agrees with ALL: all N images{budget}"
    if within:
        return within[-1].sheets, ordered, f"time budget {max_ms_per_frame:g} ms/frame reached before agreement"
    if not ordered:
        return n_images, ordered, f"no ladder below {n_images} images: all N images, over {max_ms_per_frame:g} ms/frame"
    return ordered[0].sheets, ordered, f"no K within {max_ms_per_frame:g} ms/frame: the smallest tried, over the budget"


def _cost(rung: Rung) -> float:
    return rung.ms_per_image if rung.ms_per_frame is None else rung.ms_per_frame


def _over_budget(ms: float, max_ms: float | None) -> bool:
    return max_ms is not None and ms > max_ms

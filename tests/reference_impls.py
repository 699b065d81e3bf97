"""Test-only views of the library that used to live in ``core/``.

None of these is called by ``hetmm_ray``; each is a thin view over the library's one path, kept
here so the tests can state their expectations in the terms they were written in:

- :func:`calibrate` / :data:`FoldScorer` (was ``core.scoring``): out-of-fold scores of good images
  over ``core.calibration.fold_plan``, the library's fold rule, with a hand-written fold scorer.
- :func:`select` / :class:`Selection` (was ``core.pts``): one selection kind's templates, i.e.
  ``core.pts.select_layer`` (THE selection path) with its templates gathered.
- :func:`window_max_similarity` (was ``core.atmm``): the layout of ATMM's shared product
  (``core.atmm._window_max``) as a (B, p*p, H, W) tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import Tensor

from hetmm_ray.core import atmm
from hetmm_ray.core.calibration import fold_plan
from hetmm_ray.core.cover import LAST
from hetmm_ray.core.pts import pts_indices, select_layer, select_templates
from hetmm_ray.core.scoring import Calibration

__all__ = ["FoldScorer", "Selection", "calibrate", "select", "window_max_similarity"]

FoldScorer = Callable[[list[int], list[int]], Sequence[float]]
"""``score_fold(held_out, kept)``: scores of the held-out images against templates of the kept ones."""


def calibrate(
    n_images: int,
    *,
    folds: int,
    max_images: int,
    seed: int,
    score_fold: FoldScorer,
    keys: Sequence[str] | None = None,
) -> Calibration:
    """Leave-some-out scores of good images.

    Up to ``max_images`` training images are drawn (seeded) and split into ``folds``
    (``fold_plan``); ``score_fold(held_out, kept)`` scores the held-out indices against templates
    built from the kept indices (every training image not held out).
    """
    scores: list[float] = []
    for held in fold_plan(n_images, folds=folds, max_images=max_images, seed=seed, keys=keys):
        held_set = set(held)
        kept = [i for i in range(n_images) if i not in held_set]
        scores.extend(float(s) for s in score_fold(held, kept))
    return Calibration(scores=tuple(scores))


@dataclass(frozen=True)
class Selection:
    """A selection's templates and, where they are bank vectors, their indices."""

    kind: str
    templates: Tensor  # (K', C, H, W)
    indices: Tensor | None  # (K', H, W) bank indices; None for "all" (the bank itself) and "pc_k" (centres)
    centres: Tensor | None = None  # the templates when they are not bank vectors (pc_k below N sheets)


def select(
    kind: str,
    bank: Tensor,
    k: int,
    seed: int = 0,
    *,
    chunk_pixels: int | None = None,
    progress: Callable[[int, int], object] | None = None,
    pts: Callable[..., Tensor] = pts_indices,
) -> Selection:
    """Templates of one selection ``kind`` of a CPU ``bank`` (``core.pts.select_layer``)."""
    chosen = select_layer(bank, kind, k, seed, pts=pts, chunk_pixels=chunk_pixels, progress=progress)
    if chosen.centres is not None:
        return Selection(kind, chosen.centres, None, chosen.centres)
    if chosen.indices is None:
        return Selection(kind, bank, None)
    return Selection(kind, select_templates(bank, chosen.indices), chosen.indices)


def window_max_similarity(query: Tensor, t_pm: Tensor, window: int, *, chunk_bytes: int | None = None) -> Tensor:
    """``M[b, d, y] = max_k <Q[b, y + d], T[k, y]>`` over a ``window``-square of offsets.

    ``query`` (B, C, H, W); ``t_pm`` (H*W, K, C) from ``core.atmm.pixel_major``. Returns
    (B, window*window, H, W), offsets ``d = (dy, dx)`` row-major, ``-inf`` where ``y + d`` is off
    the map; ``chunk_bytes`` as in ``core.atmm``.
    """
    b, _, h, w = query.shape
    m = atmm._interior(atmm._window_max(query, t_pm, window, chunk_bytes), h, w)  # (dx, dy, H, W, B)
    out = query.new_empty(b, window, window, h, w)
    out.copy_(m.permute(4, 1, 0, 2, 3))
    return out.view(b, window * window, h, w)


def cover_reference(x: Tensor, sim: Tensor, k: int, excluded: Tensor | None = None) -> list[int]:
    """``core/cover.py``'s semantics for ONE pixel, written plainly: ``x`` (N, C) its unit vectors and
    ``sim`` (N, N) their similarities (``cover.unit_vectors``, ``cover.cover_similarities``); the
    chosen bank indices in order."""
    n = x.shape[0]
    v = x.double().tolist()
    s = sim.tolist()
    out_ = set() if excluded is None else {i for i in range(n) if bool(excluded[i])}
    cands = [i for i in range(n) if i not in out_]
    empty = {i for i in cands if max(abs(a) for a in v[i]) == 0}
    if min(k, len(cands)) == len(cands):
        return cands
    real = [i for i in cands if i not in empty]
    if real:
        total = [math.fsum(v[j][ch] for j in cands) for ch in range(len(v[0]))]
        sums = [math.fsum(a * b for a, b in zip(v[i], total, strict=True)) for i in real]
        first = real[sums.index(max(sums))]  # the first maximum: lowest index on ties
    else:
        first = cands[0]
    chosen = [first]
    while len(chosen) < k:
        best_key, pick = math.inf, -1
        for i in cands:
            if i in chosen:
                continue
            key = max(s[c][i] for c in chosen) + (LAST if i in empty else 0.0)
            if key < best_key:
                best_key, pick = key, i
        chosen.append(pick)
    return chosen

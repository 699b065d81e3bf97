"""Pixel AUROC and PRO over maps that arrive one image at a time, in bounded memory.

Exact semantics of :class:`PixelMetrics`:

- ``add(map, mask, valid=None)`` takes one image's anomaly map and ground-truth mask (2-D, the same
  shape; ``valid``: an inspection region, only its pixels count, a ground-truth region is its valid
  part). Ground-truth regions are the mask's 8-connected components (``metrics.region_labels``),
  labelled per image as they arrive.
- **Exact while small.** Until ``exact_pixels`` pixels have arrived, every pixel is kept (a float32
  score, a label, a float64 region weight: 13 bytes) and the results are exactly ``metrics.pixel_auroc`` and
  ``metrics.pro_score`` of the same maps.
- **Binned beyond.** Past that budget the kept pixels and every later one are counted in ``bins``
  score bins, uniform in ``arcsinh(score / SCALE)`` over ``[-RANGE, RANGE]`` (scores beyond go to the
  end bins): per bin the defect-pixel count, the background count and the sum of ``1 / region size``
  over defect pixels. Memory is then ``3 x bins`` numbers whatever the number of images. A bin is
  ``2 RANGE / bins`` wide in arcsinh: two scores in the same bin differ by at most a relative
  ``2 RANGE / bins`` (about 2.2e-4 at the defaults, for scores far above ``SCALE``).
- **Binned AUROC** counts a defect and a background pixel in the same bin as a tie (one half), as
  the exact AUROC counts equal scores; so it differs from the exact AUROC by at most
  :meth:`auroc_error_bound` = ``sum_b pos_b neg_b / (2 P N)`` (computed from the counts and reported).
- **Binned PRO** is the PRO curve taken at the bin edges (a bin's pixels cross a threshold together,
  as a tie run does), integrated exactly as ``metrics.pro_score`` (``metrics.pro_area``): FPR up to
  ``fpr_limit``, closed there by linear interpolation, trapezoids, divided by the limit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .metrics import pro_area, pro_curve, region_labels, roc_auc

__all__ = ["PixelMetrics"]

SCALE = 1e-6  # arcsinh(s / SCALE) is about sign(s) log(2 |s| / SCALE) for |s| >> SCALE
RANGE = 29.0  # arcsinh(1e6 / SCALE) ~ 28.3: scores up to 1e6 in magnitude are binned apart
EXACT_PIXELS = 30_000_000  # 13 bytes each (score, label, weight): 390 MB of kept pixels at most
BINS = 1 << 18


class PixelMetrics:
    """Pixel AUROC and PRO of maps added one image at a time (module docstring)."""

    def __init__(self, *, fpr_limit: float = 0.3, exact_pixels: int = EXACT_PIXELS, bins: int = BINS) -> None:
        if not 0.0 < fpr_limit <= 1.0:
            raise ValueError(f"fpr_limit must be in (0, 1], got {fpr_limit}")
        self.fpr_limit, self.exact_pixels, self.bins = fpr_limit, int(exact_pixels), int(bins)
        self._scores: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []
        self._weights: list[np.ndarray] = []  # 1 / region size on defect pixels, 0 elsewhere (float64)
        self._kept = 0
        self._regions = 0
        self._pos: np.ndarray | None = None  # per-bin counts once binned
        self._neg: np.ndarray | None = None
        self._wsum: np.ndarray | None = None

    @property
    def exact(self) -> bool:
        """Whether every pixel is still kept (the results are then the exact metrics)."""
        return self._pos is None

    @property
    def regions(self) -> int:
        return self._regions

    def add(self, anomaly_map: Any, mask: Any, valid: Any = None) -> None:
        m = np.asarray(anomaly_map, dtype=np.float32)
        g = np.asarray(mask).astype(bool)
        if m.shape != g.shape or m.ndim != 2:
            raise ValueError(f"a map and its mask must be 2-D of one shape, got {m.shape} and {g.shape}")
        if np.isnan(m).any():
            raise ValueError("maps contain NaN values")
        if valid is not None:
            v = np.asarray(valid).astype(bool)
            if v.shape != g.shape:
                raise ValueError(f"valid must have the mask's shape {g.shape}, got {v.shape}")
            g = g & v
        labels, n = region_labels(g)
        sizes = np.bincount(labels.ravel(), minlength=n + 1).astype(np.float64)
        inv = np.zeros(n + 1, dtype=np.float64)
        inv[1:] = 1.0 / sizes[1:]
        weights = inv[labels]
        self._regions += n
        if valid is not None:
            keep = v
            m, g, weights = m[keep], g[keep], weights[keep]
        else:
            m, g, weights = m.ravel(), g.ravel(), weights.ravel()
        if self.exact:
            self._scores.append(m)
            self._labels.append(g)
            self._weights.append(weights)
            self._kept += m.size
            if self._kept > self.exact_pixels:
                self._to_bins()
        else:
            self._count(m, g, weights)

    # --- bins -------------------------------------------------------------------------------------
    def _bin(self, scores: np.ndarray) -> np.ndarray:
        key = np.arcsinh(scores.astype(np.float64) / SCALE)
        b = np.floor((key + RANGE) * (self.bins / (2 * RANGE))).astype(np.int64)
        return np.clip(b, 0, self.bins - 1)

    def _count(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> None:
        assert self._pos is not None and self._neg is not None and self._wsum is not None
        b = self._bin(scores)
        self._pos += np.bincount(b[labels], minlength=self.bins)
        self._neg += np.bincount(b[~labels], minlength=self.bins)
        self._wsum += np.bincount(b[labels], weights=weights[labels].astype(np.float64), minlength=self.bins)

    def _to_bins(self) -> None:
        self._pos = np.zeros(self.bins, dtype=np.int64)
        self._neg = np.zeros(self.bins, dtype=np.int64)
        self._wsum = np.zeros(self.bins, dtype=np.float64)
        for s, g, w in zip(self._scores, self._labels, self._weights, strict=True):
            self._count(s, g, w)
        self._scores, self._labels, self._weights = [], [], []

    # --- results ----------------------------------------------------------------------------------
    def _check(self, n_pos: int, n_neg: int) -> None:
        if n_pos == 0 or n_neg == 0:
            raise ValueError(f"pixel metrics need defect and background pixels, got {n_pos} and {n_neg}")

    def pixel_auroc(self) -> float:
        if self.exact:
            labels = np.concatenate(self._labels)
            self._check(int(labels.sum()), int((~labels).sum()))
            return roc_auc(np.concatenate(self._scores), labels)
        pos, neg = self._pos, self._neg
        assert pos is not None and neg is not None
        n_pos, n_neg = int(pos.sum()), int(neg.sum())
        self._check(n_pos, n_neg)
        below = np.cumsum(neg) - neg  # background pixels in lower bins
        u2 = float(np.sum(pos * (2 * below + neg), dtype=np.float64))
        return u2 / (2.0 * n_pos * n_neg)

    def auroc_error_bound(self) -> float:
        """The most the binned AUROC can differ from the exact one (0 while exact)."""
        if self.exact:
            return 0.0
        pos, neg = self._pos, self._neg
        assert pos is not None and neg is not None
        return float(np.sum(pos.astype(np.float64) * neg)) / (2.0 * float(pos.sum()) * float(neg.sum()))

    def pro(self) -> float:
        return pro_area(*self.pro_curve(), self.fpr_limit)

    def pro_curve(self) -> tuple[np.ndarray, np.ndarray]:
        """The PRO curve ``(fpr, pro)`` that :meth:`pro` integrates, every threshold's point from
        the highest score down (exact, or at the bin edges once binned), over all FPRs."""
        if self._regions == 0:
            raise ValueError("PRO is undefined without ground-truth regions: masks contain no positive pixel")
        if self.exact:
            scores = np.concatenate(self._scores)
            background = ~np.concatenate(self._labels)
            weights = np.concatenate(self._weights) / self._regions
            self._check(1, int(np.count_nonzero(background)))
            return pro_curve(scores, background, weights)
        neg, wsum, pos = self._neg, self._wsum, self._pos
        assert neg is not None and wsum is not None and pos is not None
        n_background = int(neg.sum())
        self._check(1, n_background)
        occupied = np.flatnonzero((neg + pos) > 0)[::-1]  # from the highest bin down
        fpr = np.concatenate(([0.0], np.cumsum(neg[occupied], dtype=np.float64) / n_background))
        pro = np.concatenate(([0.0], np.cumsum(wsum[occupied]) / self._regions))
        return fpr, pro

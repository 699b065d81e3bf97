"""Evaluation metrics for anomaly detection: image/pixel AUROC and the MVTec AD PRO score.

Pure numpy/scipy. Inputs may be numpy arrays, array-likes or torch tensors (converted on the host).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import ndimage

__all__ = ["image_auroc", "pixel_auroc", "pro_area", "pro_curve", "pro_score", "region_labels", "roc_auc"]

# 8-connectivity, as used by the official MVTec AD evaluation code.
_STRUCTURE_8 = np.ones((3, 3), dtype=bool)


def _to_numpy(x: Any) -> np.ndarray:
    # Torch tensors may live on the GPU or require grad; np.asarray would fail on those.
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _check_scores(scores: np.ndarray, name: str = "scores") -> None:
    if not np.issubdtype(scores.dtype, np.number) or np.issubdtype(scores.dtype, np.complexfloating):
        raise ValueError(f"{name} must be real numbers, got dtype {scores.dtype}")
    if np.issubdtype(scores.dtype, np.floating) and np.isnan(scores).any():
        raise ValueError(f"{name} contain NaN values")


def _as_binary(labels: np.ndarray, name: str = "labels") -> np.ndarray:
    if labels.dtype == bool:
        return labels
    if not np.isin(labels, (0, 1)).all():
        raise ValueError(f"{name} must be binary (bool or values in {{0, 1}})")
    return labels.astype(bool)


def roc_auc(scores: Any, labels: Any) -> float:
    """ROC AUC of ``scores`` against binary ``labels`` (any equal shapes; ties count as half)."""
    s = _to_numpy(scores)
    y = _to_numpy(labels)
    if s.shape != y.shape:
        raise ValueError(f"scores and labels must have the same shape, got {s.shape} and {y.shape}")
    _check_scores(s)
    y = _as_binary(y).ravel()
    s = s.ravel()
    n_pos = int(np.count_nonzero(y))
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"ROC AUC needs both classes, got {n_pos} positive and {n_neg} negative labels")
    # Mann-Whitney U: for each positive, (#negatives below) + (#negatives tied) / 2, i.e. the average-rank
    # statistic. Counting via searchsorted keeps it exact in int64, and np.sort of values is several times
    # faster than the argsort that rank-based code needs (matters for millions of pixels).
    neg = np.sort(s[~y])
    pos = np.sort(s[y])  # sorted queries make the binary searches cache friendly
    below = np.searchsorted(neg, pos, side="left").sum(dtype=np.int64)
    below_or_tied = np.searchsorted(neg, pos, side="right").sum(dtype=np.int64)
    u2 = int(below) + int(below_or_tied)  # = 2 * U
    return u2 / (2.0 * float(n_pos) * float(n_neg))


def image_auroc(scores: Any, labels: Any) -> float:
    """Image-level AUROC: ``scores`` (N,) against ``labels`` (N,) in {0, 1}."""
    s = _to_numpy(scores)
    if s.ndim != 1:
        raise ValueError(f"image scores must be 1-D (N,), got shape {s.shape}")
    return roc_auc(s, labels)


def _ragged(maps: Any, masks: Any) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    """Per-image lists when maps come as a list of 2-D arrays of different shapes (letterboxed
    images at their own aspect); None for an (N, H, W) stack."""
    if not isinstance(maps, (list, tuple)) or len({np.shape(x) for x in maps}) <= 1:
        return None
    m = [_to_numpy(x) for x in maps]
    g = [_to_numpy(x) for x in masks]
    if len(m) != len(g) or any(a.shape != b.shape or a.ndim != 2 for a, b in zip(m, g, strict=True)):
        raise ValueError("maps and masks must pair up as 2-D arrays of the same shape")
    return m, g


def _only_valid(maps: Any, masks: Any, valid: Any) -> tuple[np.ndarray, np.ndarray]:
    """The pixels of ``maps`` and ``masks`` where ``valid`` (same layout) is true, as 1-D arrays."""
    m = [_to_numpy(x) for x in maps]
    g = [_to_numpy(x) for x in masks]
    v = [_as_binary(_to_numpy(x), "valid") for x in valid]
    if not (len(m) == len(g) == len(v)) or any(
        a.shape != b.shape or a.shape != c.shape for a, b, c in zip(m, g, v, strict=True)
    ):
        raise ValueError("maps, masks and valid must pair up with the same shapes")
    return np.concatenate([a[c] for a, c in zip(m, v, strict=True)]), np.concatenate(
        [b[c] for b, c in zip(g, v, strict=True)]
    )


def pixel_auroc(maps: Any, masks: Any, valid: Any = None) -> float:
    """Pixel-level AUROC over all pixels of ``maps`` (N, H, W) against ``masks`` (N, H, W).

    Also takes lists of 2-D maps and masks of per-image shapes (every pixel counts once).
    ``valid`` (bool, the same layout; an inspection region): only those pixels count.
    """
    if valid is not None:
        return roc_auc(*_only_valid(maps, masks, valid))
    ragged = _ragged(maps, masks)
    if ragged is not None:
        return roc_auc(np.concatenate([x.ravel() for x in ragged[0]]), np.concatenate([x.ravel() for x in ragged[1]]))
    m = _to_numpy(maps)
    if m.ndim != 3:
        raise ValueError(f"anomaly maps must be (N, H, W), got shape {m.shape}")
    return roc_auc(m, masks)


def region_labels(mask2d: Any) -> tuple[np.ndarray, int]:
    """Label the 8-connected regions of a 2-D boolean mask; returns (labels, n_regions), background 0."""
    mask = _as_binary(_to_numpy(mask2d), "mask")
    if mask.ndim != 2:
        raise ValueError(f"mask must be 2-D, got shape {mask.shape}")
    labels, n = ndimage.label(mask, structure=_STRUCTURE_8)
    return labels, int(n)


def pro_score(maps: Any, masks: Any, fpr_limit: float = 0.3, valid: Any = None) -> float:
    """Normalized area under the PRO curve (MVTec AD) for FPR in [0, ``fpr_limit``].

    ``maps`` (N, H, W) anomaly scores, ``masks`` (N, H, W) ground truth. Every 8-connected region of every
    image has equal weight; the curve is integrated with the trapezoid rule and divided by ``fpr_limit``.
    Also takes lists of 2-D maps and masks of per-image shapes (regions never span two images).
    ``valid`` (bool, the same layout; an inspection region): only those pixels count, a
    ground-truth region is its valid part (labelled after the restriction).
    """
    ragged = _ragged(maps, masks)
    if ragged is not None:
        m_list, g_list = ragged
    else:
        m = _to_numpy(maps)
        g = _to_numpy(masks)
        if m.shape != g.shape:
            raise ValueError(f"maps and masks must have the same shape, got {m.shape} and {g.shape}")
        if m.ndim != 3:
            raise ValueError(f"maps and masks must be (N, H, W), got shape {m.shape}")
        m_list, g_list = list(m), list(g)
    if not 0.0 < fpr_limit <= 1.0:
        raise ValueError(f"fpr_limit must be in (0, 1], got {fpr_limit}")
    for x in m_list:
        _check_scores(x, "maps")
    g_list = [_as_binary(x, "masks") for x in g_list]
    v_list: list[np.ndarray] | None = None
    if valid is not None:
        v_list = [_as_binary(_to_numpy(x), "valid") for x in valid]
        if len(v_list) != len(g_list) or any(a.shape != b.shape for a, b in zip(v_list, g_list, strict=True)):
            raise ValueError("valid must have the masks' shapes")
        g_list = [g & v for g, v in zip(g_list, v_list, strict=True)]

    # Per-pixel weight 1 / (region_size * n_regions): the cumulative sum over pixels above a threshold is
    # then exactly the mean per-region overlap, without looping over regions or thresholds.
    ids_list = []
    offset = 0
    for gi in g_list:
        lab, n = region_labels(gi)
        ids_list.append(np.where(lab > 0, lab + offset, 0).ravel())
        offset += n
    n_regions = offset
    region_ids = np.concatenate(ids_list)
    m = np.concatenate([x.ravel() for x in m_list])
    g = np.concatenate([x.ravel() for x in g_list])
    if v_list is not None:
        keep = np.concatenate([x.ravel() for x in v_list])
        region_ids, m, g = region_ids[keep], m[keep], g[keep]
    if n_regions == 0:
        raise ValueError("PRO is undefined without ground-truth regions: masks contain no positive pixel")
    background = ~g.ravel()
    n_background = int(np.count_nonzero(background))
    if n_background == 0:
        raise ValueError("PRO is undefined without background pixels: masks are positive everywhere")

    ids = region_ids.ravel()
    sizes = np.bincount(ids, minlength=n_regions + 1).astype(np.float64)
    inv = np.zeros(n_regions + 1, dtype=np.float64)
    inv[1:] = 1.0 / (sizes[1:] * n_regions)
    weights = inv[ids]

    return pro_area(*pro_curve(m.ravel(), background, weights), fpr_limit)


def pro_curve(scores: np.ndarray, background: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The PRO curve's points from the top score down, from (0, 0): per distinct score, the share of
    ``background`` pixels at or above it and the sum of ``weights`` (each defect pixel's
    ``1 / (region size * regions)``) at or above it."""
    n_background = int(np.count_nonzero(background))
    # Stability is irrelevant because tie runs are collapsed below; the default sort is much faster.
    order = np.argsort(scores)[::-1]
    sorted_scores = scores[order]
    fpr = np.cumsum(background[order], dtype=np.float64) / n_background
    pro = np.cumsum(weights[order])
    # Pixels with equal scores cross every threshold together, so only the end of each tie run is a curve point.
    last_of_run = np.flatnonzero(np.append(sorted_scores[1:] != sorted_scores[:-1], True))
    return np.concatenate(([0.0], fpr[last_of_run])), np.concatenate(([0.0], pro[last_of_run]))


def pro_area(fpr: np.ndarray, pro: np.ndarray, fpr_limit: float) -> float:
    """The normalised area under a PRO curve given as points (``fpr`` non-decreasing, from 0): the
    points with ``fpr <= fpr_limit``, closed at exactly the limit by linear interpolation, integrated
    with the trapezoid rule and divided by ``fpr_limit`` (clipped to [0, 1])."""
    k = int(np.searchsorted(fpr, fpr_limit, side="right"))
    x = fpr[:k]
    y = pro[:k]
    if k < fpr.size:
        x0, x1, y0, y1 = fpr[k - 1], fpr[k], pro[k - 1], pro[k]
        y_lim = y0 + (fpr_limit - x0) * (y1 - y0) / (x1 - x0)
        x = np.append(x, fpr_limit)
        y = np.append(y, y_lim)
    area = float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2.0))
    return float(np.clip(area / fpr_limit, 0.0, 1.0))

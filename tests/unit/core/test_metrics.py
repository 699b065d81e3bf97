"""Tests for hetmm_ray.core.metrics against slow, obviously-correct reference implementations."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import ndimage
from sklearn.metrics import roc_auc_score

from hetmm_ray.core.metrics import (
    image_auroc,
    pixel_auroc,
    pro_score,
    region_labels,
    roc_auc,
)

# ---------------------------------------------------------------------------------------------------------------------
# Slow reference implementations
# ---------------------------------------------------------------------------------------------------------------------


def slow_auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Count over all (positive, negative) pairs: win = 1, tie = 0.5."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).astype(bool).ravel()
    pos = s[y]
    neg = s[~y]
    wins = 0.0
    for p in pos:
        wins += float(np.sum(p > neg)) + 0.5 * float(np.sum(p == neg))
    return wins / (pos.size * neg.size)


def slow_pro(maps: np.ndarray, masks: np.ndarray, fpr_limit: float) -> float:
    """Threshold at every distinct score, measure FPR and mean region overlap directly, integrate by segments."""
    maps = np.asarray(maps, dtype=np.float64)
    masks = np.asarray(masks, dtype=bool)
    regions = []
    for i in range(maps.shape[0]):
        lab, n = ndimage.label(masks[i], structure=np.ones((3, 3)))
        for r in range(1, n + 1):
            region = np.zeros(masks.shape, dtype=bool)
            region[i] = lab == r
            regions.append(region)
    background = ~masks

    thresholds = [maps.max() + 1.0] + sorted(np.unique(maps).tolist(), reverse=True)
    points = []
    for t in thresholds:
        above = maps >= t
        fpr = np.sum(above & background) / np.sum(background)
        pro = np.mean([np.sum(above & r) / np.sum(r) for r in regions])
        points.append((float(fpr), float(pro)))
    points.sort()
    assert points[0] == (0.0, 0.0)

    area = 0.0
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 >= fpr_limit:
            break
        if x1 <= fpr_limit:
            area += (x1 - x0) * (y0 + y1) / 2.0
        else:
            y_lim = y0 + (fpr_limit - x0) / (x1 - x0) * (y1 - y0)
            area += (fpr_limit - x0) * (y0 + y_lim) / 2.0
            break
    return area / fpr_limit


def random_blob_masks(rng: np.random.Generator, n: int, h: int, w: int) -> np.ndarray:
    """Random rectangles plus isolated diagonal pixel pairs (only 8-connected) and single pixels."""
    masks = np.zeros((n, h, w), dtype=bool)
    for i in range(n):
        for _ in range(rng.integers(1, 3)):
            r, c = rng.integers(0, h - 3), rng.integers(0, w - 3)
            masks[i, r : r + rng.integers(1, 4), c : c + rng.integers(1, 4)] = True
        r, c = rng.integers(0, h - 1), rng.integers(0, w - 1)
        masks[i, r, c] = True
        masks[i, r + 1, c + 1] = True
        masks[i, rng.integers(0, h), rng.integers(0, w)] = True
    return masks


def random_maps(rng: np.random.Generator, masks: np.ndarray) -> np.ndarray:
    # Rounded to one decimal so that many scores tie, including across positive and negative pixels.
    return np.round(rng.random(masks.shape) + 0.4 * masks, 1)


# ---------------------------------------------------------------------------------------------------------------------
# AUROC
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_roc_auc_matches_pairwise_count_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 400))
    labels = rng.random(n) < rng.uniform(0.1, 0.9)
    labels[0], labels[1] = True, False
    scores = np.round(rng.normal(size=n) + 0.7 * labels, 1)
    expected = slow_auroc(scores, labels)
    assert roc_auc(scores, labels) == pytest.approx(expected, abs=1e-12)
    assert roc_auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    assert image_auroc(scores, labels.astype(int)) == pytest.approx(expected, abs=1e-12)


def test_roc_auc_all_tied_is_half() -> None:
    assert roc_auc(np.zeros(10), np.arange(10) % 2) == pytest.approx(0.5, abs=1e-15)


def test_roc_auc_perfect_and_reversed() -> None:
    labels = np.array([0, 0, 0, 1, 1])
    scores = np.array([0.1, 0.2, 0.3, 0.8, 0.9])
    assert roc_auc(scores, labels) == 1.0
    assert roc_auc(-scores, labels) == 0.0


def test_pixel_auroc_matches_flattened_reference() -> None:
    rng = np.random.default_rng(7)
    masks = random_blob_masks(rng, 3, 12, 10)
    maps = random_maps(rng, masks).astype(np.float32)
    expected = slow_auroc(maps, masks)
    assert pixel_auroc(maps, masks) == pytest.approx(expected, abs=1e-12)
    assert pixel_auroc(maps, masks) == pytest.approx(roc_auc_score(masks.ravel(), maps.ravel()), abs=1e-12)


def test_roc_auc_accepts_torch_tensors() -> None:
    torch = pytest.importorskip("torch")
    scores = torch.tensor([0.1, 0.4, 0.35, 0.8], requires_grad=True)
    labels = torch.tensor([0, 0, 1, 1])
    assert roc_auc(scores, labels) == pytest.approx(0.75)


def test_roc_auc_large_input_matches_sklearn() -> None:
    rng = np.random.default_rng(0)
    n = 1_000_000
    labels = rng.random(n) < 0.05
    scores = (rng.random(n) + 0.2 * labels).astype(np.float32)
    value = roc_auc(scores, labels)
    assert value == pytest.approx(roc_auc_score(labels, scores), abs=1e-9)


@pytest.mark.parametrize(
    ("scores", "labels", "match"),
    [
        (np.array([0.1, 0.2, 0.3]), np.array([1, 1, 1]), "both classes"),
        (np.array([0.1, 0.2, 0.3]), np.array([0, 0, 0]), "both classes"),
        (np.array([0.1, 0.2, 0.3]), np.array([0, 1]), "same shape"),
        (np.array([0.1, np.nan, 0.3]), np.array([0, 1, 1]), "NaN"),
        (np.array([0.1, 0.2, 0.3]), np.array([0, 1, 2]), "binary"),
    ],
)
def test_roc_auc_errors(scores: np.ndarray, labels: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        roc_auc(scores, labels)


def test_image_and_pixel_auroc_shape_errors() -> None:
    with pytest.raises(ValueError):
        image_auroc(np.zeros((2, 2)), np.array([[0, 1], [1, 0]]))
    with pytest.raises(ValueError):
        pixel_auroc(np.zeros(4), np.array([0, 1, 1, 0]))
    with pytest.raises(ValueError, match="same shape"):
        pixel_auroc(np.zeros((2, 3, 3)), np.zeros((2, 3, 4), dtype=bool))


# ---------------------------------------------------------------------------------------------------------------------
# Regions and PRO
# ---------------------------------------------------------------------------------------------------------------------


def test_region_labels_uses_8_connectivity() -> None:
    mask = np.zeros((4, 4), dtype=bool)
    mask[0, 0] = True
    mask[1, 1] = True  # touches (0, 0) only diagonally
    mask[3, 3] = True
    labels, n = region_labels(mask)
    assert n == 2
    assert labels[0, 0] == labels[1, 1] != labels[3, 3]
    assert labels[2, 2] == 0


def test_pro_diagonal_pixels_form_one_region() -> None:
    # A diagonal pair plus a separate block; only (0, 0) scores high. With 8-connectivity the pair is one region,
    # so PRO at that threshold is (1/2 + 0) / 2 = 0.25; 4-connectivity would give (1 + 0 + 0) / 3 instead.
    masks = np.zeros((1, 6, 6), dtype=bool)
    masks[0, 0, 0] = masks[0, 1, 1] = True
    masks[0, 4:6, 3:6] = True
    maps = np.zeros((1, 6, 6))
    maps[0, 0, 0] = 1.0
    # The first threshold hits only (0, 0): FPR stays 0 and PRO jumps to 0.25; the next one adds everything.
    # Curve: (0,0) -> (0,0.25) -> (1,1). At fpr_limit 1: area = (0.25 + 1) / 2.
    assert pro_score(maps, masks, fpr_limit=1.0) == pytest.approx(0.625, abs=1e-12)
    assert pro_score(maps, masks, fpr_limit=1.0) == pytest.approx(slow_pro(maps, masks, 1.0), abs=1e-12)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("fpr_limit", [0.3, 0.05, 1.0])
def test_pro_matches_slow_reference(seed: int, fpr_limit: float) -> None:
    rng = np.random.default_rng(seed)
    masks = random_blob_masks(rng, 3, 12, 10)
    maps = random_maps(rng, masks)
    expected = slow_pro(maps, masks, fpr_limit)
    got = pro_score(maps, masks, fpr_limit=fpr_limit)
    assert got == pytest.approx(expected, abs=1e-9)
    assert 0.0 <= got <= 1.0


@pytest.mark.parametrize("seed", range(3))
def test_pro_matches_slow_reference_without_ties(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    masks = random_blob_masks(rng, 2, 9, 11)
    maps = rng.random(masks.shape) + 0.3 * masks
    for fpr_limit in (0.3, 0.05, 1.0):
        assert pro_score(maps, masks, fpr_limit) == pytest.approx(slow_pro(maps, masks, fpr_limit), abs=1e-9)


def test_pro_image_without_regions_contributes_only_background() -> None:
    rng = np.random.default_rng(3)
    masks = random_blob_masks(rng, 3, 12, 10)
    masks[1] = False
    maps = random_maps(rng, masks)
    assert pro_score(maps, masks) == pytest.approx(slow_pro(maps, masks, 0.3), abs=1e-9)


def test_pro_perfect_separation_is_one() -> None:
    rng = np.random.default_rng(1)
    masks = random_blob_masks(rng, 2, 8, 8)
    maps = np.where(masks, 2.0 + rng.random(masks.shape), rng.random(masks.shape))
    assert pro_score(maps, masks, fpr_limit=0.3) == pytest.approx(1.0, abs=1e-12)


def test_pro_errors() -> None:
    maps = np.random.default_rng(0).random((2, 5, 5))
    with pytest.raises(ValueError, match="no positive pixel"):
        pro_score(maps, np.zeros((2, 5, 5), dtype=bool))
    with pytest.raises(ValueError, match="same shape"):
        pro_score(maps, np.zeros((2, 5, 4), dtype=bool))
    masks = np.zeros((2, 5, 5), dtype=bool)
    masks[0, 1, 1] = True
    with pytest.raises(ValueError, match="fpr_limit"):
        pro_score(maps, masks, fpr_limit=0.0)
    bad = maps.copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        pro_score(bad, masks)

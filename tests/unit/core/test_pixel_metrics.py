"""Pixel AUROC and PRO added one image at a time (core/pixel_metrics.py) against the exact
metrics of the whole set (core/metrics.py, the slow obvious computation): equal while every pixel is
kept, within the stated bound once binned, with and without an inspection region."""

from __future__ import annotations

import numpy as np
import pytest

from hetmm_ray.core.metrics import pixel_auroc, pro_score
from hetmm_ray.core.pixel_metrics import PixelMetrics


def _set(seed: int, n: int = 6, shape: tuple[int, int] = (40, 56)):
    rng = np.random.default_rng(seed)
    maps, masks, valid = [], [], []
    for i in range(n):
        m = rng.gamma(2.0, 0.05, size=shape).astype(np.float32)
        g = np.zeros(shape, dtype=bool)
        if i % 3:  # some images without defects
            y, x = rng.integers(0, shape[0] - 8), rng.integers(0, shape[1] - 8)
            g[y : y + rng.integers(2, 8), x : x + rng.integers(2, 8)] = True
            m[g] += rng.uniform(0.02, 0.3)  # defects score higher, overlapping the background
        v = np.ones(shape, dtype=bool)
        v[:, : rng.integers(0, 10)] = False
        maps.append(m), masks.append(g), valid.append(v)
    return maps, masks, valid


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("region", [False, True])
def test_exact_while_every_pixel_is_kept(seed, region):
    maps, masks, valid = _set(seed)
    acc = PixelMetrics()
    for i in range(len(maps)):
        acc.add(maps[i], masks[i], valid[i] if region else None)
    v = valid if region else None
    assert acc.exact
    assert acc.pixel_auroc() == pixel_auroc(np.stack(maps), np.stack(masks), v)
    assert acc.pro() == pro_score(np.stack(maps), np.stack(masks), valid=v)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("region", [False, True])
def test_binned_within_its_stated_bound(seed, region):
    maps, masks, valid = _set(seed)
    acc = PixelMetrics(exact_pixels=5000)  # binned after the first few images: the kept ones are binned too
    for i in range(len(maps)):
        acc.add(maps[i], masks[i], valid[i] if region else None)
    v = valid if region else None
    assert not acc.exact
    exact_auroc = pixel_auroc(np.stack(maps), np.stack(masks), v)
    bound = acc.auroc_error_bound()
    assert 0 <= bound < 1e-3
    assert abs(acc.pixel_auroc() - exact_auroc) <= bound + 1e-12
    assert abs(acc.pro() - pro_score(np.stack(maps), np.stack(masks), valid=v)) < 1e-3


def test_coarse_bins_move_the_result_and_the_bound_says_so():
    """With few bins the binned AUROC is off the exact one, and the stated bound covers it: the bound is
    a real one, not a constant."""
    maps, masks, _ = _set(4)
    acc = PixelMetrics(exact_pixels=0, bins=64)
    for m, g in zip(maps, masks, strict=True):
        acc.add(m, g)
    exact = pixel_auroc(np.stack(maps), np.stack(masks))
    assert acc.pixel_auroc() != exact
    assert abs(acc.pixel_auroc() - exact) <= acc.auroc_error_bound()


def test_refusals_are_clear():
    acc = PixelMetrics()
    with pytest.raises(ValueError, match="2-D of one shape"):
        acc.add(np.zeros((4, 4)), np.zeros((4, 5)))
    with pytest.raises(ValueError, match="NaN"):
        acc.add(np.full((4, 4), np.nan), np.zeros((4, 4)))
    acc.add(np.zeros((4, 4)), np.zeros((4, 4)))
    with pytest.raises(ValueError, match="without ground-truth regions"):
        acc.pro()

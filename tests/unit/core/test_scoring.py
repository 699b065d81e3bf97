"""Blur, image scores and threshold calibration against scipy / numpy / literal loops."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from reference_impls import calibrate
from scipy.ndimage import gaussian_filter

from hetmm_ray.core.scoring import Calibration, gaussian_blur, gaussian_kernel, image_scores


def random_maps(b: int, h: int, w: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, h, w, generator=g, dtype=torch.float64).to(dtype)


def scipy_blur(maps: torch.Tensor, sigma: float, **kw) -> np.ndarray:
    """scipy 'mirror' (d c b | a b c d | c b a) is torch's 'reflect'."""
    x = maps.double().numpy()
    return np.stack([gaussian_filter(m, sigma, mode="mirror", **kw) for m in x])


# --- kernel ----------------------------------------------------------------------------
@pytest.mark.parametrize("sigma", [0.3, 0.5, 1.0, 1.3, 2.0, 4.0, 6.8])
def test_kernel_size_sum_and_shape(sigma):
    k = gaussian_kernel(sigma)
    radius = math.ceil(4 * sigma)
    assert k.shape == (2 * radius + 1,)
    assert k.dtype == torch.float32
    assert float(k.sum()) == pytest.approx(1.0, abs=1e-6)
    # Symmetric, peaked in the middle, decreasing outwards.
    assert torch.allclose(k, k.flip(0))
    assert int(k.argmax()) == radius
    assert bool((k[radius:].diff() < 0).all())
    # Proportional to exp(-x^2 / 2 sigma^2).
    x = np.arange(-radius, radius + 1)
    ref = np.exp(-0.5 * (x / sigma) ** 2)
    np.testing.assert_allclose(k.numpy(), ref / ref.sum(), rtol=1e-5, atol=1e-7)


# --- blur ------------------------------------------------------------------------------
# 4*sigma integral: scipy's truncate=4.0 radius int(4*sigma + 0.5) equals ceil(4*sigma).
@pytest.mark.parametrize(("sigma", "h", "w"), [(0.5, 9, 11), (1.0, 12, 10), (2.0, 17, 20), (4.0, 20, 33)])
def test_blur_equals_scipy_mirror_truncate4(sigma, h, w):
    maps = random_maps(3, h, w, seed=int(sigma * 10))
    assert math.ceil(4 * sigma) < min(h, w)
    out = gaussian_blur(maps, sigma)
    assert out.shape == maps.shape
    assert out.dtype == maps.dtype
    np.testing.assert_allclose(out.numpy(), scipy_blur(maps, sigma, truncate=4.0), atol=1e-5)


# Any sigma: the kernel radius is ceil(4*sigma) (scipy's own rounding differs, so pass it).
@pytest.mark.parametrize(("sigma", "h", "w"), [(0.3, 6, 7), (1.3, 15, 9), (2.7, 16, 24), (6.8, 40, 30)])
def test_blur_equals_scipy_mirror_any_sigma(sigma, h, w):
    radius = math.ceil(4 * sigma)
    assert radius < min(h, w)
    maps = random_maps(2, h, w, seed=7)
    out = gaussian_blur(maps, sigma)
    np.testing.assert_allclose(out.numpy(), scipy_blur(maps, sigma, radius=radius), atol=1e-5)


def test_blur_float64_is_exact():
    maps = random_maps(2, 25, 25, seed=3, dtype=torch.float64)
    out = gaussian_blur(maps, 3.0)
    assert out.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), scipy_blur(maps, 3.0, truncate=4.0), atol=1e-6)


def test_blur_is_per_image():
    maps = random_maps(4, 14, 14, seed=11)
    together = gaussian_blur(maps, 1.5)
    for i in range(4):
        assert torch.allclose(together[i], gaussian_blur(maps[i : i + 1], 1.5)[0], atol=1e-6)


def test_blur_preserves_constants_and_mass_at_the_centre():
    const = torch.full((1, 20, 20), 0.37)
    assert torch.allclose(gaussian_blur(const, 2.0), const, atol=1e-6)
    # A centred impulse spreads into exactly the outer product of the 1-D kernel.
    imp = torch.zeros(1, 21, 21)
    imp[0, 10, 10] = 1.0
    k = gaussian_kernel(1.0)  # radius 4, fits without touching the border
    out = gaussian_blur(imp, 1.0)[0]
    ref = torch.zeros(21, 21)
    ref[6:15, 6:15] = torch.outer(k, k)
    assert torch.allclose(out, ref, atol=1e-7)


@pytest.mark.parametrize("sigma", [0, 0.0, -1.0])
def test_sigma_zero_is_identity(sigma):
    maps = random_maps(2, 8, 8)
    out = gaussian_blur(maps, sigma)
    assert torch.equal(out, maps)


def test_blur_of_maps_smaller_than_the_kernel():
    # radius 16 >= 5: reflect padding is impossible; the result must still be a
    # finite weighted average of the input (kernel weights sum to 1).
    maps = random_maps(2, 5, 7, seed=5)
    out = gaussian_blur(maps, 4.0)
    assert out.shape == maps.shape
    assert torch.isfinite(out).all()
    for i in range(2):
        assert float(out[i].min()) >= float(maps[i].min()) - 1e-6
        assert float(out[i].max()) <= float(maps[i].max()) + 1e-6


# --- image scores ----------------------------------------------------------------------------
@pytest.mark.parametrize("sigma", [0.0, 1.0, 2.5])
def test_image_scores_is_max_of_blurred_map(sigma):
    maps = random_maps(5, 16, 18, seed=2)
    s = image_scores(maps, sigma)
    assert s.shape == (5,)
    if sigma == 0:
        ref = maps.double().numpy().reshape(5, -1).max(axis=1)
    else:
        ref = scipy_blur(maps, sigma, radius=math.ceil(4 * sigma)).reshape(5, -1).max(axis=1)
    np.testing.assert_allclose(s.numpy(), ref, atol=1e-5)


def test_image_scores_rank_a_bump_above_flat_maps():
    maps = torch.zeros(2, 32, 32)
    maps[1, 10:14, 20:24] = 1.0
    s = image_scores(maps, 2.0)
    assert float(s[0]) == pytest.approx(0.0, abs=1e-7)
    assert 0 < float(s[1]) < 1.0


# --- calibration -----------------------------------------------------------------------------
class Recorder:
    """A fake fold scorer: records calls, returns a known score per image index."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], list[int]]] = []

    def __call__(self, held: list[int], kept: list[int]) -> list[float]:
        self.calls.append((list(held), list(kept)))
        return [float(i) * 0.5 + 1.0 for i in held]


@pytest.mark.parametrize(
    ("n", "folds", "max_images"),
    [(10, 5, 50), (10, 3, 10), (20, 4, 6), (7, 2, 2), (5, 10, 50), (3, 2, 3), (50, 5, 13)],
)
def test_calibrate_folds(n, folds, max_images):
    rec = Recorder()
    cal = calibrate(n, folds=folds, max_images=max_images, seed=0, score_fold=rec)
    held_all = [i for held, _ in rec.calls for i in held]
    m = min(n, max_images)
    # Exactly min(n, max_images) distinct images are scored, each exactly once.
    assert len(held_all) == m
    assert len(set(held_all)) == m
    assert all(0 <= i < n for i in held_all)
    assert len(rec.calls) == min(folds, m)
    for held, kept in rec.calls:
        assert held, "empty fold"
        assert held == sorted(held)
        # kept is every training image that is not held out (never a held one).
        assert not set(held) & set(kept)
        assert sorted(kept) == [i for i in range(n) if i not in set(held)]
    # Fold sizes differ by at most one.
    sizes = [len(h) for h, _ in rec.calls]
    assert max(sizes) - min(sizes) <= 1
    # The scores are what the scorer returned, in call order.
    assert cal.scores == tuple(float(i) * 0.5 + 1.0 for i in held_all)


def test_calibrate_is_seeded():
    a, b, c = Recorder(), Recorder(), Recorder()
    cal_a = calibrate(30, folds=3, max_images=9, seed=42, score_fold=a)
    cal_b = calibrate(30, folds=3, max_images=9, seed=42, score_fold=b)
    calibrate(30, folds=3, max_images=9, seed=43, score_fold=c)
    assert a.calls == b.calls
    assert cal_a == cal_b
    chosen = lambda r: sorted(i for held, _ in r.calls for i in held)  # noqa: E731
    assert chosen(a) != chosen(c)


def test_calibrate_does_not_touch_the_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    calibrate(10, folds=2, max_images=10, seed=0, score_fold=Recorder())
    assert torch.equal(torch.rand(3), expected)


def test_calibrate_needs_two_images():
    with pytest.raises(ValueError, match="at least 2"):
        calibrate(1, folds=2, max_images=5, seed=0, score_fold=Recorder())


def test_calibrate_accepts_tensor_scores():
    cal = calibrate(6, folds=2, max_images=6, seed=0, score_fold=lambda held, kept: torch.ones(len(held)))
    assert cal.scores == (1.0,) * 6
    assert all(type(s) is float for s in cal.scores)


@pytest.mark.parametrize("sigmas", [0.0, 1.0, 3.0, 2.5])
def test_threshold_is_mean_plus_k_sample_std(sigmas):
    rng = np.random.default_rng(0)
    scores = tuple(float(x) for x in rng.normal(0.2, 0.05, size=17))
    cal = Calibration(scores)
    arr = np.array(scores)
    assert cal.mean == pytest.approx(arr.mean(), rel=1e-12)
    assert cal.std == pytest.approx(arr.std(ddof=1), rel=1e-12)
    assert cal.threshold(sigmas) == pytest.approx(arr.mean() + sigmas * arr.std(ddof=1), rel=1e-12)


def test_threshold_of_identical_scores_is_their_value():
    cal = Calibration((0.25, 0.25, 0.25))
    assert cal.std == 0.0
    assert cal.threshold(3.0) == pytest.approx(0.25)
    assert Calibration((0.4,)).threshold(3.0) == pytest.approx(0.4)

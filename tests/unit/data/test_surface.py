"""The synthetic line frame (data/surface.py): stated frame size, defects of stated pixel sizes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hetmm_ray.data.mvtec import MVTecCategory
from hetmm_ray.data.surface import SURFACE_DEFECTS, SurfaceDefects, SyntheticSurface, write_surface_layout


def _area_downscale(image: np.ndarray, factor: int) -> np.ndarray:
    """Mean over factor x factor blocks: what an area resize to the canvas keeps of the frame."""
    g = image[..., 0].astype(np.float64)
    h, w = (g.shape[0] // factor) * factor, (g.shape[1] // factor) * factor
    return g[:h, :w].reshape(h // factor, factor, w // factor, factor).mean(axis=(1, 3))


def test_frames_have_the_stated_size_and_differ_from_part_to_part():
    s = SyntheticSurface(height=300, width=500, seed=3)
    a, b = s.good(0), s.good(1)
    assert a.shape == (300, 500, 3) and a.dtype == np.uint8
    assert np.array_equal(a, SyntheticSurface(height=300, width=500, seed=3).good(0))  # deterministic
    assert np.abs(a.astype(int) - b.astype(int)).mean() > 3  # the texture varies between parts


@pytest.mark.parametrize("kind", SURFACE_DEFECTS)
def test_a_defect_changes_only_its_own_pixels_and_has_its_stated_size(kind: str):
    defects = SurfaceDefects(scratch_width_px=(1.0, 2.0), scratch_length_px=(60.0, 60.0), pit_px=(6.0, 6.0))
    s = SyntheticSurface(height=512, width=768, seed=1, defects=defects)
    for index in range(4):
        good, (bad, mask) = s.good(index), s.defective(index, kind)
        changed = np.abs(bad.astype(int) - good.astype(int)).max(axis=2) > 0
        grown = mask.copy()
        for _ in range(4):  # the rim and antialiasing reach a few pixels past the mask
            grown = grown | np.roll(grown, 1, 0) | np.roll(grown, -1, 0) | np.roll(grown, 1, 1) | np.roll(grown, -1, 1)
        assert changed.any() and not (changed & ~grown).any()
        area = int(mask.sum())
        if kind == "pit":
            assert abs(area - math.pi * 9) <= 12  # a 6-px disc: 28 px
        else:
            assert 60 * 0.5 <= area <= 60 * 2.5 + 10  # 60 px long, 1-2 px wide
        # plain at the frame's own scale...
        assert np.abs(bad[mask, 0].astype(float) - good[mask, 0]).mean() >= 15


def _neighbour_correlation(image: np.ndarray, axis: int) -> float:
    g = image[..., 0].astype(np.float64)
    a, b = (g[:-1], g[1:]) if axis == 0 else (g[:, :-1], g[:, 1:])
    return float(np.corrcoef(a.ravel(), b.ravel())[0, 1])


def test_the_texture_runs_along_the_rows_by_default_and_has_no_direction_as_a_mottle():
    def frame(**texture: int) -> np.ndarray:
        return SyntheticSurface(height=256, width=256, seed=2, shading=0, **texture).good(0)

    streaks, mottle, grain = frame(), frame(brush_px=1, grain_px=8), frame(brush_px=1)
    assert _neighbour_correlation(streaks, 1) > 0.8 and _neighbour_correlation(streaks, 0) < 0.5  # streaks
    assert min(_neighbour_correlation(mottle, 0), _neighbour_correlation(mottle, 1)) > 0.7  # 8-px grains
    assert max(_neighbour_correlation(grain, 0), _neighbour_correlation(grain, 1)) < 0.5  # per-pixel grain
    # round grains: as correlated along a diagonal as along the rows and columns at the same distance
    g = mottle[..., 0].astype(np.float64)
    d = 4
    along = np.corrcoef(g[:, :-d].ravel(), g[:, d:].ravel())[0, 1]
    diagonal = np.corrcoef(g[:-3, :-3].ravel(), g[3:, 3:].ravel())[0, 1]  # 3 * sqrt(2) = 4.24 px away
    assert abs(along - diagonal) < 0.08
    # the texture keeps its strength whatever its grain (renormalised; no shading here)
    assert 0.5 < mottle[..., 0].std() / streaks[..., 0].std() < 2.0


def test_a_hairline_is_faint_once_the_frame_is_squeezed_to_one_canvas():
    s = SyntheticSurface(height=2048, width=2048, seed=0)
    good, (bad, mask) = s.good(5), s.defective(5, "scratch")
    full_scale = np.abs(bad[mask, 0].astype(float) - good[mask, 0]).mean()
    canvas = np.abs(_area_downscale(bad, 8) - _area_downscale(good, 8)).max()
    assert full_scale >= 20 and canvas <= full_scale / 4


def test_the_layout_is_an_mvtec_category(tmp_path: Path):
    root = write_surface_layout(tmp_path / "line", height=64, width=96, n_train=3, n_test_good=2, n_test_per_defect=2)
    cat = MVTecCategory(root)
    samples = cat.measurable_samples()
    assert len(cat.train_paths()) == 3 and cat.has_pixel_masks
    assert sorted({s.defect_type for s in samples}) == ["good", *sorted(SURFACE_DEFECTS)]
    with Image.open(samples[0].path) as im:
        assert im.size == (96, 64)
    bad = SurfaceDefects
    with pytest.raises(ValueError, match="pit_px"):
        bad(pit_px=(8.0, 5.0))


def test_a_drawn_scratch_is_where_and_as_its_record_says():
    """``defect`` records the defect ``defective`` draws: the mask's pixels lie on the recorded
    segment, along its direction, and the frame moves by its signed contrast there."""
    s = SyntheticSurface(height=400, width=400, seed=2)
    for index in range(6):
        d = s.defect(index, "scratch")
        good, (bad, mask) = s.good(index), s.defective(index, "scratch")
        ys, xs = np.nonzero(mask)
        along = (xs + 0.5 - d.cx) * math.cos(d.direction) + (ys + 0.5 - d.cy) * math.sin(d.direction)
        across = -(xs + 0.5 - d.cx) * math.sin(d.direction) + (ys + 0.5 - d.cy) * math.cos(d.direction)
        assert np.abs(across).max() <= d.size_px / 2 + 1.5
        assert np.abs(along).max() <= d.length_px / 2 + d.size_px + 1.5
        assert along.max() - along.min() >= d.length_px - 3
        step = bad[mask, 0].astype(float) - good[mask, 0]
        assert np.sign(step.mean()) == np.sign(d.contrast) and abs(step.mean()) >= 0.5 * abs(d.contrast)
        assert 0 <= d.degrees_from_brushing <= 90
    pit = s.defect(3, "pit")
    assert pit.size_px == pit.length_px and 5 <= pit.size_px <= 8 and pit.contrast != 0
    with pytest.raises(ValueError, match="unknown surface defect"):
        s.defect(0, "dent")


def test_a_layout_of_scratches_only(tmp_path: Path):
    root = write_surface_layout(
        tmp_path / "s", height=48, width=48, n_train=2, n_test_good=1, n_test_per_defect=2, kinds=("scratch",)
    )
    assert sorted(p.name for p in (root / "test").iterdir()) == ["good", "scratch"]
    with pytest.raises(ValueError, match="kinds"):
        write_surface_layout(tmp_path / "t", height=48, width=48, kinds=("dent",))

"""The synthetic cracked product (data/cracks.py): elongated frames, curved thin cracks of stated
sizes, masks around them, benign marks on a stated share of good frames, the MVTec layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image
from scipy import ndimage

from hetmm_ray.data.cracks import CrackDefects, CrackedSurface, marked_goods, write_crack_layout
from hetmm_ray.data.mvtec import MVTecCategory


def _turning(points: np.ndarray) -> float:
    """Total absolute heading change along a polyline, degrees (0: straight)."""
    d = np.diff(points, axis=0)
    heading = np.unwrap(np.arctan2(d[:, 0], d[:, 1]))
    return float(np.degrees(np.abs(np.diff(heading)).sum()))


def test_cracks_are_thin_long_curved_faint_and_change_only_their_own_pixels():
    s = CrackedSurface(height=1250, width=500, seed=2)
    widths, lengths = [], []
    for index in range(6):
        crack = s.crack(index)
        good, (bad, mask) = s.good(index), s.cracked(index)
        assert good.shape == bad.shape == (1250, 500, 3) and mask.shape == (1250, 500)
        # the polyline is as long as stated and inside the frame
        arc = float(np.hypot(*np.diff(crack.points, axis=0).T).sum())
        assert abs(arc - crack.length_px) < 1e-6 * crack.length_px + 1e-6
        assert 100 <= crack.length_px <= 400 and 2 <= crack.width_px <= 4
        assert (crack.points >= 0).all() and (crack.points[:, 0] < 1250).all() and (crack.points[:, 1] < 500).all()
        assert _turning(crack.points) > 10  # curved, not a straight scratch
        # dark where it covers, nothing changed outside the mask
        changed = np.abs(bad.astype(int) - good.astype(int)).max(axis=2) > 0
        assert changed.any() and not (changed & ~mask).any()
        core = s.coverage(crack) >= 0.99
        assert (good[core, 0].astype(float) - bad[core, 0]).mean() >= 0.8 * 10  # darker by its contrast
        # a thin band: the mask's area is about length x (width + 2 margins)
        area = int(mask.sum())
        assert 0.5 * crack.length_px * crack.width_px <= area <= crack.length_px * (crack.width_px + 6) + 200
        widths.append(crack.width_px)
        lengths.append(crack.length_px)
    assert len(set(np.round(lengths))) == 6  # each part its own crack


def test_the_contrast_is_what_it_is_set_to():
    faint = CrackedSurface(height=400, width=200, seed=0, defects=CrackDefects(contrast=(4.0, 4.0)))
    plain = CrackedSurface(height=400, width=200, seed=0, defects=CrackDefects(contrast=(20.0, 20.0)))
    assert faint.crack(3).contrast == 4.0 and plain.crack(3).contrast == 20.0
    core = faint.coverage(faint.crack(3)) >= 0.99
    drop = [(s.good(3)[core, 0].astype(float) - s.cracked(3)[0][core, 0]).mean() for s in (faint, plain)]
    assert abs(drop[0] - 4.0) < 1.5 and abs(drop[1] - 20.0) < 1.5


def test_the_grain_has_no_direction():
    g = CrackedSurface(height=512, width=512, seed=1, grain_px=4).good(0)[..., 0].astype(float)
    g = g - ndimage.uniform_filter(g, 33)  # without the shading's gradient
    rows = np.corrcoef(g[:, :-2].ravel(), g[:, 2:].ravel())[0, 1]
    cols = np.corrcoef(g[:-2].ravel(), g[2:].ravel())[0, 1]
    assert rows > 0.3 and abs(rows - cols) < 0.05


def test_marks_are_on_the_stated_share_of_goods_and_never_in_a_cracked_frame():
    assert marked_goods(60, 0.02) == [30] and marked_goods(278, 0.02) == [23, 69, 115, 162, 208, 254]
    assert marked_goods(30, 0.02) == [15] and marked_goods(10, 0.0) == []
    s = CrackedSurface(height=300, width=120, seed=4)
    plain, marked = s.good(7), s.good(7, marked=True)
    stain = np.abs(marked.astype(int) - plain.astype(int)).max(axis=2) > 0
    assert 100 <= stain.sum() <= 300 * 120 / 4  # a blob 20-40 px across, not the whole frame
    assert np.array_equal(marked, s.good(7, marked=True))  # deterministic
    bad, mask = s.cracked(7)
    assert not (np.abs(bad.astype(int) - plain.astype(int)).max(axis=2) > 0)[~mask].any()  # no stain


def test_the_layout_is_what_evaluate_reads(tmp_path: Path):
    root = write_crack_layout(tmp_path / "cracks", height=200, width=80, n_train=50, n_test_good=10, n_test_cracked=3)
    cat = MVTecCategory(root)
    assert len(cat.train_paths()) == 50 and len(cat.test_samples()) == 13 and cat.defect_types() == ["crack"]
    assert cat.has_pixel_masks
    masks = sorted((root / "ground_truth" / "crack").glob("*_mask.png"))
    assert len(masks) == 3 and all(np.asarray(Image.open(m)).max() == 255 for m in masks)
    first = np.asarray(Image.open(root / "train" / "good" / "000.png"))
    assert first.shape == (200, 80, 3) and (first[..., 0] == first[..., 1]).all()  # grey
    # exactly the marked goods differ from the plain surface of their part
    s = CrackedSurface(height=200, width=80)
    differs = [
        not np.array_equal(np.asarray(Image.open(root / "train" / "good" / f"{i:03d}.png")), s.good(i))
        for i in range(50)
    ]
    assert [i for i, d in enumerate(differs) if d] == marked_goods(50, 0.02)

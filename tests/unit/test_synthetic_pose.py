"""The synthetic product's poses (``data/synthetic.py``): ``fixed`` (a part in a fixture, the
images every earlier test and benchmark used) and ``varied`` (any turn, a larger shift)."""

from __future__ import annotations

import numpy as np
import pytest

from hetmm_ray.data.synthetic import SyntheticProduct, write_mvtec_layout


def _label_centre(image: np.ndarray) -> np.ndarray:
    """Centre of the blue label's pixels (blue well above red)."""
    rgb = image.astype(np.int16)
    ys, xs = np.nonzero(rgb[..., 2] - rgb[..., 0] > 60)
    return np.array([ys.mean(), xs.mean()])


def test_varied_poses_turn_the_part_and_fixed_ones_do_not() -> None:
    size = 128
    fixed = SyntheticProduct(size=size)
    varied = SyntheticProduct(size=size, pose="varied")
    centre = (size - 1) / 2
    angles = {
        name: [np.degrees(np.arctan2(*(_label_centre(p.good(i)) - centre))) for i in range(12)]
        for name, p in (("fixed", fixed), ("varied", varied))
    }
    assert np.ptp(angles["fixed"]) < 10  # the label stays above the bore (turns of 2 degrees)
    assert np.ptp(angles["varied"]) > 120  # it goes round
    assert np.array_equal(varied.good(3), SyntheticProduct(size=size, pose="varied").good(3))  # deterministic
    image, mask = varied.defective(5, "hole")
    assert mask.any() and image.shape == (size, size, 3)


def test_bad_poses_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="pose must be one of fixed, varied"):
        SyntheticProduct(pose="tilted")
    with pytest.raises(ValueError, match="printed_code needs pose='fixed'"):
        SyntheticProduct(pose="varied", printed_code=True)
    root = write_mvtec_layout(tmp_path / "v", n_train=2, n_test_good=1, n_test_per_defect=1, size=64, pose="varied")
    assert len(list((root / "train" / "good").glob("*.png"))) == 2

"""``scoring.score_top_k`` (core/scoring.py ``image_scores``): the image score as the mean of the k
highest pixels of the blurred map, checked against the rule written out with scipy and numpy, on
whole maps, letterbox content boxes and inspection regions; k 1 is the maximum bit for bit; the
setting reaches the detector's scores, its out-of-fold calibration and a tiled product's positions;
the fit chooses it when it is unset (bounded by a stated smallest defect's area).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.ndimage import gaussian_filter

from hetmm_ray.config import SCORE_TOP_K, BackboneConfig, ConfigError, DetectorConfig, ScoringConfig, ThresholdConfig
from hetmm_ray.config.detector import stored_config
from hetmm_ray.core.geometry import Box
from hetmm_ray.core.scoring import image_scores, top_mean
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.geometry_rule import choose_geometry

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def reference_scores(
    maps: np.ndarray, sigma: float, k: int, boxes: list[Box] | None = None, regions: list[np.ndarray] | None = None
) -> np.ndarray:
    """The rule written out: outside the content box (and the region) set to 0, a Gaussian blur
    (mirror padding, truncated at 4 sigma), then the mean of the k highest counted pixels."""
    out = []
    for i, m in enumerate(maps.astype(np.float64)):
        box = boxes[i] if boxes is not None else Box(0, 0, m.shape[0], m.shape[1])
        counted = np.zeros(m.shape, dtype=bool)
        inside = np.ones((box.height, box.width), dtype=bool) if regions is None else regions[i]
        counted[box.top : box.top + box.height, box.left : box.left + box.width] = inside
        blurred = gaussian_filter(np.where(counted, m, 0.0), sigma, mode="mirror", radius=math.ceil(4 * sigma))
        values = np.sort(blurred[counted])[::-1]
        out.append(values[: min(k, values.size)].mean() if values.size else 0.0)
    return np.array(out)


@pytest.mark.parametrize("k", [1, 7, 200, 5000])
def test_the_score_is_the_mean_of_the_k_highest_blurred_pixels(k: int) -> None:
    rng = np.random.default_rng(k)
    maps = rng.random((3, 40, 48)).astype(np.float32)
    got = image_scores(torch.from_numpy(maps), 2.0, top_k=k).numpy()
    np.testing.assert_allclose(got, reference_scores(maps, 2.0, k), rtol=1e-5)
    boxes = [Box(8, 0, 24, 48), Box(0, 6, 40, 30), Box(0, 0, 40, 48)]
    got = image_scores(torch.from_numpy(maps), 2.0, boxes, top_k=k).numpy()
    np.testing.assert_allclose(got, reference_scores(maps, 2.0, k, boxes), rtol=1e-5)
    regions = [rng.random((b.height, b.width)) < 0.6 for b in boxes]
    got = image_scores(torch.from_numpy(maps), 2.0, boxes, [torch.from_numpy(r) for r in regions], top_k=k).numpy()
    np.testing.assert_allclose(got, reference_scores(maps, 2.0, k, boxes, regions), rtol=1e-5)


def test_k_1_is_the_maximum_bit_for_bit_and_a_long_line_outscores_a_spot_of_its_strength() -> None:
    torch.manual_seed(0)
    maps = torch.rand(2, 64, 64) * 0.1
    assert torch.equal(image_scores(maps, 4.0, top_k=1), image_scores(maps, 4.0))
    assert torch.equal(top_mean(maps.flatten(1), 1), maps.flatten(1).amax(dim=1))
    line, spot = maps.clone(), maps.clone()
    line[:, 32, 4:60] = 2.0  # a thin line 56 px long
    spot[:, 31:33, 31:33] = 8.0  # a spot with a higher maximum after the blur
    assert (image_scores(spot, 4.0) > image_scores(line, 4.0)).all()
    assert (image_scores(line, 4.0, top_k=200) > image_scores(spot, 4.0, top_k=200)).all()
    with pytest.raises(ValueError, match="top_k"):
        image_scores(maps, 4.0, top_k=0)


def test_the_setting_is_validated() -> None:
    with pytest.raises(ConfigError, match="score_top_k"):
        DetectorConfig().replace(**{"scoring.score_top_k": 0})
    assert DetectorConfig().replace(**{"scoring.score_top_k": 300}).scoring.score_top_k == 300


def tiny_config(**changes) -> DetectorConfig:
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=64, layers=("layer2", "layer3")),
        scoring=ScoringConfig(forward_windows=(3, 3), backward_windows=(3, 3), alphas=(0.5, 0.5), layer_weights=(1, 1)),
        threshold=ThresholdConfig(folds=3),
        batch_size=8,
        device="cpu",
    )
    return config.replace(**changes) if changes else config


@pytest.mark.parametrize("tiles", [None, [2, 1]])
def test_the_detector_scores_and_calibrates_with_k(tiles: list[int] | None) -> None:
    """The same product at k 1 and k 50: each prediction is its maps' rule (a canvas product's maps
    are the scored maps, map_sigma 0), and the out-of-fold scores change with k, so the threshold is
    read off scores of the same rule."""
    from hetmm_ray.detection.detector_choice import new_detector

    product = SyntheticProduct(size=64, seed=3)
    train = [product.good(i) for i in range(8)]
    query = [product.good(20), product.defective(21, "scratch")[0]]
    changes = {} if tiles is None else {"geometry.tiles": tiles, "geometry.tile_whole_view": False}
    fitted = {}
    for k in (1, 50):
        config = tiny_config(**{"scoring.score_top_k": k, **changes})
        det = new_detector(config, train) if tiles else HETMM(config)
        det.fit(train)
        pred = det.predict(query)
        fitted[k] = (pred, det.calibration.scores)
        if tiles is None:
            maps = np.stack([np.asarray(m) for m in pred.maps])
            np.testing.assert_allclose(pred.scores, reference_scores(maps, 4.0, k), rtol=1e-4)
    assert not np.allclose(fitted[1][1], fitted[50][1])
    assert not np.allclose(fitted[1][0].scores, fitted[50][0].scores)
    if tiles is None:  # a tiled frame's positions are each normalised by their own out-of-fold scale
        assert (fitted[50][0].scores <= fitted[1][0].scores + 1e-6).all()  # a mean of the top is at most the max


def test_the_fit_chooses_k_and_a_stated_smallest_defect_bounds_it() -> None:
    """Unset, ``score_top_k`` is chosen by the fit's one rule: ``SCORE_TOP_K`` on a 256-px canvas and
    the same share of another canvas's pixels (of the canvas as given: an elongated frame's aspect
    canvas gives its short side that size), or with ``min_defect_px`` a disc of that diameter's area
    on the map (written out here); a value given is kept; a resolved configuration resolves to itself;
    a stored product without the key reads 1."""
    square = [np.zeros((256, 256, 3), np.uint8)] * 2
    base = DetectorConfig()
    assert base.scoring.score_top_k is None and base.score_pixels == SCORE_TOP_K
    assert choose_geometry(base, square).config.scoring.score_top_k == SCORE_TOP_K
    tall = [np.zeros((1250, 500, 3), np.uint8)] * 2
    elongated = choose_geometry(base, tall).config
    assert elongated.backbone.image_size == 640 and elongated.scoring.score_top_k == SCORE_TOP_K
    small = base.replace(**{"backbone.image_size": 64})
    assert choose_geometry(small, square).config.scoring.score_top_k == round(SCORE_TOP_K / 16) == 62
    mapped = base.replace(**{"scoring.output_size": 128})
    assert choose_geometry(mapped, square).config.scoring.score_top_k == SCORE_TOP_K // 4
    # one canvas px per frame px (256 on 256): a 16-px defect covers pi / 4 * 16^2 = 201 map px
    chosen = choose_geometry(base.replace(**{"geometry.min_defect_px": 16}), square)
    assert chosen.tiles == (1, 1) and chosen.config.scoring.score_top_k == round(math.pi / 4 * 16 * 16) == 201
    assert "the score averages its top 201 map px (a 16-px defect's area)" in chosen.describe()
    assert choose_geometry(chosen.config, square).config == chosen.config
    # a 512-px frame on a 256 canvas (half a canvas px per frame px), the map at 128 px: a quarter
    wide = [np.zeros((512, 512, 3), np.uint8)] * 2
    halved = base.replace(**{"geometry.min_defect_px": 32, "scoring.output_size": 128})
    assert choose_geometry(halved, wide).config.scoring.score_top_k == round(math.pi / 4 * (32 / 2 / 2) ** 2) == 50
    given = base.replace(**{"geometry.min_defect_px": 16, "scoring.score_top_k": 7})
    assert choose_geometry(given, square).config.scoring.score_top_k == 7
    assert stored_config({"scoring": {"score_sigma": 4.0}}).scoring.score_top_k == 1
    assert stored_config(chosen.config.stored_dict()).scoring.score_top_k == 201

"""An inspection region in scoring (core/scoring.py, scorer.py, fitting.py): pixels outside never
count, the arithmetic without a region is unchanged, stored products without one load and score
bit for bit, and the out-of-fold calibration goes through the same path.

Small random resnet18 on the CPU; the claims do not depend on real weights.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hetmm_ray.config import BackboneConfig, DetectorConfig, ScoringConfig, ThresholdConfig
from hetmm_ray.core.calibration import fold_plan
from hetmm_ray.core.geometry import Box
from hetmm_ray.core.region import map_masks
from hetmm_ray.core.scoring import _blurred_content, content_maps, gaussian_blur, image_scores
from hetmm_ray.core.templates import TemplateSet
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.store import open_store
from hetmm_ray.visualize import heatmap_overlay

SIZE = 64


def tiny_config(**changes) -> DetectorConfig:
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE, layers=("layer2", "layer3")),
        scoring=ScoringConfig(forward_windows=(3, 3), backward_windows=(3, 3), alphas=(0.5, 0.5), layer_weights=(1, 1)),
        threshold=ThresholdConfig(folds=3),
        batch_size=8,
        device="cpu",
    )
    return config.replace(**changes) if changes else config


# --- core.scoring ---------------------------------------------------------------------------
def test_whole_frame_region_is_bit_identical() -> None:
    torch.manual_seed(0)
    maps = torch.rand(3, 32, 32)
    full = [torch.ones(32, 32, dtype=torch.bool)] * 3
    assert torch.equal(image_scores(maps, 2.0, None, full), image_scores(maps, 2.0))
    boxes = [Box(8, 0, 16, 32), Box(0, 4, 32, 20), Box(0, 0, 32, 32)]
    regions = [torch.ones(b.height, b.width, dtype=torch.bool) for b in boxes]
    assert torch.equal(image_scores(maps, 2.0, boxes, regions), image_scores(maps, 2.0, boxes))


def test_outside_pixels_are_nothing_there() -> None:
    torch.manual_seed(1)
    maps = torch.rand(2, 32, 32) * 0.1
    maps[:, 4, 4] = 50.0  # a spike outside the region
    region = torch.ones(32, 32, dtype=torch.bool)
    region[:12, :12] = False
    regions = [region, region]
    got = image_scores(maps, 1.5, None, regions)
    # the rule, written out: zero outside, blur, max over the region
    zeroed = torch.where(region, maps, 0.0)
    expected = gaussian_blur(zeroed, 1.5)[:, region].amax(dim=1)
    assert torch.equal(got, expected)
    assert (got < 1.0).all()  # the spike never counts, not even through the blur
    cm = content_maps(maps, 1.5, None, regions)
    assert all(float(c[~region].abs().max()) == 0.0 for c in cm)
    # an empty region scores 0
    empty = torch.zeros(32, 32, dtype=torch.bool)
    assert image_scores(maps, 1.5, None, [empty, region])[0] == 0.0
    # letterbox boxes: the same rule inside the box
    boxes = [Box(8, 0, 16, 32)] * 2
    r = torch.ones(16, 32, dtype=torch.bool)
    r[:, :10] = False
    b = _blurred_content(maps, 1.5, boxes, [r, r])
    assert torch.equal(image_scores(maps, 1.5, boxes, [r, r]), torch.stack([x[r].amax() for x in b]))


# --- the detector ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def coded() -> SyntheticProduct:
    return SyntheticProduct(seed=2, size=SIZE, printed_code=True)


def code_region(product: SyntheticProduct) -> dict:
    return {"size": [product.size, product.size], "include": [], "exclude": [{"rect": product.code_region()}]}


def test_excluding_the_code_lowers_good_scores_and_the_threshold(coded) -> None:
    good = [coded.good(i) for i in range(12)]
    fresh = [coded.good(100 + i) for i in range(6)]
    plain = HETMM(tiny_config()).fit(good)
    ruled = HETMM(tiny_config(region=code_region(coded))).fit(good)
    assert ruled.templates.config.region == code_region(coded)
    assert ruled.predict(fresh).threshold < plain.predict(fresh).threshold
    assert np.mean(ruled.templates.calibration.scores) < np.mean(plain.templates.calibration.scores)
    assert ruled.predict(fresh).scores.mean() < plain.predict(fresh).scores.mean()


def test_out_of_fold_scores_respect_the_region(coded) -> None:
    """The calibration's scores are exactly the fold-wise maps scored with the region's masks."""
    config = tiny_config(region=code_region(coded))
    det = HETMM(config).fit([coded.good(i) for i in range(9)])
    ts = det.templates
    sc, scorer = config.scoring, det.scorer
    expected: dict[int, float] = {}
    for held in fold_plan(9, folds=3, max_images=config.threshold.max_images, seed=0, keys=ts.image_digests):
        kept = [i for i in range(9) if i not in held]
        fold = TemplateSet(
            bank={k: v[kept] for k, v in ts.bank.items()},
            config=ts.config,
            weights_id=ts.weights_id,
            image_digests=tuple(ts.image_digests[i] for i in kept),
        )
        maps = scorer.score_maps({k: v[held] for k, v in ts.bank.items()}, scorer.prepare(fold))
        boxes = [Box(0, 0, SIZE, SIZE)] * len(held)
        masks = map_masks(config.region, boxes, canvas=SIZE, out=SIZE, geometry=config.backbone.geometry)
        assert not masks[0].all()  # the code is left out on the map
        ruled = image_scores(maps, sc.score_sigma, boxes, masks, top_k=det.config.score_pixels).tolist()
        expected.update(zip(held, ruled, strict=True))
        without = image_scores(maps, sc.score_sigma, top_k=det.config.score_pixels).tolist()
        assert all(w >= e for w, e in zip(without, ruled, strict=True))
    oof = det.out_of_fold(ts)
    got = oof.by_image()
    assert all(got[i] == expected[i] for i in range(9))


def test_prediction_carries_the_region_and_heatmaps_grey_it(coded) -> None:
    region = code_region(coded)
    det = HETMM(tiny_config(region=region, **{"backbone.geometry": "letterbox"})).fit([coded.good(i) for i in range(6)])
    pred = det.predict([coded.good(50)])
    assert pred.regions is not None and pred.regions.shape == pred.maps.shape
    assert not pred.regions[0].all() and pred.regions[0].any()
    assert float(np.abs(pred.maps[0][~pred.regions[0]]).max()) == 0.0
    image = coded.good(50)
    shown = heatmap_overlay(image, pred.maps[0], vmin=0, vmax=1, region=pred.regions[0])
    plain = heatmap_overlay(image, pred.maps[0], vmin=0, vmax=1)
    x0, y0, x1, y1 = (int(v) for v in coded.code_region())
    inside_code = shown[y0 + 2 : y1 - 2, x0 + 2 : x1 - 2]
    assert (inside_code.max(axis=2) - inside_code.min(axis=2) <= 1).all()  # grey: no heat colour
    assert np.array_equal(shown[:4, :4], plain[:4, :4])  # inside the region: as before


def test_products_without_a_region_store_and_score_as_before(tmp_path, coded) -> None:
    good = [coded.good(i) for i in range(6)]
    det = HETMM(tiny_config()).fit(good)
    assert "region" not in det.config.to_dict() and "region" not in det.templates.config.stored_dict()
    before = det.predict([coded.good(40), coded.good(41)])
    store = open_store(tmp_path / "store")
    version = det.save(store, "gear")
    manifests = list((tmp_path / "store").rglob("*.json"))
    assert manifests and not any('"region"' in m.read_text() for m in manifests)  # as every older manifest
    again = load_detector(store, "gear", device="cpu")
    assert again.version == version and again.config.region is None
    after = again.predict([coded.good(40), coded.good(41)])
    assert np.array_equal(before.scores, after.scores) and np.array_equal(before.maps, after.maps)
    assert after.regions is None


def test_a_region_is_stored_with_the_product(tmp_path, coded) -> None:
    region = code_region(coded)
    det = HETMM(tiny_config(region=region)).fit([coded.good(i) for i in range(6)])
    store = open_store(tmp_path / "store")
    det.save(store, "gear")
    again = load_detector(store, "gear", device="cpu")
    assert again.config.region == json.loads(json.dumps(region))
    a, b = det.predict([coded.good(40)]), again.predict([coded.good(40)])
    assert np.array_equal(a.scores, b.scores)


# --- evaluate's pixel metrics -------------------------------------------------------------
def test_pixel_metrics_count_region_pixels_only() -> None:
    from hetmm_ray.core.metrics import pixel_auroc, pro_score, roc_auc

    rng = np.random.default_rng(0)
    maps = rng.random((3, 16, 16))
    masks = np.zeros((3, 16, 16), dtype=bool)
    masks[:, 4:8, 4:8] = True
    valid = np.ones((3, 16, 16), dtype=bool)
    assert pixel_auroc(maps, masks, valid) == pixel_auroc(maps, masks)
    assert pro_score(maps, masks, valid=valid) == pro_score(maps, masks)
    valid[:, :, 10:] = False
    maps[:, :, 10:] = 99.0  # outside: would be false alarms everywhere, but never counts
    assert pixel_auroc(maps, masks, valid) == roc_auc(maps[valid], masks[valid])
    assert pro_score(maps, masks, valid=valid) == pro_score(maps[:, :, :10], masks[:, :, :10])

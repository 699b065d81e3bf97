"""The whole view of a tiled product (``geometry.tile_whole_view``, hetmm_ray/detection/tiled.py "Whole view"):
the whole frame as one more position beside the tiles, against slow obvious implementations (an
untiled product of the frames, a tiled product without it); storage, serving, and tiled products
stored before the setting existed (tests/data/pre_whole_view/, see its make_store.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import tiled_served
from stored_products import RUNTIMES, check_replayed, check_through_backbone, store_copy, test_frames

from hetmm_ray.config import BackboneConfig, ConfigError, DetectorConfig, ThresholdConfig, stored_config
from hetmm_ray.core.calibration import TailModel
from hetmm_ray.core.templates import TemplateError
from hetmm_ray.data.synthetic import DEFECT_KINDS, SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.detection.tiled import TiledHETMM
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FRAME = 128
OLD = Path(__file__).resolve().parents[1] / "data" / "pre_whole_view"


def config(**changes) -> DetectorConfig:
    c = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=64),
        threshold=ThresholdConfig(max_images=6, folds=2),
        batch_size=4,
        device="cpu",
    )
    return c.replace(**changes) if changes else c


def tiled_config(whole: bool, **changes) -> DetectorConfig:
    grid = {"geometry.tiles": [2, 2], "geometry.tile_overlap": 8, "geometry.tile_whole_view": whole}
    return config(**grid, **changes)


@pytest.fixture(scope="module")
def frames():
    prod = SyntheticProduct(seed=3, size=FRAME)
    train = [prod.good(i) for i in range(6)]
    test = [prod.good(100), prod.good(101), *(prod.defective(200 + i, k)[0] for i, k in enumerate(DEFECT_KINDS))]
    return train, test


@pytest.fixture(scope="module")
def pyramid(frames) -> TiledHETMM:
    return TiledHETMM(tiled_config(True)).fit(frames[0])


@pytest.fixture(scope="module")
def tiles_only(frames) -> TiledHETMM:
    return TiledHETMM(tiled_config(False)).fit(frames[0])


def test_the_whole_view_is_the_untiled_product_of_the_frames(pyramid, frames):
    """The last position's set, calibration and scores are a plain HETMM fit on the whole frames
    (same frames' digests, so the same folds), normalised by its own far-1 % threshold."""
    train, test = frames
    assert pyramid.n_tiles == 4 and pyramid.n_positions == 5 and pyramid.whole_view
    ref = HETMM(config()).fit(train)
    mine = pyramid.dets[-1].templates
    assert mine.image_digests == ref.templates.image_digests == pyramid.frame_digests
    for layer in ref.templates.layers:
        assert torch.equal(mine.bank[layer], ref.templates.bank[layer])
    np.testing.assert_allclose(mine.calibration.scores, ref.templates.calibration.scores, rtol=1e-5)
    scale = TailModel(ref.templates.calibration.scores).threshold(0.01)
    assert pyramid.scales[-1] == pytest.approx(scale)
    pred = pyramid.predict(test)
    assert pred.tile_scores.shape == (len(test), 5) and pred.tiles == 4
    np.testing.assert_allclose(pred.tile_scores[:, 4], ref.predict(test).scores / scale, rtol=1e-4)


def test_frame_score_and_calibration_are_the_maximum_over_tiles_and_whole_view(pyramid, tiles_only, frames):
    """Obvious version: the tiles-only product's normalised tile scores (the tiles are the same sets)
    and the untiled product's score over its own scale, maximum per frame; the frame calibration
    likewise from the out-of-fold scores; maps are the tiles' alone (the whole view is not stitched)."""
    train, test = frames
    ref = HETMM(config()).fit(train)
    t_w = TailModel(ref.templates.calibration.scores).threshold(0.01)
    want_oof = np.maximum(np.array(tiles_only.calibration.scores), np.array(ref.templates.calibration.scores) / t_w)
    np.testing.assert_allclose(pyramid.calibration.scores, want_oof, rtol=1e-5)
    assert pyramid.operating_point().threshold == pytest.approx(TailModel(want_oof).threshold(0.01), rel=1e-5)
    mine, theirs = pyramid.predict(test), tiles_only.predict(test)
    np.testing.assert_allclose(mine.tile_scores[:, :4], theirs.tile_scores, rtol=1e-5)
    want = np.maximum(theirs.tile_scores.max(axis=1), ref.predict(test).scores / t_w)
    np.testing.assert_allclose(mine.scores, want, rtol=1e-4)
    assert np.array_equal(mine.is_anomaly, mine.scores > mine.threshold)
    np.testing.assert_allclose(mine.maps, theirs.maps, rtol=1e-5, atol=1e-7)
    assert mine.maps.shape == (len(test), FRAME, FRAME)


def test_stored_with_one_object_per_position_and_layer_loaded_and_served_the_same(pyramid, frames, tmp_path):
    _, test = frames
    store = open_store(tmp_path / "store")
    version = pyramid.save(store, "pyr")
    m = store.manifest("pyr", version)
    layers = ("layer1", "layer2", "layer3")
    assert list(m["layers"]) == [*(f"tile{p}/{k}" for p in range(4) for k in layers), *(f"whole/{k}" for k in layers)]
    assert sorted(ref["layer"] for ref in m["chunks"]) == sorted(m["layers"])
    assert m["config"]["geometry"] == {"tiles": [2, 2], "tile_overlap": 8, "tile_whole_view": True}
    before = pyramid.predict(test)
    loaded = load_detector(store, "pyr", batch_size=4, device="cpu")
    assert isinstance(loaded, TiledHETMM) and loaded.whole_view
    after = loaded.predict(test)
    np.testing.assert_array_equal(after.scores, before.scores)
    np.testing.assert_array_equal(after.tile_scores, before.tile_scores)
    np.testing.assert_array_equal(after.maps, before.maps)
    assert after.threshold == before.threshold
    ts = pyramid.template_set()
    assert ts.meta["tiles"]["whole_view"] is True and len(ts.meta["tiles"]["sets"]) == 5
    served = tiled_served(ts, pyramid.backbone, version=3)  # over what each (position, layer) shard hands out
    got = served.predict(test)
    np.testing.assert_allclose(got.scores, before.scores, rtol=1e-5)
    assert got.threshold == before.threshold and list(got.is_anomaly) == list(before.is_anomaly)
    with pytest.raises(TemplateError, match="whole view"):  # a set and a configuration that disagree
        TiledHETMM.from_template_set(replace(ts, config=tiled_config(False)))


def test_update_equals_a_fit_on_the_union(frames):
    train, _ = frames
    updated = TiledHETMM(tiled_config(True)).fit(train[:4]).update(train[4:])
    fitted = TiledHETMM(tiled_config(True)).fit(train)
    np.testing.assert_allclose(updated.calibration.scores, fitted.calibration.scores, rtol=1e-5)
    assert updated.scales == pytest.approx(fitted.scales)


def assert_same(a: TiledHETMM, b: TiledHETMM, test: list[np.ndarray]) -> None:
    """Every position's bank, selection and calibration, the scales and the frame scores equal."""
    assert a.n_positions == b.n_positions == 5
    for da, db in zip(a.dets, b.dets, strict=True):
        ta, tb = da.templates, db.templates
        for layer in ta.layers:
            assert torch.equal(ta.bank[layer], tb.bank[layer])
            if ta.indices is not None or tb.indices is not None:
                assert torch.equal(ta.indices[layer], tb.indices[layer])
        np.testing.assert_array_equal(ta.calibration.scores, tb.calibration.scores)
    assert a.scales == b.scales and a.calibration.scores == b.calibration.scores
    np.testing.assert_array_equal(a.predict(test).scores, b.predict(test).scores)


def test_compress_and_another_region_equal_a_fit_under_them(pyramid, frames):
    train, test = frames
    det = TiledHETMM(tiled_config(True)).fit(train).compress("pts_o", 2)
    assert_same(
        det, TiledHETMM(tiled_config(True, **{"templates.kind": "pts_o", "templates.sheets": 2})).fit(train), test
    )
    region = {"size": [FRAME, FRAME], "include": [], "exclude": [{"rect": [20, 30, 90, 50]}]}
    assert_same(pyramid.with_region(region), TiledHETMM(tiled_config(True, region=region)).fit(train), test)


def test_labelled_calibration_is_on_the_frame_scores_with_the_whole_view(pyramid, frames):
    """By hand: each tile's and the whole frame's own HETMM score over its scale, the maximum."""
    from hetmm_ray.core.tiles import cut, tile_grid
    from hetmm_ray.workflows.validation import calibrate_with_labels, choose_threshold

    _, test = frames
    labels = [0, 0, *[1] * (len(test) - 2)]
    grid = tile_grid(FRAME, FRAME, (2, 2), 8)
    crops = [[np.ascontiguousarray(cut(f, grid)[p]) for f in test] for p in range(4)] + [test]
    by_hand = np.max([pyramid.dets[p].predict(c).scores / pyramid.scales[p] for p, c in enumerate(crops)], axis=0)
    _, record = calibrate_with_labels(pyramid, test, labels)
    assert record["threshold"] == pytest.approx(choose_threshold(by_hand.tolist(), labels)["threshold"], rel=1e-5)


def test_the_whole_view_takes_the_products_region(frames):
    train, test = frames
    region = {"size": [FRAME, FRAME], "include": [], "exclude": [{"rect": [0, 0, 68, 68]}]}  # tile 0 wholly
    det = TiledHETMM(tiled_config(True, region=region)).fit(train)
    assert det.dets[-1].config.region == det.config.region and det.live == [False, True, True, True, True]
    ref = HETMM(config(region=region)).fit(train)
    t_w = TailModel(ref.templates.calibration.scores).threshold(0.01)
    np.testing.assert_allclose(det.predict(test).tile_scores[:, 4], ref.predict(test).scores / t_w, rtol=1e-4)


def test_the_setting_is_checked_and_missing_means_none():
    with pytest.raises(ConfigError, match="tile_whole_view"):
        config(**{"geometry.tile_whole_view": "yes"})
    assert DetectorConfig().geometry.tile_whole_view is True  # the default for a new tiled product
    old = {"geometry": {"tiles": [2, 2], "tile_overlap": 8}}  # a tiled manifest written before the setting
    assert stored_config(old).geometry.tile_whole_view is False
    assert "geometry" not in DetectorConfig().stored_dict()  # untiled manifests unchanged


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_tiled_product_stored_before_the_whole_view_scores_as_it_did(tmp_path, runtime):
    """Exact where no CPU kernel is involved, to stated tolerances where one is (tests/stored_products.py)."""
    with store_copy(OLD, tmp_path) as root:
        store = open_store(root)
        assert "tile_whole_view" not in store.manifest("tiled", 1)["config"]["geometry"]
        det = load_detector(store, "tiled", 1, device="cpu", backbone_runtime=runtime)
        assert isinstance(det, TiledHETMM) and not det.whole_view and det.n_positions == 4
        replayed = check_replayed(det, OLD, 1)
        pred = check_through_backbone(det, OLD, json.loads((OLD / "expected.json").read_text()), replayed)
        ts = store.get("tiled", 1)  # and a replica over its (tile, layer) shards: no whole view either
        served = tiled_served(ts, det.backbone, version=1)
        assert not served.whole_view
        np.testing.assert_allclose(served.predict(test_frames(OLD)).scores, pred.scores, rtol=1e-6)

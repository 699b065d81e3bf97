"""The tiled detector (hetmm_ray/detection/tiled.py) against per-position HETMM products, and persistence."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from hetmm_ray.config import BackboneConfig, DetectorConfig, ThresholdConfig
from hetmm_ray.core.calibration import TailModel
from hetmm_ray.core.device import image_digest
from hetmm_ray.core.templates import TemplateError
from hetmm_ray.core.tiles import cut, stitch, tile_grid
from hetmm_ray.data.synthetic import DEFECT_KINDS, SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.detector_choice import load_detector, ms_per_frame_of
from hetmm_ray.detection.geometry_rule import resolve_tiles
from hetmm_ray.detection.tiled import TiledHETMM, position_sets
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FRAME = 128
OVERLAP = 8


def config(**changes) -> DetectorConfig:
    c = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=64),
        threshold=ThresholdConfig(max_images=6, folds=2),
        batch_size=4,
        device="cpu",
    )
    return c.replace(**changes) if changes else c


# The tiles alone (the whole view, geometry.tile_whole_view, beside them: tests/unit/test_tile_whole_view.py).
TILED = {"geometry.tiles": [2, 2], "geometry.tile_overlap": OVERLAP, "geometry.tile_whole_view": False}


@pytest.fixture(scope="module")
def frames():
    prod = SyntheticProduct(seed=0, size=FRAME)
    train = [prod.good(i) for i in range(6)]
    test = [prod.good(100), prod.good(101), *(prod.defective(200 + i, k)[0] for i, k in enumerate(DEFECT_KINDS))]
    return train, test


@pytest.fixture(scope="module")
def tiled(frames) -> TiledHETMM:
    return TiledHETMM(config(**TILED)).fit(frames[0])


def per_position(frames_: list[np.ndarray]) -> list[list[np.ndarray]]:
    tiles = tile_grid(FRAME, FRAME, (2, 2), OVERLAP)
    return [[np.ascontiguousarray(cut(f, tiles)[p]) for f in frames_] for p in range(4)]


def test_each_position_is_a_product_of_its_own(tiled, frames):
    """Position p's set, calibration and tile scores are a plain HETMM fit on the p-th tiles."""
    train, test = frames
    pred = tiled.predict(test)
    untiled = config()
    digests = tuple(image_digest(f) for f in train)
    for p, (tiles_train, tiles_test) in enumerate(zip(per_position(train), per_position(test), strict=True)):
        ref = HETMM(untiled).fit(tiles_train)
        mine = tiled.dets[p].templates
        for layer in ref.templates.layers:
            assert torch.equal(mine.bank[layer], ref.templates.bank[layer])
        # the same product with the frames' digests (every position deals the same frames into the same folds)
        same_folds = ref.calibrated(replace(ref.templates, image_digests=digests))
        np.testing.assert_allclose(mine.calibration.scores, same_folds.calibration.scores, rtol=1e-5)
        scale = TailModel(mine.calibration.scores).threshold(untiled.threshold.false_alarm_rate)
        assert tiled.scales[p] == pytest.approx(scale)
        np.testing.assert_allclose(pred.tile_scores[:, p], ref.predict(tiles_test).scores / scale, rtol=1e-4)


def test_frame_score_verdict_and_calibration_are_consistent(tiled, frames):
    _, test = frames
    pred = tiled.predict(test)
    np.testing.assert_allclose(pred.scores, pred.tile_scores.max(axis=1), rtol=1e-6)
    assert np.array_equal(pred.is_anomaly, pred.scores > pred.threshold)
    oof = np.array([d.templates.calibration.scores for d in tiled.dets]) / np.array(tiled.scales)[:, None]
    np.testing.assert_allclose(tiled.calibration.scores, oof.max(axis=0))
    assert pred.threshold == tiled.operating_point().threshold
    assert pred.tiles == 4 and pred.tile_scores.shape == (len(test), 4)
    # an override of the rule moves the frame threshold only
    other = tiled.predict(test, sigmas=1.0)
    np.testing.assert_array_equal(other.scores, pred.scores)
    assert other.threshold == tiled.operating_point(sigmas=1.0).threshold


def test_maps_are_stitched_at_the_frame_resolution(tiled, frames):
    _, test = frames
    pred = tiled.predict(test)
    assert pred.maps.shape == (len(test), FRAME, FRAME)
    tiles = tile_grid(FRAME, FRAME, (2, 2), OVERLAP)
    f = 2
    parts = []
    for p, tile_imgs in enumerate(per_position([test[f]])):
        m = tiled.dets[p].predict(tile_imgs).maps[0]
        parts.append(torch.as_tensor(m) / tiled.scales[p])
    np.testing.assert_allclose(pred.maps[f], stitch(parts, tiles, (FRAME, FRAME)).numpy(), rtol=1e-4, atol=1e-6)
    small = TiledHETMM.from_template_set(tiled.template_set(), map_size=32, batch_size=4, device="cpu")
    assert small.predict(test[:1]).maps.shape == (1, 32, 32)


def test_save_load_round_trip_one_object_per_tile_and_layer(tiled, frames, tmp_path):
    _, test = frames
    store = open_store(tmp_path / "store")
    version = tiled.save(store, "tiled")
    m = store.manifest("tiled", version)  # the raw manifest: what the store wrote
    layers = ("layer1", "layer2", "layer3")
    assert list(m["layers"]) == [f"tile{p}/{k}" for p in range(4) for k in layers]
    assert sorted(ref["layer"] for ref in m["chunks"]) == sorted(m["layers"])  # one object per (tile, layer)
    assert m["config"]["geometry"] == {"tiles": [2, 2], "tile_overlap": OVERLAP, "tile_whole_view": False}
    loaded = load_detector(store, "tiled", batch_size=4, device="cpu")
    assert isinstance(loaded, TiledHETMM) and loaded.version == version
    before, after = tiled.predict(test), loaded.predict(test)
    np.testing.assert_array_equal(after.scores, before.scores)
    np.testing.assert_array_equal(after.maps, before.maps)
    assert after.threshold == before.threshold
    with pytest.raises(TemplateError, match="tiled"):
        HETMM.from_store(store, "tiled", version)  # a tiled product is never scored untiled


def test_position_sets_read_every_position_back_out_of_the_product_set(tiled):
    """What ``hetmm compress`` reports per position is each position's own set, read from the one set
    a store holds; a product on one canvas is its one position."""
    sets = position_sets(tiled.template_set())
    assert len(sets) == len(tiled.dets) == 4
    for got, det in zip(sets, tiled.dets, strict=True):
        want = det.templates
        assert got.sheets == want.sheets and got.image_digests == want.image_digests == tiled.frame_digests
        assert got.config.stored_dict() == want.config.stored_dict()
        assert got.calibration.scores == want.calibration.scores
        assert dict(got.meta) == {k: v for k, v in want.meta.items() if k not in ("version", "parent")}
        for layer in want.layers:
            assert torch.equal(got.bank[layer], want.bank[layer])
            assert torch.equal(got.templates(layer), want.templates(layer))
    untiled = tiled.dets[0].templates
    (only,) = position_sets(untiled)
    assert only is untiled


def test_untiled_products_store_and_load_as_before(frames, tmp_path):
    """Default geometry: a plain HETMM, its manifest config without a geometry section (as every
    manifest written before tiles existed), loaded and scored bit for bit."""
    train, test = frames
    det = HETMM(config()).fit(train[:4])
    store = open_store(tmp_path / "store")
    det.save(store, "plain")
    m = store.manifest("plain", 1)
    assert list(m["config"]) == ["backbone", "scoring", "templates", "threshold", "bank_dtype"]
    assert list(m["layers"]) == ["layer1", "layer2", "layer3"]
    loaded = load_detector(store, "plain", batch_size=4, device="cpu")
    assert type(loaded) is HETMM
    np.testing.assert_array_equal(loaded.predict(test).scores, det.predict(test).scores)


def test_auto_resolves_from_the_largest_frame():
    big = [np.zeros((300, 200, 3), np.uint8), np.zeros((100, 400, 3), np.uint8)]
    c = resolve_tiles(config(**{"geometry.tiles": "auto"}), big)  # 300 x 400 on a 64 canvas, scale 2: 128 px tiles
    assert c.geometry.tiles == (3, 4)
    assert resolve_tiles(config(**{"geometry.tiles": "auto"}), [np.zeros((64, 60, 3), np.uint8)]).geometry.tiles == (
        1,
        1,
    )
    with pytest.raises(ValueError, match="auto"):
        TiledHETMM(config(**{"geometry.tiles": "auto"}))


# --- the CLI: fit / predict / evaluate with --set geometry.tiles -------------------------------
CLI_FLAGS = [
    "--backbone", "resnet18", "--weights", "random", "--device", "cpu",
    "--set", "backbone.image_size=32", "--set", 'backbone.layers=["layer2","layer3"]',
    "--set", "scoring.forward_windows=[3,3]", "--set", "scoring.backward_windows=[3,3]",
    "--set", "scoring.alphas=[0.5,0.5]", "--set", "scoring.layer_weights=[1,1]",
    "--set", "threshold.folds=2",
]  # fmt: skip


def test_cli_fit_predict_evaluate_with_tiles(tmp_path, capsys):
    import json

    from hetmm_ray.cli import main
    from hetmm_ray.data.synthetic import write_mvtec_layout

    data = write_mvtec_layout(tmp_path / "data", n_train=5, n_test_good=2, n_test_per_defect=1, size=96)
    store = tmp_path / "store"
    tiles = ["--set", "geometry.tiles=[2,2]", "--set", "geometry.tile_overlap=0.125"]
    assert main(["fit", str(data / "train" / "good"), "--product", "t", "--store", str(store), *CLI_FLAGS, *tiles]) == 0
    out = capsys.readouterr().out
    assert "tiles 2 x 2 (4 per frame, 52 x 52 px of a 96 x 96 frame" in out
    assert "sheets 5 per tile (cover: every image while the bank holds at most 200), estimated" in out
    assert "ms per frame" in out
    assert "version 1 from 5 good images" in out and "4 tiles" in out
    assert open_store(store).record("t").config.geometry.tiles == (2, 2)

    heat, js = tmp_path / "heat", tmp_path / "r.json"
    code = main(["predict", str(data / "test"), "--product", "t", "--store", str(store), "--out", str(heat)]
                + ["--json", str(js)])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "2 x 2 tiles per frame" in out and "tiles/s" in out
    records = json.loads(js.read_text())
    assert len(records) == 2 + 3 and all(Path(r["heatmap"]).exists() for r in records)

    # "auto" on 96-px frames and a 32-px canvas: scale <= 2 needs 64-px tiles
    res = tmp_path / "e.json"
    auto = ["--set", 'geometry.tiles="auto"', "--set", "geometry.tile_overlap=0"]
    assert main(["evaluate", "--data", str(data), "--json", str(res), *CLI_FLAGS, *auto]) == 0
    out = capsys.readouterr().out
    result = json.loads(res.read_text())
    assert result["tiles"] == [2, 2] and result["tiles_per_s"] > 0
    assert result["pixel_auroc"] is not None and "tiles/s" in out and "2 x 2 per frame" in out

    # one tile: the plain path, the JSON exactly as before (no tile keys)
    assert main(["evaluate", "--data", str(data), "--json", str(res), *CLI_FLAGS]) == 0
    assert "tiles" not in json.loads(res.read_text()) and "tiles/s" not in capsys.readouterr().out


# --- a region with tiles ------------------------------------------------------------------------------
def hand_part(rect: list[int], tile) -> dict | None:
    """The reference: an exclude rectangle in frame pixels clipped to a tile and shifted into its
    coordinates by hand (None when it misses the tile)."""
    x0, y0 = max(rect[0], tile.left) - tile.left, max(rect[1], tile.top) - tile.top
    x1, y1 = min(rect[2], tile.left + tile.width) - tile.left, min(rect[3], tile.top + tile.height) - tile.top
    if x0 >= x1 or y0 >= y1:
        return None
    return {"size": [tile.height, tile.width], "include": [], "exclude": [{"rect": [x0, y0, x1, y1]}]}


def test_a_region_is_cut_per_position(frames, tmp_path):
    """Each position scores as a plain product with its part of the region, clipped by hand."""
    train, test = frames
    rect = [20, 30, 90, 50]  # x0, y0, x1, y1: across the vertical seam, in tiles 0 and 1
    region = {"size": [FRAME, FRAME], "include": [], "exclude": [{"rect": rect}]}
    det = TiledHETMM(config(**TILED, region=region)).fit(train)
    assert det.live == [True] * 4
    pred = det.predict(test)
    digests = tuple(image_digest(f) for f in train)
    grid = tile_grid(FRAME, FRAME, (2, 2), OVERLAP)
    parts = [hand_part(rect, tile) for tile in grid]
    assert parts[2] is None and parts[3] is None and parts[0] is not None and parts[1] is not None
    for p, (tiles_train, tiles_test) in enumerate(zip(per_position(train), per_position(test), strict=True)):
        ref = HETMM(config(region=parts[p])).fit(tiles_train)
        ref_ts = ref.calibrated(replace(ref.templates, image_digests=digests))
        np.testing.assert_allclose(det.dets[p].templates.calibration.scores, ref_ts.calibration.scores, rtol=1e-5)
        np.testing.assert_allclose(pred.tile_scores[:, p], ref.predict(tiles_test).scores / det.scales[p], rtol=1e-4)
    counted = np.ones((FRAME, FRAME), bool)
    counted[30:50, 20:90] = False
    assert pred.regions.shape == (len(test), FRAME, FRAME) and (pred.regions == counted).all()
    store = open_store(tmp_path / "store")
    det.save(store, "r")
    loaded = load_detector(store, "r", batch_size=4, device="cpu")
    assert loaded.config.region == det.config.region
    np.testing.assert_array_equal(loaded.predict(test).scores, pred.scores)


def test_a_tile_wholly_outside_the_region_never_counts(frames):
    """Position 0 wholly excluded: not scored, and anything painted where only it sees changes no
    frame score; the frame calibration is the maximum over the other positions."""
    train, test = frames
    region = {"size": [FRAME, FRAME], "include": [], "exclude": [{"rect": [0, 0, 68, 68]}]}
    det = TiledHETMM(config(**TILED, region=region)).fit(train)
    assert det.live == [False, True, True, True]
    pred = det.predict(test)
    assert np.isnan(pred.tile_scores[:, 0]).all()
    np.testing.assert_allclose(pred.scores, pred.tile_scores[:, 1:].max(axis=1), rtol=1e-6)
    oof = np.array([d.templates.calibration.scores for d in det.dets[1:]]) / np.array(det.scales[1:])[:, None]
    np.testing.assert_allclose(det.calibration.scores, oof.max(axis=0))
    painted = [x.copy() for x in test]
    for x in painted:
        x[:60, :60] = 255 - x[:60, :60]  # pixels in tile 0 only (tiles 1-3 start at row or column 60)
    np.testing.assert_array_equal(det.predict(painted).scores, pred.scores)
    corner = TiledHETMM(config(**TILED, region={"size": [FRAME, FRAME], "include": [{"rect": [0, 0, 10, 10]}]}))
    assert corner.live == [True, False, False, False]


def test_cli_fit_and_evaluate_with_a_region_and_tiles(tmp_path, capsys):
    from PIL import Image

    from hetmm_ray.cli import main
    from hetmm_ray.data.synthetic import write_mvtec_layout

    data = write_mvtec_layout(tmp_path / "data", n_train=5, n_test_good=2, n_test_per_defect=1, size=96)
    (tmp_path / "region.json").write_text('{"size": [96, 96], "exclude": [{"rect": [0, 0, 96, 20]}]}')
    flags = [*CLI_FLAGS, "--set", "geometry.tiles=[2,2]", "--region", str(tmp_path / "region.json")]
    store = str(tmp_path / "store")
    assert main(["fit", str(data / "train" / "good"), "--product", "t", "--store", store, *flags]) == 0
    out = capsys.readouterr().out
    assert "4 tiles" in out and "0 of 4 tiles wholly outside it" in out
    assert open_store(store).record("t").config.region["exclude"] == [{"rect": [0, 0, 96, 20]}]
    heat = tmp_path / "heat"
    assert main(["predict", str(data / "test" / "good"), "--product", "t", "--store", store, "--out", str(heat)]) == 0
    capsys.readouterr()
    overlay = np.asarray(Image.open(next(heat.rglob("*_heatmap.png"))).convert("RGB")).astype(int)
    top, rest = overlay[:20], overlay[20:]
    assert (np.abs(top - top.mean(axis=2, keepdims=True)) < 3).all()  # the excluded band is grey
    assert (np.abs(rest - rest.mean(axis=2, keepdims=True)) >= 3).any()  # the rest is coloured
    res = tmp_path / "e.json"
    assert main(["evaluate", "--data", str(data), "--json", str(res), *flags]) == 0
    result = json.loads(res.read_text())
    assert result["tiles"] == [2, 2] and result["pixel_auroc"] is not None


# --- hot update (TiledHETMM.update, hetmm update) ------------------------------------------------
def assert_same_tiled(a: TiledHETMM, b: TiledHETMM, test: list[np.ndarray]) -> None:
    """Every position's bank, selection and calibration, the scales, the frame calibration and the
    scores of ``test`` equal."""
    assert a.frame_digests == b.frame_digests
    for da, db in zip(a.dets, b.dets, strict=True):
        ta, tb = da.templates, db.templates
        assert ta.config.stored_dict() == tb.config.stored_dict()
        for layer in ta.layers:
            assert torch.equal(ta.bank[layer], tb.bank[layer])
            if ta.indices is not None or tb.indices is not None:
                assert torch.equal(ta.indices[layer], tb.indices[layer])
        np.testing.assert_array_equal(ta.calibration.scores, tb.calibration.scores)
    assert a.scales == b.scales
    np.testing.assert_array_equal(a.calibration.scores, b.calibration.scores)
    np.testing.assert_array_equal(a.predict(test).scores, b.predict(test).scores)


@pytest.mark.parametrize("selection", [{}, {"templates.kind": "pts_o", "templates.sheets": 2}])
def test_update_equals_a_fit_on_the_union(frames, selection):
    """The defined semantics of a hot update: the product a fit on the old frames then the new
    ones gives (the slow obvious reference); a frame already held is skipped, a retry is a no-op."""
    train, test = frames
    c = config(**TILED, **selection)
    det = TiledHETMM(c).fit(train[:4])
    det.update([train[4], train[0], train[5], train[4]])  # one held, one repeated
    assert len(det.frame_digests) == 6 and det.version is None  # the 2 new ones added, the other 2 skipped
    reference = TiledHETMM(c).fit(train)
    assert_same_tiled(det, reference, test)
    before = det.calibration
    det.update(train[:2])
    assert len(det.frame_digests) == 6 and det.calibration is before  # nothing new: nothing recomputed


def test_cli_update_of_a_tiled_product(frames, tmp_path, capsys):
    from PIL import Image

    from hetmm_ray.cli import main

    train, test = frames
    folders = {}
    for name, imgs in (("old", train[:4]), ("new", [train[0], *train[4:]])):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        for i, x in enumerate(imgs):
            Image.fromarray(x).save(folders[name] / f"{i}.png")
    store = open_store(tmp_path / "store")
    TiledHETMM(config(**TILED)).fit(train[:4]).save(store, "t")
    assert main(["update", str(folders["new"]), "--product", "t", "--store", str(tmp_path / "store")]) == 0
    captured = capsys.readouterr()
    assert "1 image(s) already in v1" in captured.err
    assert "version 2 (from v1) with 2 more good images, 6 in all; 4 tiles" in captured.out
    loaded = load_detector(store, "t", batch_size=4, device="cpu")
    assert loaded.version == 2 and store.record("t", 2).parent == 1
    assert_same_tiled(loaded, TiledHETMM(config(**TILED)).fit(train), test)
    assert main(["update", str(folders["new"]), "--product", "t", "--store", str(tmp_path / "store")]) == 0
    assert "no new images; head stays v2" in capsys.readouterr().out


# --- compress and labelled calibration (hetmm compress / calibrate) -------------------------------
@pytest.mark.parametrize("sheets", [2, "auto"])
def test_compress_equals_a_fit_under_that_selection(frames, sheets):
    """Per position selection: compressing the ALL product equals fitting it from scratch with the
    selection (the slow obvious reference); with sheets auto each position measures its own K."""
    train, test = frames
    det = TiledHETMM(config(**TILED)).fit(train)
    det.compress("pts_o", sheets)
    assert det.config.templates.kind == "pts_o" and det.config.templates.sheets == sheets
    reference = TiledHETMM(config(**TILED, **{"templates.kind": "pts_o", "templates.sheets": sheets})).fit(train)
    assert_same_tiled(det, reference, test)
    for d in det.dets:
        assert d.templates.indices is not None
        assert ("sheets_auto" in d.templates.meta) == (sheets == "auto")


def test_labelled_calibration_is_at_the_frame_level(tiled, frames, tmp_path):
    """The chosen threshold is the one the frame scores computed by hand (each position's own HETMM
    score of its tile over its scale, the maximum over tiles) give; stored and used for verdicts."""
    from hetmm_ray.workflows.validation import calibrate_with_labels, choose_threshold

    _, test = frames
    labels = [0, 0, *[1] * (len(test) - 2)]
    by_hand = np.max(
        [tiled.dets[p].predict(tiles).scores / tiled.scales[p] for p, tiles in enumerate(per_position(test))], axis=0
    )
    ts, record = calibrate_with_labels(tiled, test, labels)
    expected = choose_threshold(by_hand.tolist(), labels)
    assert record["threshold"] == pytest.approx(expected["threshold"], rel=1e-5)
    assert ts.config.threshold.rule == "validation"
    assert ts.calibration.scores == tiled.calibration.scores  # the frame out-of-fold scores kept
    store = open_store(tmp_path / "store")
    version = store.put("t", ts)
    loaded = load_detector(store, "t", version, batch_size=4, device="cpu")
    assert loaded.operating_point().threshold == record["threshold"] and loaded.scales == tiled.scales
    pred = loaded.predict(test)
    assert np.array_equal(pred.is_anomaly, pred.scores > record["threshold"])


def test_cli_compress_and_calibrate_of_a_tiled_product(frames, tmp_path, capsys):
    from PIL import Image

    from hetmm_ray.cli import main

    train, test = frames
    val = tmp_path / "val"
    for name, imgs in (("good", test[:2]), ("scratch", test[2:])):
        (val / name).mkdir(parents=True)
        for i, x in enumerate(imgs):
            Image.fromarray(x).save(val / name / f"{i}.png")
    store_uri = str(tmp_path / "store")
    store = open_store(store_uri)
    TiledHETMM(config(**TILED)).fit(train).save(store, "t")
    assert main(["compress", "--product", "t", "--store", store_uri, "--templates", "pts", "--sheets", "2"]) == 0
    out = capsys.readouterr().out
    assert "version 2 = pts_o with 2 sheets per tile (4 tiles) of 6 images" in out
    compressed = load_detector(store, "t", 2, batch_size=4, device="cpu")
    reference = TiledHETMM(config(**TILED, **{"templates.kind": "pts_o", "templates.sheets": 2})).fit(train)
    assert_same_tiled(compressed, reference, test)
    assert main(["calibrate", "--product", "t", "--store", store_uri, "--val", str(val)]) == 0
    assert "version 3 (from v2) threshold" in capsys.readouterr().out
    calibrated = load_detector(store, "t", 3, batch_size=4, device="cpu")
    assert calibrated.config.threshold.rule == "validation"
    assert calibrated.operating_point().threshold == calibrated.calibration.validation["threshold"]


# --- cost made visible: hetmm fit prints the grid, the sheets and ms per frame first ---------------
def test_fit_reports_the_cost_first_tiled_or_not(tmp_path, capsys):
    from hetmm_ray.cli import main
    from hetmm_ray.data.synthetic import write_mvtec_layout
    from hetmm_ray.detection.frame_cost import estimate_ms_per_frame

    data = write_mvtec_layout(tmp_path / "data", n_train=5, n_test_good=1, n_test_per_defect=1, size=96)
    train, store = str(data / "train" / "good"), str(tmp_path / "store")
    assert main(["fit", train, "--product", "plain", "--store", store, *CLI_FLAGS]) == 0
    lines = capsys.readouterr().out.splitlines()
    cost = "tiles 1 x 1 (1 per frame, a 96 x 96 frame, 3.00 frame px per canvas px), sheets 5 (cover: every image "
    cost += "while the bank holds at most 200), estimated "
    assert lines[0].startswith(cost) and lines[0].endswith(" ms per frame") and "version 1" in lines[1]
    auto = ["--templates", "pts", "--sheets", "auto", "--set", "geometry.tiles=[2,2]"]
    assert main(["fit", train, "--product", "t", "--store", store, *CLI_FLAGS, *auto]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("tiles 2 x 2 (4 per frame") and "sheets at most 5 per tile (pts_o, sheets auto)" in first
    # the shared estimate: more sheets and more scored tiles cost more ATMM time, never nothing
    det = HETMM(config())
    frame = SyntheticProduct(seed=0, size=64).good(0)
    assert 0 < estimate_ms_per_frame(det.scorer, [frame], 2) < float("inf")
    assert ms_per_frame_of(TiledHETMM(config(**TILED)), SyntheticProduct(seed=0, size=FRAME).good(0), 6) > 0


def test_another_region_equals_a_fit_under_it(frames, tmp_path, capsys):
    """hetmm region on a tiled product: the templates kept, every position recalibrated under its
    part; the same product a fit under that region gives (the reference)."""
    from hetmm_ray.cli import main

    train, test = frames
    region = {"size": [FRAME, FRAME], "include": [], "exclude": [{"rect": [20, 30, 90, 50]}]}
    store = open_store(tmp_path / "store")
    TiledHETMM(config(**TILED)).fit(train).save(store, "t")
    (tmp_path / "region.json").write_text(json.dumps(region))
    assert (
        main(
            ["region", "--product", "t", "--store", str(tmp_path / "store"), "--region", str(tmp_path / "region.json")]
        )
        == 0
    )
    assert "version 2 (from v1) region" in capsys.readouterr().out
    loaded = load_detector(store, "t", 2, batch_size=4, device="cpu")
    assert loaded.config.region is not None
    assert_same_tiled(loaded, TiledHETMM(config(**TILED, region=region)).fit(train), test)
    back = loaded.with_region(None)
    assert back.config.region is None
    assert_same_tiled(back, TiledHETMM(config(**TILED)).fit(train), test)


def test_a_far_rule_at_another_rate_moves_the_frame_threshold_only(tiled, frames, tmp_path):
    """A version republished at another far rate (``hetmm calibrate --far``, as the service's far
    rule: the same templates and calibrations, another stored rate) keeps the stored tile scales: the
    same frame scores, and the frame threshold at the new rate on the frame calibration, which the
    predict-time override gives too. The positions' next recalibration (a hot update) takes the new
    rate, as a fit at it would."""
    from hetmm_ray.cli import main

    _, test = frames
    store = open_store(tmp_path / "store")
    v1 = tiled.save(store, "t")
    rate = 0.2
    assert main(["calibrate", "--product", "t", "--store", str(tmp_path / "store"), "--far", str(rate)]) == 0
    v2 = store.head("t")
    assert v2 == v1 + 1 and store.manifest("t", v2)["chunks"] == store.manifest("t", v1)["chunks"]
    loaded = load_detector(store, "t", v2, batch_size=4, device="cpu")
    assert loaded.scales == tiled.scales and loaded.calibration.scores == tiled.calibration.scores
    before, after = tiled.predict(test), loaded.predict(test)
    np.testing.assert_array_equal(after.scores, before.scores)
    np.testing.assert_array_equal(after.tile_scores, before.tile_scores)
    assert after.threshold == TailModel(tiled.calibration.scores).threshold(rate) != before.threshold
    assert after.threshold == tiled.predict(test, false_alarm_rate=rate).threshold
    assert np.array_equal(after.is_anomaly, after.scores > after.threshold)
    assert loaded.operating_point().target == rate
    # recalibrated positions: each scale is now the far threshold at the new rate of its own scores
    grown = loaded.update([SyntheticProduct(seed=0, size=FRAME).good(50)])
    for p, det in enumerate(grown.dets):
        assert grown.scales[p] == pytest.approx(TailModel(det.templates.calibration.scores).threshold(rate))


def test_stored_tile_scales_are_checked(tiled, tmp_path):
    store = open_store(tmp_path / "store")
    v1 = tiled.save(store, "t")
    tiles = store.manifest("t", v1)["meta"]["tiles"]
    for bad in ([1.0, 2.0], [1.0, 1.0, float("nan"), 1.0], [1.0, 0.0, 1.0, 1.0], ["a", 1.0, 1.0, 1.0]):
        config = store.record("t").config.stored_dict()
        head = store.head("t")
        store.republish("t", config=config, expect_head=head, meta={"tiles": {**tiles, "scales": bad}})
        with pytest.raises(TemplateError, match="tile scales"):
            load_detector(store, "t", batch_size=4, device="cpu")

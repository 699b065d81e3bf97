"""The fit's one geometry rule (``geometry_rule.choose_geometry``). ``geometry.min_defect_px`` means the same
on every path: set through the CLI's ``--set``, a ``--config`` file, the Python API or an HTTP
create's field, it gives the same stored product; a grid it contradicts is refused; a fit says in
one line what it chose and why. ``geometry.canvas: "aspect"``: an elongated frame's canvas."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hetmm_ray.cli import main
from hetmm_ray.config import ConfigError, DetectorConfig
from hetmm_ray.config.detector import stored_config
from hetmm_ray.config.product import ASPECT_MAX_SCALE, LARGE_FRAME_SCALE
from hetmm_ray.core.tiles import defect_grid
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.geometry_rule import choose_geometry
from hetmm_ray.serve import bodies
from hetmm_ray.store import open_store
from hetmm_ray.workflows import operations

SMALL = {
    "backbone": {"name": "resnet18", "weights": "random", "image_size": 32},
    "threshold": {"folds": 2},
    "geometry": {"tile_overlap": 0},
    "device": "cpu",
}
FLAGS = ["--backbone", "resnet18", "--weights", "random", "--device", "cpu", "--set", "backbone.image_size=32"]
FLAGS += ["--set", "threshold.folds=2", "--set", "geometry.tile_overlap=0"]


@pytest.fixture
def frames(tmp_path: Path) -> list[Path]:
    part = SyntheticProduct(seed=1, size=128)
    folder = tmp_path / "good"
    folder.mkdir()
    for i in range(3):
        Image.fromarray(part.good(i)).save(folder / f"{i}.png")
    return sorted(folder.glob("*.png"))


def _stored(store_dir: Path) -> tuple[dict, dict[str, torch.Tensor], list[float]]:
    store = open_store(store_dir)
    record, ts = store.record("p", 1), store.get("p", 1)
    return record.config.stored_dict(), dict(ts.bank), list(ts.calibration.scores)


def _same(a: tuple, b: tuple) -> None:
    assert a[0] == b[0]
    assert a[1].keys() == b[1].keys() and all(torch.equal(a[1][k], b[1][k]) for k in a[1])
    assert np.allclose(a[2], b[2])


def test_every_path_gives_the_same_stored_product(tmp_path: Path, frames: list[Path], capsys) -> None:
    # 8 px at stride 4: up to 2 frame px per canvas px, so 128-px frames on a 32-px canvas need 2 x 2 tiles
    assert defect_grid(128, 128, 32, 0, min_defect_px=8, stride=4)[:2] == (2, 2)
    folder = str(frames[0].parent)
    assert main(["fit", folder, "--product", "p", "--store", str(tmp_path / "cli"), *FLAGS,
                 "--set", "geometry.min_defect_px=8"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "tiles auto: 2 x 2, a 8-px defect spans at least one 4-px feature cell at up to 2.00" in out
    cli = _stored(tmp_path / "cli")
    assert cli[0]["geometry"]["tiles"] == [2, 2] and cli[0]["geometry"]["min_defect_px"] == 8

    config_file = tmp_path / "product.json"
    config_file.write_text(json.dumps({**SMALL, "geometry": {"tile_overlap": 0, "min_defect_px": 8}}))
    assert main(["fit", folder, "--product", "p", "--store", str(tmp_path / "file"), "--config", str(config_file)]) == 0
    _same(_stored(tmp_path / "file"), cli)

    api = DetectorConfig.from_dict(SMALL).replace(**{"geometry.min_defect_px": 8})
    operations.fit(open_store(tmp_path / "api"), "p", api, frames)
    _same(_stored(tmp_path / "api"), cli)

    # an HTTP create (and the console's form) hands its field over as given, then the same rule
    http = {**SMALL, "geometry": {**SMALL["geometry"], **bodies.geometry_fields(None, "8")}}
    chosen = choose_geometry(DetectorConfig.from_dict(http), frames).config
    assert chosen.stored_dict() == cli[0]


def test_the_rule_is_idempotent_and_refuses_a_grid_it_contradicts(frames: list[Path]) -> None:
    base = DetectorConfig.from_dict(SMALL)
    top_k = base.score_pixels  # the fit's choice of k for this canvas
    resolved = {"geometry.canvas": "fixed", "geometry.tile_large_frames": False, "scoring.score_top_k": top_k}
    fixed = base.replace(**resolved)
    assert base.geometry.canvas == "aspect"  # the default
    assert choose_geometry(base, frames) == (fixed, None, None)  # square frames, no grid asked: nothing chosen
    chosen = choose_geometry(base.replace(**{"geometry.min_defect_px": 8}), frames)
    assert chosen.tiles == (2, 2) and "8-px defect" in chosen.why
    again = choose_geometry(chosen.config, frames)  # a resolved (stored) configuration stays as it is
    assert again.config == chosen.config
    same_as_auto = choose_geometry(base.replace(**{"geometry.min_defect_px": 8, "geometry.tiles": "auto"}), frames)
    assert same_as_auto.config == chosen.config
    with pytest.raises(ConfigError, match=r"tiles 3 x 1 and min_defect_px 8 ask for different grids.*picks 2 x 2"):
        choose_geometry(base.replace(**{"geometry.min_defect_px": 8, "geometry.tiles": [3, 1]}), frames)
    # a defect large enough for the whole frame on one canvas: untiled, and the setting is still stored
    one = choose_geometry(base.replace(**{"geometry.min_defect_px": 16}), frames)
    assert one.tiles == (1, 1) and not one.config.geometry.tiled
    assert one.config.stored_dict()["geometry"]["min_defect_px"] == 16
    assert "geometry" not in base.stored_dict()  # untiled products without it are stored as before


# --- geometry.canvas: "aspect" -----------------------------------------------------------------
def test_the_aspect_canvas_gives_an_elongated_frames_short_side_the_squares_pixels() -> None:
    tall = [np.zeros((1250, 500, 3), np.uint8)]
    base = DetectorConfig().replace(**{"geometry.canvas": "aspect"})
    chosen = choose_geometry(base, tall)
    assert chosen.config.backbone.image_size == 256 * 1250 // 500 == 640
    assert chosen.config.geometry.canvas == "fixed" and chosen.why is None  # no grid asked
    assert "a 500 x 1250 frame gets 256 x 640 canvas px (0.51 per frame px; 102 x 256 at 256)" in chosen.describe()
    # a frame more elongated than ASPECT_MAX_SCALE squares: the raised side stops there
    strip = choose_geometry(base, [np.zeros((100, 2000, 3), np.uint8)])
    assert strip.config.backbone.image_size == ASPECT_MAX_SCALE * 256 == 1024
    assert choose_geometry(chosen.config, tall) == (chosen.config, None, None)  # resolved: resolves to itself
    square = choose_geometry(base, [np.zeros((300, 300, 3), np.uint8)])
    assert square.config.backbone.image_size == 256  # a square frame: today's canvas
    # squash fills the canvas with the frame already: the canvas stays, and nothing is said to be chosen
    squashed = base.replace(**{"backbone.geometry": "squash", "geometry.tile_large_frames": False})
    resolved = squashed.replace(**{"geometry.canvas": "fixed", "scoring.score_top_k": squashed.score_pixels})
    assert choose_geometry(squashed, tall) == (resolved, None, None)
    with pytest.raises(ConfigError, match="canvas mode"):
        DetectorConfig.from_dict({"geometry": {"canvas": "wide"}})
    # a fitted product: no canvas key written, and one stored without it reads as "fixed", never chosen again
    resolved = DetectorConfig().replace(**{"geometry.tiles": [2, 2], "geometry.canvas": "fixed"})
    assert "canvas" not in resolved.stored_dict()["geometry"]
    assert stored_config({"geometry": {"tiles": [2, 2]}}).geometry.canvas == "fixed"
    assert stored_config({"backbone": {"image_size": 405}}).geometry.canvas == "fixed"
    assert DetectorConfig.from_dict({"geometry": {"tiles": [2, 2]}}).geometry.canvas == "aspect"  # a user's file
    assert DetectorConfig().replace(**{"geometry.canvas": "fixed"}).replace(batch_size=3).geometry.canvas == "fixed"


def test_an_aspect_fit_stores_its_canvas_and_scores_at_the_frames_aspect(tmp_path: Path) -> None:
    part = SyntheticProduct(seed=2, size=160)
    frames = [np.ascontiguousarray(part.good(i)[:, 48:112]) for i in range(3)]  # 160 x 64
    config = DetectorConfig.from_dict({**SMALL, "geometry": {"canvas": "aspect"}})
    store = open_store(tmp_path / "s")
    out = operations.fit(store, "p", config, frames)
    stored = store.record("p", 1).config
    assert stored.backbone.image_size == 32 * 160 // 64 == 80 and stored.geometry.canvas == "fixed"
    assert "geometry" not in stored.stored_dict()  # an untiled letterbox product, as today's are stored
    pred = out.detector.predict(frames[:1])
    assert np.asarray(pred.maps[0]).shape == (80, 32)  # the content at the frame's aspect: its short side 32


def test_the_direct_api_resolves_the_canvas_and_refuses_what_would_tile(tmp_path: Path) -> None:
    from hetmm_ray import HETMM

    part = SyntheticProduct(seed=2, size=160)
    frames = [np.ascontiguousarray(part.good(i)[:, 48:112]) for i in range(3)]  # 160 x 64
    config = DetectorConfig.from_dict({**SMALL, "geometry": {"canvas": "aspect"}})
    direct = HETMM(config).fit(frames)
    assert direct.config.backbone.image_size == 80 and direct.config.geometry.canvas == "fixed"
    assert direct.template_set().meta["geometry_choice"]["canvas"].startswith("canvas aspect: image_size 80")
    via_operations = operations.fit(open_store(tmp_path / "s"), "p", config, frames).detector
    assert direct.template_set().config == via_operations.template_set().config
    assert np.allclose(direct.predict(frames[:1]).scores, via_operations.predict(frames[:1]).scores, atol=1e-6)
    # a grid asked for (8-px defects: 2 x 1 tiles of these frames) cannot act on one canvas: refused first
    tiling = config.replace(**{"geometry.min_defect_px": 8})
    assert choose_geometry(tiling, frames).tiles != (1, 1)
    with pytest.raises(ConfigError, match="HETMM is one canvas"):
        HETMM(tiling).fit(frames)


@pytest.mark.parametrize("geometry", [{"min_defect_px": 8, "tile_overlap": 0}, {"canvas": "aspect"}])
def test_every_later_version_keeps_what_the_fit_chose(tmp_path: Path, geometry: dict) -> None:
    part = SyntheticProduct(seed=1, size=128)
    frames = [part.good(i) for i in range(4)]
    if "canvas" in geometry:  # an elongated frame: the canvas is what is chosen
        frames = [np.ascontiguousarray(f[:, 40:90]) for f in frames]
    store = open_store(tmp_path / "s")
    operations.fit(store, "p", DetectorConfig.from_dict({**SMALL, "geometry": geometry}), frames[:3])
    chosen = store.get("p", 1).meta["geometry_choice"]
    assert chosen["tiles"] == ([2, 2] if "min_defect_px" in geometry else [1, 1])
    operations.update(store, "p", frames[3:])
    h, w = frames[0].shape[:2]
    region = {"size": [h, w], "include": [], "exclude": [{"rect": [0, 0, 4, 4]}]}
    operations.set_region(store, "p", region)
    assert store.head("p") == 3
    assert [store.get("p", v).meta["geometry_choice"] for v in (2, 3)] == [chosen, chosen]


def test_tiles_auto_with_an_overlap_no_grid_can_keep_is_a_config_error() -> None:
    # tiles never shrink below their overlap: 200 px of it on a 32-px canvas (at most 64 px a tile)
    config = DetectorConfig.from_dict({**SMALL, "geometry": {"tiles": "auto", "tile_overlap": 200}})
    with pytest.raises(ConfigError, match="tiles auto for a 500 x 1250 frame: no grid keeps"):
        choose_geometry(config, [np.zeros((1250, 500, 3), np.uint8)])


def _blank(h: int, w: int) -> np.ndarray:
    return np.zeros((h, w, 3), np.uint8)


def _one_canvas_scale(h: int, w: int, size: int) -> float:
    """Frame px per canvas px of an untiled letterboxed frame on the aspect canvas, written out."""
    side = min(round(size * max(h, w) / min(h, w)), ASPECT_MAX_SCALE * size)
    return max(h, w) / side


@pytest.mark.parametrize(
    "shape", [(900, 900), (1024, 1024), (1025, 1025), (2048, 2048), (1250, 500), (460, 1130), (1944, 2592), (256, 4000)]
)
def test_a_large_frame_gets_the_grid_of_tiles_auto_by_default(shape: tuple[int, int]) -> None:
    h, w = shape
    base = DetectorConfig()
    chosen = choose_geometry(base, [_blank(h, w)])
    large = _one_canvas_scale(h, w, base.backbone.image_size) > LARGE_FRAME_SCALE
    auto_config = base.replace(**{"geometry.tiles": "auto", "geometry.tile_large_frames": False})
    auto = choose_geometry(auto_config, [_blank(h, w)])
    if large:  # the grid and canvas tiles auto gives, and the line says why
        assert chosen.tiles == auto.tiles != (1, 1) and chosen.config == auto.config
        assert chosen.why is not None and f"a {w} x {h} frame is large" in chosen.why
        assert "geometry.tile_large_frames; false keeps it on one canvas" in chosen.describe()
    else:
        assert chosen.tiles == (1, 1) and chosen.why is None
    assert not chosen.config.geometry.tile_large_frames  # resolved
    assert choose_geometry(chosen.config, [_blank(h, w)]).config == chosen.config  # and resolves to itself
    # off: every frame on one canvas
    off = choose_geometry(base.replace(**{"geometry.tile_large_frames": False}), [_blank(h, w)])
    assert off.tiles == (1, 1) and off.why is None


def test_the_large_frame_rule_acts_only_where_no_grid_is_asked() -> None:
    big = [_blank(2048, 2048)]
    given = DetectorConfig().replace(**{"geometry.tiles": [2, 2]})
    assert choose_geometry(given, big).tiles == (2, 2)  # a grid given: kept
    defect = DetectorConfig().replace(**{"geometry.min_defect_px": 16})
    chosen = choose_geometry(defect, big)
    assert chosen.why is not None and "is large" not in chosen.why  # the defect's grid, not the large frame's
    # a stored product holds its grid: the rule is never written, and a manifest without it reads as off
    tiled = choose_geometry(DetectorConfig(), big).config
    assert "tile_large_frames" not in tiled.stored_dict()["geometry"]
    assert stored_config(tiled.stored_dict()) == tiled.product_only()
    assert not stored_config({}).geometry.tile_large_frames
    assert not stored_config({"geometry": {"tiles": [2, 2]}}).geometry.tile_large_frames
    with pytest.raises(ConfigError, match="true or false"):
        DetectorConfig.from_dict({"geometry": {"tile_large_frames": "yes"}})


def test_a_large_frame_is_refused_by_the_one_canvas_detector_and_fitted_tiled_on_every_path(tmp_path: Path) -> None:
    from hetmm_ray.detection.detector import HETMM
    from hetmm_ray.detection.detector_choice import new_detector

    part = SyntheticProduct(seed=1, size=160)  # 160 px on a 32-px canvas: 5 frame px per canvas px
    frames = [part.good(i) for i in range(3)]
    config = DetectorConfig.from_dict(SMALL)
    with pytest.raises(ConfigError, match=r"a 160 x 160 frame is large.*HETMM is one canvas"):
        HETMM(config).fit(frames)
    det = new_detector(config, frames).fit(frames)
    assert det.config.geometry.tiles == (3, 3)
    operations.fit(open_store(tmp_path / "api"), "p", config, frames)
    stored = open_store(tmp_path / "api")
    assert stored.record("p", 1).config == det.config.product_only()
    assert "is large" in stored.get("p", 1).meta["geometry_choice"]["why"]
    folder = tmp_path / "good"
    folder.mkdir()
    for i, frame in enumerate(frames):
        Image.fromarray(frame).save(folder / f"{i}.png")
    assert main(["fit", str(folder), "--product", "p", "--store", str(tmp_path / "cli"), *FLAGS]) == 0
    assert _stored(tmp_path / "cli")[0] == stored.record("p", 1).config.stored_dict()  # the CLI: the same product
    operations.fit(open_store(tmp_path / "off"), "p", config.replace(**{"geometry.tile_large_frames": False}), frames)
    assert not open_store(tmp_path / "off").record("p", 1).config.geometry.tiled


def test_evaluate_says_what_the_rule_chose_before_the_fit(tmp_path: Path, capsys) -> None:
    from hetmm_ray.data.synthetic import write_mvtec_layout

    data = write_mvtec_layout(tmp_path / "large", n_train=3, n_test_good=1, n_test_per_defect=1, size=160, seed=2)
    assert main(["evaluate", "--data", str(data), *FLAGS]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("tiles auto:"))
    assert "a 160 x 160 frame is large" in line and "tiles                     3 x 3 per frame" in out

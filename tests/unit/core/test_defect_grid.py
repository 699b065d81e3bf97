"""``geometry.min_defect_px``: ``tiles: auto`` picks the grid from the smallest defect to find
and the backbone's finest tap, says why, says when a defect is too small for any grid, and refuses a
grid past the limit; without it, the scale rule stays."""

from __future__ import annotations

import numpy as np
import pytest

from hetmm_ray.config import ConfigError, DetectorConfig
from hetmm_ray.config.product import tap_stride
from hetmm_ray.core.tiles import AUTO_MAX_SCALE, auto_grid, axis_tiles, defect_grid
from hetmm_ray.detection.geometry_rule import auto_tiles, resolve_tiles


def _fewest(length: int, canvas: int, overlap: int, max_scale: float) -> int:
    """The slow obvious count: the first n whose tiles are at most max_scale * canvas long."""
    for n in range(1, length + 1):
        if max(side for _, side in axis_tiles(length, n, overlap)) <= max_scale * canvas or length <= canvas:
            return n if length > canvas else 1
    raise AssertionError("no grid")


@pytest.mark.parametrize("shape", [(2048, 2048), (460, 1130), (300, 200), (5000, 3000)])
@pytest.mark.parametrize(("defect", "stride"), [(4, 4), (8, 4), (12, 8), (30, 4), (3, 4), (100, 8)])
def test_the_grid_keeps_a_defect_one_feature_cell_wide_with_the_fewest_tiles(shape, defect, stride):
    h, w = shape
    chosen = defect_grid(h, w, 256, 32, min_defect_px=defect, stride=stride)
    scale = max(1.0, defect / stride)  # one cell per defect, never an upsampled tile
    assert (chosen.rows, chosen.cols) == (_fewest(h, 256, 32, scale), _fewest(w, 256, 32, scale))
    assert chosen.too_small == (defect < stride)
    assert ("too small" in chosen.why) == chosen.too_small and f"{defect}-px defect" in chosen.why


def test_at_eight_pixels_and_stride_four_it_is_the_scale_rule():
    """The scale rule (2 frame px per canvas px) is the defect rule for an 8-px defect at stride 4."""
    for h, w in ((2048, 2048), (460, 1130), (900, 900)):
        assert defect_grid(h, w, 256, 32, min_defect_px=8, stride=4)[:2] == auto_grid(h, w, 256, 32)
    assert AUTO_MAX_SCALE == 8 / 4


def test_the_finest_configured_tap_sets_the_stride():
    assert [tap_stride("resnet18", t) for t in ("layer1", "layer2", "layer3")] == [4, 8, 16]
    assert [tap_stride("mobilenet_v2", f"features.{i}") for i in (3, 6, 13)] == [4, 8, 16]
    assert [tap_stride("efficientnet_lite0", f"blocks.{i}") for i in (1, 2, 4)] == [4, 8, 16]
    frames = [np.zeros((2048, 2048, 3), np.uint8)]
    fine = DetectorConfig.from_dict({"backbone": {"name": "resnet18", "weights": "random"},
                                     "geometry": {"tiles": "auto", "min_defect_px": 8}})  # fmt: skip
    coarse = fine.replace(  # layer2 and layer3 only: the finest cell is 8 canvas px, so more tiles
        **{
            "backbone.layers": ["layer2", "layer3"],
            "scoring.forward_windows": [3, 3],
            "scoring.backward_windows": [3, 3],
            "scoring.alphas": [0.5, 0.5],
            "scoring.layer_weights": [1, 1],
        }
    )
    assert auto_tiles(fine, frames)[:2] == (5, 5) and auto_tiles(coarse, frames)[:2] == (9, 9)
    assert resolve_tiles(coarse, frames).geometry.tiles == (9, 9)
    with pytest.raises(ConfigError, match="stride of tap"):
        tap_stride("resnet18", "fc")


def test_without_the_setting_auto_keeps_its_rule_and_says_so():
    cfg = DetectorConfig.from_dict({"geometry": {"tiles": "auto"}})
    rows, cols, why = auto_tiles(cfg, [np.zeros((2048, 2048, 3), np.uint8)])
    assert (rows, cols) == auto_grid(2048, 2048, cfg.backbone.image_size, cfg.geometry.tile_overlap)
    assert "no geometry.min_defect_px" in why


def test_a_grid_past_the_limit_is_refused_with_the_numbers():
    cfg = DetectorConfig.from_dict({"geometry": {"tiles": "auto", "min_defect_px": 4}, "backbone": {"image_size": 64}})
    with pytest.raises(ConfigError, match=r"4-px defect in a 8000 x 8000 frame needs \d+ x \d+ tiles"):
        auto_tiles(cfg, [np.zeros((8000, 8000, 3), np.uint8)])
    with pytest.raises(ConfigError, match="min_defect_px"):
        DetectorConfig.from_dict({"geometry": {"min_defect_px": 0}})


def test_hetmm_fit_says_what_auto_chose_and_why(tmp_path, capsys):
    from PIL import Image

    from hetmm_ray.cli import main
    from hetmm_ray.data.synthetic import SyntheticProduct
    from hetmm_ray.store import open_store

    part = SyntheticProduct(seed=1, size=128)
    for i in range(3):
        Image.fromarray(part.good(i)).save(tmp_path / f"{i}.png")
    flags = ["--backbone", "resnet18", "--weights", "random", "--device", "cpu", "--set", "backbone.image_size=32"]
    flags += ["--set", "threshold.folds=2", "--set", "geometry.tiles=auto", "--set", "geometry.min_defect_px=16"]
    code = main(["fit", str(tmp_path), "--product", "p", "--store", str(tmp_path / "s"), *flags])
    out = capsys.readouterr().out
    assert code == 0, out
    # 16 px at stride 4: up to 4 frame px per canvas px, so 128-px frames on a 32-px canvas fit in one tile
    assert "tiles auto: 1 x 1, a 16-px defect spans at least one 4-px feature cell at up to 4.00" in out
    assert open_store(tmp_path / "s").record("p", 1).config.geometry.tiles == (1, 1)

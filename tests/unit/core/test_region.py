"""Inspection regions (core/region.py, config/region.py): rasterisation against a slow obvious
reference, masks converted exactly, the mapping to the map, and refusals."""

from __future__ import annotations

import numpy as np
import pytest

from hetmm_ray.config import ConfigError
from hetmm_ray.config.region import check_region
from hetmm_ray.core.geometry import Box, canvas_box, scale_box
from hetmm_ray.core.region import (
    check_region_covers,
    map_mask,
    map_masks,
    raster,
    reference_map_box,
    region_from_mask,
)


def slow_inside(shape: dict, cx: float, cy: float) -> bool:
    """The documented rule, one point at a time in plain Python."""
    if "rect" in shape:
        x0, y0, x1, y1 = shape["rect"]
        return x0 <= cx < x1 and y0 <= cy < y1
    pts = shape["polygon"]
    inside = False
    for k in range(len(pts)):
        (ax, ay), (bx, by) = pts[k], pts[(k + 1) % len(pts)]
        if (ay > cy) != (by > cy) and cx < ax + (cy - ay) * (bx - ax) / (by - ay):
            inside = not inside
    return inside


def slow_raster(region: dict) -> np.ndarray:
    h, w = region["size"]
    out = np.zeros((h, w), dtype=bool)
    for y in range(h):
        for x in range(w):
            c = (x + 0.5, y + 0.5)
            inc = not region.get("include") or any(slow_inside(s, *c) for s in region["include"])
            exc = any(slow_inside(s, *c) for s in region.get("exclude") or [])
            out[y, x] = inc and not exc
    return out


REGIONS = [
    {"size": [20, 30]},
    {"size": [20, 30], "include": [{"rect": [2, 3, 10, 12]}]},
    {"size": [20, 30], "include": [{"rect": [2.4, 3.5, 10.5, 12.6]}], "exclude": [{"rect": [4, 4, 6, 30 - 10]}]},
    {"size": [25, 31], "include": [{"polygon": [[1, 1], [29, 4.5], [15.2, 24], [3, 20]]}]},
    # self-intersecting bow tie (even-odd), points on pixel centres and edges
    {"size": [17, 19], "include": [{"polygon": [[0.5, 0.5], [18.5, 16.5], [18.5, 0.5], [0.5, 16.5]]}]},
    {
        "size": [40, 40],
        "include": [{"rect": [0, 0, 40, 20]}, {"polygon": [[5, 15], [35, 15], [20, 39.9]]}],
        "exclude": [{"polygon": [[10, 10], [30, 10], [30, 30], [10, 30]]}, {"rect": [0, 0, 3, 3]}],
    },
]


@pytest.mark.parametrize("region", REGIONS)
def test_raster_matches_the_slow_reference(region: dict) -> None:
    assert np.array_equal(raster(region), slow_raster(region))


def test_random_polygons_match_the_slow_reference() -> None:
    rng = np.random.default_rng(0)
    for _ in range(10):
        pts = [[float(rng.uniform(0, 23)), float(rng.uniform(0, 17))] for _ in range(int(rng.integers(3, 8)))]
        region = {"size": [17, 23], "include": [{"polygon": pts}]}
        assert np.array_equal(raster(region), slow_raster(region))


def test_no_include_is_the_whole_frame_and_exclude_wins() -> None:
    assert raster({"size": [4, 5]}).all()
    r = raster({"size": [4, 5], "include": [{"rect": [0, 0, 5, 4]}], "exclude": [{"rect": [0, 0, 5, 4]}]})
    assert not r.any()


def test_integer_rect_holds_exactly_its_pixels() -> None:
    r = raster({"size": [10, 10], "include": [{"rect": [2, 3, 5, 7]}]})
    expected = np.zeros((10, 10), dtype=bool)
    expected[3:7, 2:5] = True
    assert np.array_equal(r, expected)


def test_mask_round_trips_exactly() -> None:
    rng = np.random.default_rng(1)
    for density in (0.1, 0.5, 0.95):
        mask = (rng.random((23, 37)) < density).astype(np.uint8) * 255
        region = region_from_mask(mask)
        assert np.array_equal(raster(region), mask != 0)
    block = np.zeros((50, 60), dtype=np.uint8)
    block[10:40, 5:55] = 1
    region = region_from_mask(block)
    assert region["include"] == [{"rect": [5, 10, 55, 40]}]  # compact: equal runs merged
    assert region_from_mask(np.ones((3, 4)))["include"] == [{"rect": [0, 0, 4, 3]}]


@pytest.mark.parametrize(
    ("region", "words"),
    [
        ({"size": [10, 10], "include": [{"rect": [0, 0, 11, 5]}]}, "outside the 10 x 10 frame"),
        ({"size": [10, 10], "exclude": [{"polygon": [[0, 0], [5, -1], [3, 3]]}]}, "outside"),
        ({"size": [10, 10], "include": [{"rect": [5, 0, 5, 5]}]}, "x0 < x1"),
        ({"size": [10, 10], "include": [{"polygon": [[0, 0], [1, 1]]}]}, "at least 3 points"),
        ({"size": [10, 10], "include": [{"circle": [1, 2, 3]}]}, "a shape is"),
        ({"size": [0, 10]}, "region.size"),
        ({"size": [10, 10], "inclde": []}, "unknown key"),
        ({"size": [10, 10], "include": [{"rect": [0, 0, float("nan"), 5]}]}, "finite"),
        ("nope", "expected a mapping"),
    ],
)
def test_bad_regions_are_refused(region: object, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        check_region(region)


def test_empty_include_area_is_refused() -> None:
    with pytest.raises(ConfigError, match="no pixel"):
        check_region_covers({"size": [10, 10], "include": [{"rect": [2.6, 2.6, 3.4, 3.4]}]})  # no centre inside
    with pytest.raises(ConfigError, match="no pixel"):
        check_region_covers({"size": [10, 10], "exclude": [{"rect": [0, 0, 10, 10]}]})
    with pytest.raises(ConfigError, match="empty include"):
        region_from_mask(np.zeros((4, 4)))


def test_map_mask_same_size_is_the_raster() -> None:
    region = REGIONS[5]
    ref = raster(region)
    assert np.array_equal(map_mask(ref, (40, 40), (40, 40), "letterbox"), ref)
    assert np.array_equal(map_mask(ref, (40, 40), (40, 40), "squash"), ref)


def test_map_mask_samples_centres_when_downscaled() -> None:
    region = {"size": [100, 200], "include": [{"rect": [40, 20, 120, 60]}]}
    ref = raster(region)
    m = map_mask(ref, (50, 100), (50, 100), "letterbox")  # half size: the rect halves exactly
    expected = np.zeros((50, 100), dtype=bool)
    expected[10:30, 20:60] = True
    assert np.array_equal(m, expected)


def test_letterbox_other_aspect_is_fitted_and_centred() -> None:
    # reference 10 x 20 (wide), an image box 20 x 20 (square): the frame fills the width, 10 rows centred
    ref = raster({"size": [10, 20]})
    m = map_mask(ref, (20, 20), (32, 64), "letterbox")
    assert m[5:15].all() and not m[:5].any() and not m[15:].any()
    # squash stretches whatever the box
    assert map_mask(ref, (20, 20), (32, 64), "squash").all()


def test_map_masks_by_box_and_reference_aspect() -> None:
    region = {"size": [460, 1130], "exclude": [{"rect": [0, 0, 565, 460]}]}  # the left half never counts
    canvas = out = 256
    rb = reference_map_box(region, canvas, out, "letterbox")
    assert rb == scale_box(canvas_box(460, 1130, canvas, "letterbox"), canvas, out)
    # an image of the reference's aspect at half resolution gets the same box and the same mask
    box = canvas_box(230, 565, canvas, "letterbox")
    (m,) = map_masks(region, [box], canvas=canvas, out=out, geometry="letterbox")
    assert m.shape == (box.height, box.width)
    assert not m[:, : box.width // 2].any() and m[:, box.width // 2 :].all()
    (sq,) = map_masks(region, [Box(0, 0, 64, 64)], canvas=canvas, out=64, geometry="squash")
    assert sq.shape == (64, 64) and not sq[:, :32].any() and sq[:, 32:].all()


def test_tile_regions_cut_the_raster_per_tile() -> None:
    from hetmm_ray.core.region import tile_regions
    from hetmm_ray.core.tiles import tile_grid

    region = {"size": [40, 60], "include": [{"polygon": [[5, 5], [55, 10], [30, 38]]}], "exclude": []}
    tiles = tile_grid(40, 60, (2, 3), 4)
    parts = tile_regions(region, tiles)
    full = raster(region)
    for t, part in zip(tiles, parts, strict=True):
        cut = full[t.top : t.top + t.height, t.left : t.left + t.width]
        assert part.counts == bool(cut.any())
        if part.region is None:
            assert cut.all() or not cut.any()
        else:
            assert part.region["size"] == [t.height, t.width] and np.array_equal(raster(part.region), cut)
    whole = tile_regions({"size": [40, 60], "include": [], "exclude": [{"rect": [0, 0, 20, 20]}]}, tiles)
    assert whole[0].counts and whole[0].region is not None and whole[5] == (True, None)

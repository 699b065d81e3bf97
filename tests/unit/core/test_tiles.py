"""core/tiles.py against slow, obvious references."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from hetmm_ray.core.tiles import AUTO_MAX_SCALE, Tile, auto_grid, axis_tiles, cut, grid_of, stitch, tile_grid


def _reference_axis(length: int, n: int, overlap: int | float) -> list[tuple[int, int]]:
    """The docstring's rule in exact rational arithmetic."""
    if n == 1:
        return [(0, length)]
    if isinstance(overlap, int):
        t = math.ceil(Fraction(length + (n - 1) * overlap, n))
    else:
        t = math.ceil(Fraction(length) / (n - (n - 1) * Fraction(overlap).limit_denominator(10**6)))
    t = max(1, min(length, t))
    out = []
    for i in range(n):
        exact = Fraction(i * (length - t), n - 1)
        out.append((math.floor(exact + Fraction(1, 2)), t))
    return out


LENGTHS = [1, 2, 7, 100, 255, 256, 257, 460, 900, 1130, 2048, 2448]
OVERLAPS = [0, 1, 16, 32, 0.0, 0.1, 0.125, 0.25, 0.5]


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("overlap", OVERLAPS)
def test_axis_matches_reference_and_covers_exactly(length: int, overlap: int | float) -> None:
    for n in range(1, 9):
        got = axis_tiles(length, n, overlap)
        assert got == _reference_axis(length, n, overlap)
        sides = {t for _, t in got}
        assert len(sides) == 1  # every tile the same size
        assert got[0][0] == 0 and got[-1][0] + got[-1][1] == length  # exact cover, first to last
        covered = np.zeros(length, dtype=bool)
        for s, t in got:
            assert 0 <= s and s + t <= length
            covered[s : s + t] = True
        assert covered.all()
        starts = [s for s, _ in got]
        assert starts == sorted(starts)
        t = got[0][1]
        if n > 1 and t < length:  # neighbours overlap by at least the asked pixels (fractions: 1 px rounding)
            asked = overlap if isinstance(overlap, int) else overlap * t
            for (a, _), (b, _) in itertools.pairwise(got):
                assert a + t - b >= asked - 1


def test_grid_row_major_and_same_size() -> None:
    tiles = tile_grid(900, 1130, (2, 3), 32)
    assert len(tiles) == 6
    assert tiles[0] == Tile(0, 0, 466, 398)
    assert tiles[5].top + tiles[5].height == 900 and tiles[5].left + tiles[5].width == 1130
    assert len({(t.height, t.width) for t in tiles}) == 1
    assert [(t.top, t.left) for t in tiles] == [(r, c) for r in (0, 434) for c in (0, 366, 732)]


def test_one_tile_is_the_frame() -> None:
    assert tile_grid(460, 1130, (1, 1), 32) == [Tile(0, 0, 460, 1130)]


@pytest.mark.parametrize("bad", [-1, 1.0, 1.5, -0.1, float("nan"), True, "8"])
def test_bad_overlap(bad: object) -> None:
    with pytest.raises(ValueError):
        axis_tiles(100, 2, bad)  # type: ignore[arg-type]


def test_cut_views() -> None:
    frame = np.arange(7 * 9 * 3).reshape(7, 9, 3)
    tiles = tile_grid(7, 9, (2, 2), 1)
    parts = cut(frame, tiles)
    for p, t in zip(parts, tiles, strict=True):
        assert np.shares_memory(p, frame)
        assert np.array_equal(p, frame[t.top : t.top + t.height, t.left : t.left + t.width])


def _reference_stitch(maps: list[np.ndarray], tiles: list[Tile], frame: tuple[int, int]) -> np.ndarray:
    out = np.full(frame, -np.inf, dtype=np.float32)
    for m, t in zip(maps, tiles, strict=True):
        for y in range(t.height):
            for x in range(t.width):
                out[t.top + y, t.left + x] = max(out[t.top + y, t.left + x], m[y, x])
    return out


@pytest.mark.parametrize(
    ("h", "w", "grid", "overlap"), [(13, 17, (2, 3), 3), (20, 20, (3, 3), 0.25), (9, 5, (1, 2), 0)]
)
def test_stitch_max_at_frame_resolution(h: int, w: int, grid: tuple[int, int], overlap: int | float) -> None:
    rng = np.random.default_rng(0)
    tiles = tile_grid(h, w, grid, overlap)
    maps = [rng.random((t.height, t.width)).astype(np.float32) for t in tiles]
    got = stitch(maps, tiles, (h, w))
    assert got.shape == (h, w) and torch.isfinite(got).all()
    assert np.array_equal(got.numpy(), _reference_stitch(maps, tiles, (h, w)))
    # identity: cutting a map and stitching it back gives the map
    frame = torch.as_tensor(rng.random((h, w)), dtype=torch.float32)
    assert torch.equal(stitch(cut(frame, tiles), tiles, (h, w)), frame)


def test_stitch_resizes_maps_and_to_output_size() -> None:
    tiles = tile_grid(64, 64, (2, 2), 0)
    maps = [torch.full((8, 8), float(k)) for k in range(4)]  # maps at another resolution than the tiles
    got = stitch(maps, tiles, (64, 64))
    assert got[0, 0] == 0 and got[0, 63] == 1 and got[63, 0] == 2 and got[63, 63] == 3
    small = stitch(maps, tiles, (64, 64), out=(16, 16))
    assert small.shape == (16, 16) and torch.isfinite(small).all()
    assert small[15, 15] == 3


def test_auto_grid() -> None:
    assert AUTO_MAX_SCALE == 2.0
    assert auto_grid(256, 256, 256, 32) == (1, 1)
    assert auto_grid(100, 600, 256, 32) == (1, 2)  # long side over the canvas, never upsampled
    assert auto_grid(900, 900, 256, 0) == (2, 2)
    assert auto_grid(2048, 2048, 256, 0) == (4, 4)
    assert auto_grid(2048, 2048, 256, 32) == (5, 5)
    assert auto_grid(460, 1130, 256, 32) == (1, 3)
    assert grid_of("auto", 460, 1130, 256, 32) == (1, 3)
    assert grid_of([2, 2], 460, 1130, 256, 32) == (2, 2)


@pytest.mark.parametrize("overlap", [0, 16, 64, 0.1, 0.3])
def test_auto_grid_is_the_smallest_and_never_upsamples(overlap: int | float) -> None:
    canvas = 256
    for length in range(200, 3000, 37):
        n = auto_grid(length, length, canvas, overlap)[0]
        side = axis_tiles(length, n, overlap)[0][1]
        assert side <= AUTO_MAX_SCALE * canvas or (n == 1 and length <= canvas)
        if n > 1:
            assert axis_tiles(length, n - 1, overlap)[0][1] > AUTO_MAX_SCALE * canvas  # smallest
            assert side >= canvas  # never cut into tiles smaller than the canvas
        if length <= canvas:
            assert n == 1

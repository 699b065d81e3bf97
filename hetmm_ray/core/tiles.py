"""Tiles: a fixed grid of overlapping rectangles over a frame, cutting and stitching (pure, no Ray).

Exact semantics (all sizes in the frame's own pixels):

- **One axis.** A length ``L`` cut into ``n`` tiles with overlap ``o`` gets one tile side ``t`` for
  every tile: ``t = ceil((L + (n - 1) * o) / n)`` for an overlap in pixels (an ``int >= 0``), and
  ``t = ceil(L / (n - (n - 1) * f))`` for a fraction ``f`` of the tile side (a ``float`` in
  ``[0, 1)``, taken exactly as its closest fraction with denominator <= 10^6, so 0.1 is 1/10);
  then ``t`` is clamped to ``[1, L]``. Tile ``i`` starts at
  ``s_i = round_half_up(i * (L - t) / (n - 1))`` (integer arithmetic; ``s_0 = 0``, ``n = 1``: ``0``),
  so the first tile starts at 0, the last ends exactly at ``L``: the grid covers the axis exactly,
  with every tile the same size, and neighbours overlap by at least the asked overlap (up to one
  pixel of rounding less for a fraction).
- **Grid.** ``tile_grid(H, W, (rows, cols), overlap)`` is the product of the two axes, in row-major
  order (tile ``k = r * cols + c``): :class:`Tile` ``(top, left, height, width)``. For a given frame
  size every tile has the same ``height x width``, so every tile position reaches the canvas with
  the same geometry and the aligned matching of HETMM holds per position.
- **Cut.** :func:`cut` returns the tiles of an ``(H, W, ...)`` array as views (no copy).
- **Stitch.** :func:`stitch` places per-tile maps back into one ``(H', W')`` map, the frame's size
  by default or a stated output size: each tile's rectangle is scaled to the output (edges
  rounded, at least one pixel), its map bilinearly resized to that rectangle when its shape
  differs, and where tiles overlap the output holds the maximum. Every output pixel is covered.
- **auto.** :func:`auto_grid` picks, per axis, the smallest ``n`` whose tile side is at most
  ``max_scale * canvas`` (frame pixels per canvas pixel), so the grid has the fewest tiles that keep
  the scale at or under ``max_scale``; a frame whose long side is at most ``canvas`` gets ``1 x 1``
  (it is never cut into tiles smaller than the canvas, i.e. never upsampled because of tiles).
  :data:`AUTO_MAX_SCALE` = 2.0. Why 2: the finest feature tap has a stride of 4 canvas pixels, so at
  scale 2 a feature cell spans 8 frame pixels: a 5-8 px pit still fills most of a cell and a 1-2 px
  hairline stays at least half a canvas pixel wide along its whole length, while at
  1/8-1/10 scales both fall under a quarter of a cell. Scale 1 would cost 4x the tiles (ATMM and
  backbone cost grow with the tile count) for defects already visible at 2, and measured it gains on
  some products and loses on others (docs/performance.md). And with ``n >= 2``
  chosen as the smallest count at factor 2, tiles are at least ``canvas`` long on that axis
  (``n - 1`` tiles were longer than ``2 * canvas``, so ``n`` tiles are longer than
  ``2 * canvas * (n - 1) / n >= canvas``): auto never upsamples a tile either.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "AUTO_MAX_SCALE",
    "DefectGrid",
    "Tile",
    "auto_grid",
    "axis_tiles",
    "check_overlap",
    "cut",
    "defect_grid",
    "grid_of",
    "stitch",
    "tile_grid",
]

AUTO_MAX_SCALE = 2.0
"""``tiles: auto``: frame pixels per canvas pixel a tile may have at most (see the module docstring)."""


class Tile(NamedTuple):
    """A tile's rectangle in frame pixels: rows ``top:top+height``, columns ``left:left+width``."""

    top: int
    left: int
    height: int
    width: int


def check_overlap(overlap: float) -> None:
    """ValueError unless ``overlap`` is an int >= 0 (pixels) or a float in [0, 1) (a fraction)."""
    if isinstance(overlap, bool) or not isinstance(overlap, int | float):
        raise ValueError(f"tile overlap must be pixels (int >= 0) or a fraction (float in [0, 1)), got {overlap!r}")
    if isinstance(overlap, int):
        if overlap < 0:
            raise ValueError(f"tile overlap in pixels must be >= 0, got {overlap}")
    elif not (math.isfinite(overlap) and 0.0 <= overlap < 1.0):
        raise ValueError(f"tile overlap as a fraction must be in [0, 1), got {overlap!r}")


def _side(length: int, n: int, overlap: float) -> int:
    """The tile side of ``n`` tiles over ``length`` (module docstring)."""
    if n == 1:
        return length
    if isinstance(overlap, int):
        t = -(-(length + (n - 1) * overlap) // n)  # ceil in integers
    else:
        f = Fraction(overlap).limit_denominator(10**6)  # the fraction as written (0.1, not its binary float)
        t = math.ceil(Fraction(length) / (n - (n - 1) * f))
    return max(1, min(length, t))


def axis_tiles(length: int, n: int, overlap: float) -> list[tuple[int, int]]:
    """``(start, side)`` of ``n`` tiles over ``length`` pixels (module docstring)."""
    if length < 1 or n < 1:
        raise ValueError(f"need a length >= 1 and n >= 1 tiles, got length {length}, n {n}")
    check_overlap(overlap)
    t = _side(length, n, overlap)
    if n == 1:
        return [(0, t)]
    span, d = length - t, n - 1
    return [((2 * i * span + d) // (2 * d), t) for i in range(n)]  # round half up


def tile_grid(height: int, width: int, grid: Sequence[int], overlap: float) -> list[Tile]:
    """The tiles of a ``height x width`` frame, row-major (module docstring)."""
    rows, cols = int(grid[0]), int(grid[1])
    ys, xs = axis_tiles(height, rows, overlap), axis_tiles(width, cols, overlap)
    return [Tile(top, left, h, w) for top, h in ys for left, w in xs]


def cut(frame: Any, tiles: Sequence[Tile]) -> list[Any]:
    """The tiles of an ``(H, W, ...)`` array (numpy or torch) as views."""
    return [frame[t.top : t.top + t.height, t.left : t.left + t.width] for t in tiles]


def _scaled(tile: Tile, frame: tuple[int, int], out: tuple[int, int]) -> Tile:
    if out == frame:
        return tile
    fy, fx = out[0] / frame[0], out[1] / frame[1]
    top, left = round(tile.top * fy), round(tile.left * fx)
    bottom, right = round((tile.top + tile.height) * fy), round((tile.left + tile.width) * fx)
    top, left = min(top, out[0] - 1), min(left, out[1] - 1)
    return Tile(top, left, max(1, bottom - top), max(1, right - left))


def stitch(
    maps: Sequence[Tensor | np.ndarray],
    tiles: Sequence[Tile],
    frame: tuple[int, int],
    out: tuple[int, int] | None = None,
) -> Tensor:
    """One ``out`` (default ``frame``) float32 map from per-tile 2-D maps: max where tiles overlap."""
    if len(maps) != len(tiles):
        raise ValueError(f"{len(maps)} maps for {len(tiles)} tiles")
    out = tuple(frame) if out is None else tuple(out)  # type: ignore[assignment]
    result = torch.full(out, float("-inf"), dtype=torch.float32)  # type: ignore[arg-type]
    for m, tile in zip(maps, tiles, strict=True):
        t = torch.as_tensor(m, dtype=torch.float32).cpu()
        r = _scaled(tile, frame, out)  # type: ignore[arg-type]
        if tuple(t.shape) != (r.height, r.width):
            t = F.interpolate(t[None, None], size=(r.height, r.width), mode="bilinear", align_corners=False)[0, 0]
        view = result[r.top : r.top + r.height, r.left : r.left + r.width]
        torch.maximum(view, t, out=view)
    return result


def auto_grid(
    height: int, width: int, canvas: int, overlap: float, *, max_scale: float = AUTO_MAX_SCALE
) -> tuple[int, int]:
    """The fewest ``(rows, cols)`` whose tiles keep ``side / canvas <= max_scale`` (module docstring)."""
    if max(height, width) <= canvas:
        return 1, 1
    limit = max_scale * canvas

    def count(length: int) -> int:
        n = 1
        while _side(length, n, overlap) > limit:
            n += 1
            if n > length:  # an overlap too large for any grid: tiles cannot shrink below it
                raise ValueError(f"no grid keeps {length}-px tiles under {limit:g} px with overlap {overlap!r}")
        return n

    check_overlap(overlap)
    return count(height), count(width)


class DefectGrid(NamedTuple):
    """The grid :func:`defect_grid` chose, and why in one line."""

    rows: int
    cols: int
    why: str
    too_small: bool


def defect_grid(height: int, width: int, canvas: int, overlap: float, *, min_defect_px: int, stride: int) -> DefectGrid:
    """``tiles: auto`` from the smallest defect to find (``geometry.min_defect_px``, frame pixels).

    A tile at ``f`` frame pixels per canvas pixel shows a ``d``-px defect as ``d / (f * stride)``
    cells of the backbone's finest tap (``stride`` canvas pixels per cell). The rule keeps it at
    least one cell: ``f <= d / stride``, and takes the fewest tiles that do (:func:`auto_grid` at
    ``max_scale = d / stride``). Tiles are never upsampled for it (``f >= 1``: no pixel the camera did
    not see is added): where ``d < stride`` even the frame's own scale leaves the defect under one
    cell, the grid is the frame's own scale and ``too_small`` says so (a finer tap, a larger defect
    or a closer camera is needed). A frame that needs more than ``max_grid`` tiles per axis is refused."""
    wanted = min_defect_px / stride
    scale = max(1.0, wanted)
    rows, cols = auto_grid(height, width, canvas, overlap, max_scale=scale)
    cells = min_defect_px / (scale * stride)
    if wanted < 1.0:
        why = (
            f"a {min_defect_px}-px defect is {cells:.2f} of a {stride}-px feature cell even at the frame's own "
            f"scale: too small for any grid (no tile is upsampled); tiles at 1 frame px per canvas px, which find more "
            f"on a texture coarser than the defect and can find fewer on a per-pixel grain: measure against the "
            f"setting unset"
        )
    else:
        why = (
            f"a {min_defect_px}-px defect spans at least one {stride}-px feature cell at up to {scale:.2f} frame px "
            f"per canvas px: the fewest tiles that keep it there"
        )
    return DefectGrid(rows, cols, why, wanted < 1.0)


def grid_of(tiles: Any, height: int, width: int, canvas: int, overlap: float) -> tuple[int, int]:
    """The grid a ``tiles`` setting means for a frame: ``[rows, cols]`` as given, ``"auto"`` resolved."""
    if tiles == "auto":
        return auto_grid(height, width, canvas, overlap)
    return int(tiles[0]), int(tiles[1])

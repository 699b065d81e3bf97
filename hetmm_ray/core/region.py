"""Inspection regions: which pixels of an image count, at the reference size and on the fused map.

A region (its stored form: ``config/region.py``) is a reference frame ``size = [H, W]`` and
``include`` / ``exclude`` shapes in that frame's pixel coordinates (``x`` = column, ``y`` = row,
the frame spanning ``[0, W] x [0, H]``). Exact semantics:

1. Rasterisation at the reference size (:func:`raster`): pixel ``(row y, column x)`` belongs to a
   shape iff its centre ``(cx, cy) = (x + 0.5, y + 0.5)`` does:

   - rect ``[x0, y0, x1, y1]``: ``x0 <= cx < x1`` and ``y0 <= cy < y1`` (half-open, so an integer
     rect holds exactly the pixels ``x0..x1-1`` by ``y0..y1-1``);
   - polygon (closed, vertices in order, self-intersections allowed): the even-odd rule; the ray
     from the centre towards ``+x`` crosses edge ``a -> b`` iff ``(ay > cy) != (by > cy)`` and
     ``cx < ax + (cy - ay) * (bx - ax) / (by - ay)`` (float64), and the centre is inside iff the
     count is odd.

   A pixel counts iff it is in some include shape (every pixel when there is none) and in no
   exclude shape: exclude wins. A region whose counted pixels are none is refused
   (:func:`check_region_covers`, ConfigError).
2. A mask image (:func:`region_from_mask`, nonzero = include) becomes include rectangles: one per
   run of nonzero pixels in a row, merged with the same run in the rows below; rasterising them
   gives the mask back exactly. The mask's size is the reference size.
3. On the map (:func:`map_mask`). Each image's content box on the fused map (``core.geometry``:
   the whole map for squash; the letterboxed image's box, scaled to ``scoring.output_size``) is
   where the image lies. The reference frame is placed in that box by the product's geometry:

   - ``squash``, or a box of the same size the reference frame itself gets on this map
     (``scale_box(canvas_box(H, W, canvas, geometry), canvas, out)``: every image of the
     reference's aspect, whatever its resolution): the frame fills the box;
   - ``letterbox`` and a box of another aspect: the frame is scaled by
     ``s = min(bh / H, bw / W)`` to ``fh = min(bh, max(1, round(H s)))`` by
     ``fw = min(bw, max(1, round(W s)))``, centred (``top = (bh - fh) // 2``,
     ``left = (bw - fw) // 2``); map pixels of the box outside the placed frame do not count
     (the region says nothing about them).

   A map pixel ``(i, j)`` of the placed frame counts iff reference pixel
   ``(((2 i + 1) H) // (2 fh), ((2 j + 1) W) // (2 fw))`` does (nearest sampling at the map
   pixel's centre, in exact integers). The result is a bool mask of the box's shape: what
   ``core.scoring.image_scores`` takes, cropped to the content box as the maps are.

4. Tiles (:func:`tile_regions`, ``hetmm_ray/detection/tiled.py``). The region is in frame coordinates; tile
   position ``p`` gets the part of it inside its rectangle of the grid at the region's reference
   size: ``raster(region)[top:top+height, left:left+width]``, as a region of that tile's own size
   (rule 2's rectangles, exact). A part where every pixel counts is ``None`` (no region: the same
   pixels, the plain arithmetic); a part where none counts says so (``TilePart.counts`` false): that
   position never counts. Each part then reaches its tile's map like any region (rule 3), so a
   frame of the reference size gets exactly its own pixels per tile.

Pure numpy/torch; no I/O (reading a region file is ``data/region_file.py``).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..config import ConfigError, DetectorConfig
from ..config.region import check_region
from .geometry import Box, canvas_box, scale_box

__all__ = [
    "check_region_covers",
    "check_region_visible",
    "check_visible",
    "covered_share",
    "map_mask",
    "map_masks",
    "raster",
    "reference_map_box",
    "region_from_mask",
    "tile_regions",
    "TilePart",
]


def _rect_raster(rect: Sequence[float], height: int, width: int) -> np.ndarray:
    x0, y0, x1, y1 = rect
    cx = np.arange(width, dtype=np.float64) + 0.5
    cy = np.arange(height, dtype=np.float64) + 0.5
    return ((cy >= y0) & (cy < y1))[:, None] & ((cx >= x0) & (cx < x1))[None, :]


def _polygon_raster(points: Sequence[Sequence[float]], height: int, width: int) -> np.ndarray:
    pts = np.asarray(points, dtype=np.float64)
    ax, ay = pts[:, 0], pts[:, 1]
    bx, by = np.roll(ax, -1), np.roll(ay, -1)
    cx = np.arange(width, dtype=np.float64) + 0.5
    out = np.zeros((height, width), dtype=bool)
    for y in range(height):
        cy = y + 0.5
        active = (ay > cy) != (by > cy)
        if not active.any():
            continue
        a_x, a_y, b_x, b_y = ax[active], ay[active], bx[active], by[active]
        xs = np.sort(a_x + (cy - a_y) * (b_x - a_x) / (b_y - a_y))  # the crossing formula, as documented
        above = xs.size - np.searchsorted(xs, cx, side="right")  # crossings with cx < x
        out[y] = (above % 2) == 1
    return out


def _shape_raster(shape: dict[str, Any], height: int, width: int) -> np.ndarray:
    if "rect" in shape:
        return _rect_raster(shape["rect"], height, width)
    return _polygon_raster(shape["polygon"], height, width)


def _key(region: dict[str, Any]) -> str:
    return json.dumps(region, sort_keys=True)


@functools.lru_cache(maxsize=16)
def _raster_cached(key: str) -> np.ndarray:
    region = json.loads(key)
    height, width = region["size"]
    if region["include"]:
        inc = np.zeros((height, width), dtype=bool)
        for s in region["include"]:
            inc |= _shape_raster(s, height, width)
    else:
        inc = np.ones((height, width), dtype=bool)
    for s in region["exclude"]:
        inc &= ~_shape_raster(s, height, width)
    inc.setflags(write=False)  # shared by the cache
    return inc


def raster(region: dict[str, Any]) -> np.ndarray:
    """The region's counted pixels at its reference size: a read-only (H, W) bool array (rule 1)."""
    return _raster_cached(_key(check_region(region)))  # type: ignore[arg-type]


def check_region_covers(region: dict[str, Any]) -> dict[str, Any]:
    """The canonical region (``config.region.check_region``), refused when no pixel counts."""
    canonical = check_region(region)
    if canonical is None:
        raise ConfigError("region: give size, include and exclude")
    if not raster(canonical).any():
        h, w = canonical["size"]
        raise ConfigError(f"region: no pixel of the {w} x {h} frame is included (empty include area, or all excluded)")
    return canonical


def region_from_mask(mask: np.ndarray) -> dict[str, Any]:
    """A (H, W) mask (nonzero = include) as a canonical region of include rectangles (rule 2)."""
    m = np.asarray(mask)
    if m.ndim != 2 or m.size == 0:
        raise ConfigError(f"region mask: expected a 2-D image, got shape {m.shape}")
    on = m != 0
    height, width = on.shape
    if not on.any():
        raise ConfigError(f"region mask: no nonzero pixel in the {width} x {height} mask (empty include area)")
    rects: list[list[int]] = []
    open_runs: dict[tuple[int, int], int] = {}  # run (x0, x1) -> first row
    for y in range(height + 1):
        runs: set[tuple[int, int]] = set()
        if y < height:
            edges = np.flatnonzero(np.diff(np.concatenate(([0], on[y].view(np.int8), [0]))))
            runs = {(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)}
        for run in [r for r in open_runs if r not in runs]:
            rects.append([run[0], open_runs.pop(run), run[1], y])
        for run in runs:
            open_runs.setdefault(run, y)
    rects.sort(key=lambda r: (r[1], r[0]))
    return check_region({"size": [height, width], "include": [{"rect": r} for r in rects], "exclude": []})  # type: ignore[return-value]


def reference_map_box(region: dict[str, Any], canvas: int, out: int, geometry: str) -> Box:
    """The box the region's reference frame itself gets on an ``out`` map (rule 3)."""
    height, width = region["size"]
    return scale_box(canvas_box(height, width, canvas, geometry), canvas, out)


def map_mask(reference: np.ndarray, box: tuple[int, int], reference_box: tuple[int, int], geometry: str) -> np.ndarray:
    """The counted map pixels of one image's content box ``(bh, bw)`` (rule 3): a (bh, bw) bool array.

    ``reference``: :func:`raster` of the region; ``reference_box``: (height, width) of
    :func:`reference_map_box`.
    """
    big_h, big_w = reference.shape
    bh, bw = box
    if geometry == "squash" or tuple(box) == tuple(reference_box):
        top, left, fh, fw = 0, 0, bh, bw
    else:
        s = min(bh / big_h, bw / big_w)
        fh = min(bh, max(1, round(big_h * s)))
        fw = min(bw, max(1, round(big_w * s)))
        top, left = (bh - fh) // 2, (bw - fw) // 2
    rows = ((2 * np.arange(fh) + 1) * big_h) // (2 * fh)
    cols = ((2 * np.arange(fw) + 1) * big_w) // (2 * fw)
    out = np.zeros((bh, bw), dtype=bool)
    out[top : top + fh, left : left + fw] = reference[rows][:, cols]
    return out


@functools.lru_cache(maxsize=256)
def _map_mask_cached(key: str, box: tuple[int, int], reference_box: tuple[int, int], geometry: str) -> Tensor:
    return torch.from_numpy(map_mask(_raster_cached(key), box, reference_box, geometry))


def map_masks(region: dict[str, Any], boxes: Sequence[Box], *, canvas: int, out: int, geometry: str) -> list[Tensor]:
    """One bool (box height, box width) mask per image, its content box ``boxes`` in map pixels
    (for squash: the whole ``out x out`` map); CPU tensors, shared: do not modify."""
    region = check_region(region)  # type: ignore[assignment]
    key = _key(region)
    rb = reference_map_box(region, canvas, out, geometry)
    return [_map_mask_cached(key, (b.height, b.width), (rb.height, rb.width), geometry) for b in boxes]


def check_region_visible(region: dict[str, Any], *, canvas: int, out: int, geometry: str) -> None:
    """ConfigError unless the region counts at least one map pixel of an image of its reference
    size (a tiny include area can vanish on a coarse map)."""
    rb = reference_map_box(region, canvas, out, geometry)
    (mask,) = map_masks(region, [Box(0, 0, rb.height, rb.width)], canvas=canvas, out=out, geometry=geometry)
    if not bool(mask.any()):
        h, w = region["size"]
        raise ConfigError(
            f"region: its included area covers no pixel of the {out}-px map of a {w} x {h} frame (draw it larger)"
        )


def covered_share(mask: np.ndarray) -> float:
    """Share of pixels that count (for reports)."""
    return float(np.count_nonzero(mask)) / max(math.prod(mask.shape), 1)


class TilePart(NamedTuple):
    """A tile position's part of a region (rule 4): ``counts`` false when none of its pixels count;
    ``region`` None when all do (or none do), else the part as a region of the tile's size."""

    counts: bool
    region: dict[str, Any] | None


def tile_regions(region: dict[str, Any], tiles: Sequence[Any]) -> list[TilePart]:
    """Each tile's part of ``region`` (rule 4); ``tiles``: rectangles (``top``, ``left``, ``height``,
    ``width``) of the grid at the region's reference size (``core.tiles.tile_grid``)."""
    full = raster(region)
    parts = []
    for t in tiles:
        part = full[t.top : t.top + t.height, t.left : t.left + t.width]
        if part.all():
            parts.append(TilePart(True, None))
        elif not part.any():
            parts.append(TilePart(False, None))
        else:
            parts.append(TilePart(True, region_from_mask(part)))
    return parts


def check_visible(config: DetectorConfig) -> None:
    """ConfigError when ``config``'s inspection region counts no pixel of its fused map
    (:func:`check_region_visible` at the product's canvas, map size and geometry)."""
    if config.region is not None:
        size = config.backbone.image_size
        check_region_visible(
            config.region, canvas=size, out=config.scoring.output_size or size, geometry=config.backbone.geometry
        )


def check_region_change(config: DetectorConfig) -> None:
    """ConfigError when a product of ``config`` may not take another region: one on the ``validation``
    threshold rule, whose labelled threshold was chosen under the old region (every path that
    changes a region asks this, before any work: ``hetmm region``, the service's region job and
    its preview, ``Detector.with_region``)."""
    if config.threshold.rule == "validation":
        raise ConfigError(
            "the product uses the validation threshold rule, chosen on labelled images under its old region: "
            "set the far rule first (hetmm calibrate --far RATE) or refit"
        )

"""A product's inspection region as stored: a reference frame and the shapes that say which pixels count.

Exact semantics of the stored form (the ``region`` setting of a product, :func:`check_region`):

- ``{"size": [height, width], "include": [shape, ...], "exclude": [shape, ...]}``: ``size`` is the
  reference frame in pixels (integers >= 1); the shapes are in that frame's pixel coordinates,
  ``x`` to the right (columns), ``y`` down (rows), the frame spanning ``[0, width] x [0, height]``.
- A shape is ``{"rect": [x0, y0, x1, y1]}`` (``x0 < x1``, ``y0 < y1``) or
  ``{"polygon": [[x, y], ...]}`` (at least 3 points). Coordinates are finite numbers inside the
  frame (``0 <= x <= width``, ``0 <= y <= height``); anything else is refused, never clipped.
- ``include`` and ``exclude`` may be missing or empty. No include shape: the whole frame is
  included. A pixel counts iff it is in some include shape (or there is none) and in no exclude
  shape: exclude wins. Which pixels a shape holds is decided at their centres
  (``core/region.py``); a region whose included area holds no pixel centre is refused there.
- The canonical form (what is stored, compared and returned) has all three keys, integers kept as
  integers, floats as floats, tuples turned into lists. A PNG mask is turned into this form by
  ``core.region.Region.from_mask`` (one rectangle per run of nonzero pixels, equal runs of
  consecutive rows merged), exact at the reference size.
- ``None`` (the default): no region, every pixel counts: products stored before regions existed
  have none and score exactly as before.

This module is pure Python (no numpy): the configuration stays importable anywhere.
"""

from __future__ import annotations

import math
from typing import Any

from ._constraints import ConfigError

__all__ = ["MAX_REGION_SHAPES", "MAX_REGION_SIDE", "check_region"]

MAX_REGION_SIDE = 65_536  # pixels: a reference frame side
MAX_REGION_SHAPES = 20_000  # include + exclude shapes (a mask's rectangles included): keeps manifests small


def _number(where: str, value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{where}: coordinates must be finite numbers, got {value!r}")
    return value


def _point(where: str, x: Any, y: Any, width: int, height: int) -> tuple[int | float, int | float]:
    x, y = _number(where, x), _number(where, y)
    if not (0 <= x <= width and 0 <= y <= height):
        raise ConfigError(f"{where}: point ({x:g}, {y:g}) lies outside the {width} x {height} frame")
    return x, y


def _shape(where: str, shape: Any, width: int, height: int) -> dict[str, Any]:
    if not isinstance(shape, dict) or len(shape) != 1 or next(iter(shape)) not in ("rect", "polygon"):
        raise ConfigError(f'{where}: a shape is {{"rect": [x0, y0, x1, y1]}} or {{"polygon": [[x, y], ...]}}')
    kind, value = next(iter(shape.items()))
    if kind == "rect":
        if not isinstance(value, list | tuple) or len(value) != 4:
            raise ConfigError(f"{where}: rect must be [x0, y0, x1, y1], got {value!r}")
        x0, y0 = _point(where, value[0], value[1], width, height)
        x1, y1 = _point(where, value[2], value[3], width, height)
        if not (x0 < x1 and y0 < y1):
            raise ConfigError(f"{where}: rect needs x0 < x1 and y0 < y1, got {list(value)}")
        return {"rect": [x0, y0, x1, y1]}
    if not isinstance(value, list | tuple) or len(value) < 3:
        raise ConfigError(f"{where}: polygon needs at least 3 points [[x, y], ...]")
    points = []
    for p in value:
        if not isinstance(p, list | tuple) or len(p) != 2:
            raise ConfigError(f"{where}: polygon points are [x, y], got {p!r}")
        points.append(list(_point(where, p[0], p[1], width, height)))
    return {"polygon": points}


def check_region(data: Any) -> dict[str, Any] | None:
    """The canonical stored form of a region (see the module docstring); ConfigError naming what is wrong."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ConfigError(f"region: expected a mapping with size, include, exclude, got {type(data).__name__}")
    unknown = sorted(set(data) - {"size", "include", "exclude"})
    if unknown:
        raise ConfigError(f"region: unknown key {unknown[0]!r}; known: exclude, include, size")
    size = data.get("size")
    if (
        not isinstance(size, list | tuple)
        or len(size) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_REGION_SIDE for v in size)
    ):
        raise ConfigError(f"region.size: must be [height, width], integers in [1, {MAX_REGION_SIDE}], got {size!r}")
    height, width = int(size[0]), int(size[1])
    out: dict[str, Any] = {"size": [height, width]}
    total = 0
    for part in ("include", "exclude"):
        shapes = data.get(part) or []
        if not isinstance(shapes, list | tuple):
            raise ConfigError(f"region.{part}: must be a list of shapes, got {type(shapes).__name__}")
        total += len(shapes)
        out[part] = [_shape(f"region.{part}[{i}]", s, width, height) for i, s in enumerate(shapes)]
    if total > MAX_REGION_SHAPES:
        raise ConfigError(f"region: {total} shapes, at most {MAX_REGION_SHAPES} (simplify the mask)")
    return out

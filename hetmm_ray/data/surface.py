"""A synthetic line frame: a textured surface of a stated size with defects of a stated size in pixels.

:mod:`hetmm_ray.data.synthetic` draws a whole part on one canvas, its defects a fraction of the
image. A line camera sees the opposite: a frame of megapixels, a surface whose texture varies from
part to part, and defects of a few pixels that vanish when the frame is squeezed into one 256-px
canvas. This module makes such frames, deterministic in ``(seed, index)``:

- **Surface** (every part differs): a texture, its strength per part: white noise made into round
  grains about ``grain_px`` across (an isotropic Gaussian filter of standard deviation
  ``grain_px / 3``; 1: per pixel), then brushed (smeared along the rows by a box filter of
  ``brush_px``; 1: not brushed). The default, ``brush_px`` 48 and ``grain_px`` 1, is streaks along
  the rows; ``brush_px`` 1 with a ``grain_px`` of a few px is a mottle with no direction (a cast or
  blasted surface); both 1 is white noise per pixel. Then shading (a linear gradient of
  random direction, up to ``shading`` grey levels across the frame) and a part-wide gain, plus
  Gaussian sensor noise of standard deviation ``noise``, all around a mid-grey.
- **Defects**, sizes in frame pixels, never a fraction of the frame:
  ``scratch``: a straight hairline ``width_px`` wide (1-2 px by default) and ``length_px`` long, at a
  random angle, ``contrast`` grey levels brighter or darker than the surface (moderate: about the
  brushing's own amplitude, so it is plain only at the frame's own scale);
  ``pit``: a dark disc of diameter ``pit_px`` (5-8 px by default) with a faint bright rim.
- **Masks** are geometric: a pixel belongs to a defect when the defect covers at least half of it
  (antialiased coverage >= 0.5), so a 1-px hairline has a 1-px mask whatever its contrast.

:func:`write_surface_layout` writes the MVTec layout (``train/good``, ``test/good``,
``test/<kind>``, ``ground_truth/<kind>/<stem>_mask.png``) as
:func:`hetmm_ray.data.synthetic.write_mvtec_layout` does, so ``hetmm evaluate`` reads it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from scipy import ndimage

from .synthetic import save_layout

__all__ = ["SURFACE_DEFECTS", "SurfaceDefect", "SurfaceDefects", "SyntheticSurface", "write_surface_layout"]

SURFACE_DEFECTS = ("scratch", "pit")


@dataclass(frozen=True)
class SurfaceDefects:
    """Defect sizes in frame pixels: each defect draws its size uniformly from a (low, high) range."""

    scratch_width_px: tuple[float, float] = (1.0, 2.0)
    scratch_length_px: tuple[float, float] = (40.0, 120.0)
    pit_px: tuple[float, float] = (5.0, 8.0)
    contrast: tuple[float, float] = (22.0, 34.0)  # grey levels

    def __post_init__(self) -> None:
        for name in ("scratch_width_px", "scratch_length_px", "pit_px", "contrast"):
            low, high = getattr(self, name)
            if not (0 < low <= high):
                raise ValueError(f"{name} must be a range 0 < low <= high, got {(low, high)}")


class SurfaceDefect(NamedTuple):
    """One drawn defect (:meth:`SyntheticSurface.defect`), sizes in frame pixels.

    ``contrast``: grey levels, signed (a scratch is brighter or darker; a pit is always dark);
    ``size_px``: a scratch's width, a pit's diameter; ``length_px``: a scratch's length (a pit's
    diameter again); ``cy, cx``: its centre; ``direction``: a scratch's angle in radians in
    [0, pi), 0 along the rows (the brushing's direction), 0 for a pit."""

    kind: str
    contrast: float
    size_px: float
    length_px: float
    cy: float
    cx: float
    direction: float

    @property
    def degrees_from_brushing(self) -> float:
        """A scratch's angle to the brushing (the rows), 0-90 degrees: near 0 it runs along the grain."""
        return math.degrees(min(self.direction, math.pi - self.direction))


class SyntheticSurface:
    """Deterministic good and defective frames of ``height x width`` pixels (RGB ``uint8``)."""

    def __init__(
        self,
        *,
        height: int,
        width: int,
        seed: int = 0,
        defects: SurfaceDefects | None = None,
        brush_px: int = 48,
        grain_px: int = 1,
        shading: float = 30.0,
        noise: float = 2.0,
    ) -> None:
        if not (isinstance(height, int) and isinstance(width, int) and height >= 16 and width >= 16):
            raise ValueError(f"frame size must be integers >= 16, got {height} x {width}")
        self.height, self.width, self.seed = height, width, int(seed)
        self.defects = defects or SurfaceDefects()
        self.brush_px, self.grain_px = max(1, int(brush_px)), max(1, int(grain_px))
        self.shading, self.noise = float(shading), float(noise)

    def good(self, index: int) -> np.ndarray:
        """Good part ``index``."""
        return self._finish(self._surface(index), index)

    def with_offset(self, index: int, offset: np.ndarray) -> np.ndarray:
        """Good part ``index`` with ``offset`` (grey levels, float, the frame's shape) added to its
        surface before the sensor noise: what another generator draws on this surface."""
        return self._finish(self._surface(index) + offset, index)

    def defect(self, index: int, kind: str) -> SurfaceDefect:
        """The one defect :meth:`defective` draws on part ``index``: its kind, signed contrast, size,
        place and direction (what a benchmark needs to say which defects were missed, and why)."""
        if kind not in SURFACE_DEFECTS:
            raise ValueError(f"unknown surface defect {kind!r}; choose one of {', '.join(SURFACE_DEFECTS)}")
        rng = np.random.default_rng([self.seed, int(index), 101 + SURFACE_DEFECTS.index(kind)])
        d = self.defects
        contrast = float(rng.uniform(*d.contrast)) * (1.0 if rng.random() < 0.5 else -1.0)
        if kind == "scratch":
            width, length = float(rng.uniform(*d.scratch_width_px)), float(rng.uniform(*d.scratch_length_px))
            length = min(length, 0.8 * min(self.height, self.width))
            cy, cx = self._centre(rng, length / 2 + width + 2)
            psi = float(rng.uniform(0, math.pi))
            return SurfaceDefect(kind, contrast, width, length, cy, cx, psi)
        diameter = float(rng.uniform(*d.pit_px))
        cy, cx = self._centre(rng, diameter / 2 + 4)
        return SurfaceDefect(kind, contrast, diameter, diameter, cy, cx, 0.0)

    def defective(self, index: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
        """Part ``index`` (the same surface as :meth:`good`) with one defect (:meth:`defect`), and
        its bool mask."""
        defect = self.defect(index, kind)
        surface = self._surface(index)
        contrast = defect.contrast
        if kind == "scratch":
            coverage = self._scratch(defect)
            surface += contrast * coverage
        else:
            coverage, rim = self._pit(defect)
            surface += -abs(contrast) * coverage + 0.4 * abs(contrast) * rim
        return self._finish(surface, index), coverage >= 0.5

    # --- rendering ------------------------------------------------------------------------------
    def _surface(self, index: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, int(index)])
        h, w = self.height, self.width
        # Grains: a Gaussian filter, isotropic (a separable box would give square grains whose edges
        # run along the rows and columns, and hide hairlines that do). Brushing: smeared along the
        # rows by a box filter (cumulative sums). Renormalised to unit variance; with grain_px 1 the
        # frames are exactly those drawn before grain_px existed.
        b, g = self.brush_px, self.grain_px
        raw = rng.standard_normal((h, w + b)).astype(np.float32)
        if g > 1:
            raw = ndimage.gaussian_filter(raw, sigma=g / 3.0, mode="wrap")
        c = np.cumsum(raw, axis=1)
        streaks = (c[:, b:] - c[:, :-b]) / math.sqrt(b)
        if g > 1:
            streaks /= max(float(streaks.std()), 1e-6)
        strength = float(rng.uniform(6.0, 10.0))
        angle = float(rng.uniform(0, 2 * math.pi))
        yy = np.linspace(-0.5, 0.5, h, dtype=np.float32)[:, None]
        xx = np.linspace(-0.5, 0.5, w, dtype=np.float32)[None, :]
        shade = self.shading * float(rng.uniform(0.3, 1.0)) * (math.cos(angle) * xx + math.sin(angle) * yy)
        gain = float(rng.uniform(0.95, 1.05))
        return (128.0 + strength * streaks + shade) * gain

    def _finish(self, surface: np.ndarray, index: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, int(index), 1])
        grey = surface + self.noise * rng.standard_normal(surface.shape).astype(np.float32)
        grey = np.clip(np.rint(grey), 0, 255).astype(np.uint8)
        return np.repeat(grey[..., None], 3, axis=2)

    def _centre(self, rng: np.random.Generator, margin: float) -> tuple[float, float]:
        m_y, m_x = min(margin, self.height / 2 - 1), min(margin, self.width / 2 - 1)
        return float(rng.uniform(m_y, self.height - m_y)), float(rng.uniform(m_x, self.width - m_x))

    def _scratch(self, defect: SurfaceDefect) -> np.ndarray:
        width, length, cy, cx, psi = defect.size_px, defect.length_px, defect.cy, defect.cx, defect.direction
        dy, dx = math.sin(psi) * length / 2, math.cos(psi) * length / 2
        ay, ax = cy - dy, cx - dx  # segment from a to a + 2 (dy, dx)
        reach = math.ceil(length / 2 + width + 2)
        r0, r1 = max(0, int(cy) - reach), min(self.height, int(cy) + reach + 1)
        c0, c1 = max(0, int(cx) - reach), min(self.width, int(cx) + reach + 1)
        y, x = np.mgrid[r0:r1, c0:c1].astype(np.float32)
        t = np.clip(((y - ay) * 2 * dy + (x - ax) * 2 * dx) / (4 * (dy * dy + dx * dx)), 0.0, 1.0)
        dist = np.hypot(y - ay - t * 2 * dy, x - ax - t * 2 * dx) - width / 2
        coverage = np.zeros((self.height, self.width), dtype=np.float32)
        coverage[r0:r1, c0:c1] = np.clip(0.5 - dist, 0.0, 1.0)
        return coverage

    def _pit(self, defect: SurfaceDefect) -> tuple[np.ndarray, np.ndarray]:
        radius, cy, cx = defect.size_px / 2, defect.cy, defect.cx
        reach = math.ceil(radius + 4)
        r0, r1 = max(0, int(cy) - reach), min(self.height, int(cy) + reach + 1)
        c0, c1 = max(0, int(cx) - reach), min(self.width, int(cx) + reach + 1)
        y, x = np.mgrid[r0:r1, c0:c1].astype(np.float32)
        dist = np.hypot(y + 0.5 - cy, x + 0.5 - cx) - radius
        coverage = np.zeros((self.height, self.width), dtype=np.float32)
        rim = np.zeros_like(coverage)
        coverage[r0:r1, c0:c1] = np.clip(0.5 - dist, 0.0, 1.0)
        rim[r0:r1, c0:c1] = np.exp(-(((dist - 1.0) / 0.8) ** 2)) * ((dist > 0) & (dist < 3))  # 3 px at most
        return coverage, rim


def write_surface_layout(
    root: str | os.PathLike,
    *,
    height: int,
    width: int,
    n_train: int = 40,
    n_test_good: int = 10,
    n_test_per_defect: int = 5,
    seed: int = 0,
    defects: SurfaceDefects | None = None,
    masks: bool = True,
    kinds: Sequence[str] = SURFACE_DEFECTS,
    brush_px: int = 48,
    grain_px: int = 1,
) -> Path:
    """Write frames of ``height x width`` in the MVTec layout (module docstring) and return ``root``.
    Every frame uses its own index, so train and test never share a surface. ``kinds``: the
    defect folders written (default both), in this order; ``brush_px``, ``grain_px``: the texture,
    as :class:`SyntheticSurface` (module docstring)."""
    unknown = sorted(set(kinds) - set(SURFACE_DEFECTS))
    if unknown or not kinds:
        raise ValueError(f"kinds: choose from {', '.join(SURFACE_DEFECTS)}, got {list(kinds)}")
    surface = SyntheticSurface(
        height=height, width=width, seed=seed, defects=defects, brush_px=brush_px, grain_px=grain_px
    )
    return save_layout(
        root,
        good=surface.good,
        defective=surface.defective,
        kinds=tuple(kinds),
        n_train=n_train,
        n_test_good=n_test_good,
        n_test_per_defect=n_test_per_defect,
        masks=masks,
    )

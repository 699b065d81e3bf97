"""A synthetic cracked product: elongated grey frames, a grain with no direction, thin long faint
cracks, and a good set that is not clean.

What it models (sizes in frame pixels, never a fraction of the frame; deterministic in
``(seed, index)``):

- **Surface**: :class:`~hetmm_ray.data.surface.SyntheticSurface` with round grains and no
  brushing (``brush_px`` 1, ``grain_px`` a few px): a mottle with no direction, as a cast or
  blasted part. Frames ``height x width``, by default 1250 x 500 (an elongated frame: the
  letterbox gives it 40 % of a square canvas).
- **Crack**: a polyline of ``CRACK_STEP_PX``-long steps whose heading starts at any angle and
  turns by a Gaussian of standard deviation ``turn_deg`` per step (curved, never straight), of
  total length ``length_px`` (100-400 by default; shrunk where the frame cannot hold it,
  :meth:`CrackedSurface.crack`), ``width_px`` wide (2-4), tapered to half its
  width at both ends, ``contrast`` grey levels darker than the surface (a sweepable range).
  Rendered antialiased (coverage from the distance to the polyline).
- **Mask**: the pixels the crack covers at least half of, grown by ``mask_margin_px`` (2) in
  every direction, as an annotator draws a band around a crack thinner than the band.
- **Benign marks**: :func:`marked_goods` picks ``mark_rate`` (2 %) of the good training frames,
  at least one, and as many of the good test frames (at least one), evenly spread; each of them
  carries a stain: a soft ellipse ``mark_px`` across (20-40), ``mark_contrast`` (40-60) grey
  levels brighter or darker, at a random place. It is a good part's normal variation, not a
  defect: never in a mask, never in a defective frame; stronger than a crack, so a marked good
  frame scores above the cracks, as the marks of a real line's good set can.

:func:`write_crack_layout` writes the MVTec layout (``train/good``, ``test/good``,
``test/crack``, ``ground_truth/crack/<stem>_mask.png``) that ``hetmm evaluate --data DIR`` reads.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from scipy import ndimage

from .surface import SyntheticSurface
from .synthetic import save_layout

__all__ = ["CRACK_STEP_PX", "CrackDefects", "CrackedSurface", "Crack", "marked_goods", "write_crack_layout"]

CRACK_STEP_PX = 8.0
"""Length of one straight step of a crack's polyline, frame pixels."""


@dataclass(frozen=True)
class CrackDefects:
    """Crack and mark sizes in frame pixels and grey levels: each drawn uniformly from a (low, high)
    range. ``turn_deg``: the standard deviation of the heading's turn per step."""

    width_px: tuple[float, float] = (2.0, 4.0)
    length_px: tuple[float, float] = (100.0, 400.0)
    contrast: tuple[float, float] = (10.0, 18.0)  # grey levels, darker than the surface
    turn_deg: float = 8.0
    mask_margin_px: int = 2
    mark_px: tuple[float, float] = (20.0, 40.0)
    mark_contrast: tuple[float, float] = (40.0, 60.0)

    def __post_init__(self) -> None:
        for name in ("width_px", "length_px", "contrast", "mark_px", "mark_contrast"):
            low, high = getattr(self, name)
            if not (0 < low <= high):
                raise ValueError(f"{name} must be a range 0 < low <= high, got {(low, high)}")
        if not (0 <= self.turn_deg <= 90) or not (0 <= self.mask_margin_px <= 64):
            raise ValueError(
                f"turn_deg must be 0-90 and mask_margin_px 0-64, got {self.turn_deg}, {self.mask_margin_px}"
            )


class Crack(NamedTuple):
    """One drawn crack (:meth:`CrackedSurface.crack`): its polyline's vertices ``(n, 2)`` as (row,
    column), its width and length in frame pixels and its contrast in grey levels (darker)."""

    points: np.ndarray
    width_px: float
    length_px: float
    contrast: float


def marked_goods(n_good: int, rate: float) -> list[int]:
    """Which of ``n_good`` good frames (0-based, in folder order) carry a benign mark: ``round(rate *
    n_good)`` of them, at least one when ``rate > 0``, evenly spread (the middle of each share)."""
    if n_good <= 0 or rate <= 0:
        return []
    n = min(n_good, max(1, round(rate * n_good)))
    return sorted({int((i + 0.5) * n_good / n) for i in range(n)})


class CrackedSurface:
    """Deterministic good, marked and cracked frames of ``height x width`` (RGB ``uint8``)."""

    def __init__(
        self,
        *,
        height: int = 1250,
        width: int = 500,
        seed: int = 0,
        defects: CrackDefects | None = None,
        grain_px: int = 4,
        noise: float = 2.0,
    ) -> None:
        self.surface = SyntheticSurface(
            height=height, width=width, seed=seed, brush_px=1, grain_px=grain_px, noise=noise
        )
        self.height, self.width, self.seed = height, width, int(seed)
        self.defects = defects or CrackDefects()

    def good(self, index: int, *, marked: bool = False) -> np.ndarray:
        """Good part ``index``; ``marked``: with its benign mark (:meth:`mark`)."""
        if not marked:
            return self.surface.good(index)
        return self.surface.with_offset(index, self.mark(index))

    def mark(self, index: int) -> np.ndarray:
        """Part ``index``'s stain as a float grey offset of the frame's shape: a soft ellipse
        (Gaussian edge) at a random place, brighter or darker."""
        rng = np.random.default_rng([self.seed, int(index), 211])
        d = self.defects
        size = float(rng.uniform(*d.mark_px))
        contrast = float(rng.uniform(*d.mark_contrast)) * (1.0 if rng.random() < 0.5 else -1.0)
        ry, rx = size / 2, size / 2 * float(rng.uniform(0.5, 1.0))
        theta = float(rng.uniform(0, math.pi))
        cy = float(rng.uniform(size, self.height - size))
        cx = float(rng.uniform(size, self.width - size))
        y, x = np.mgrid[0 : self.height, 0 : self.width].astype(np.float32)
        u = (y - cy) * math.cos(theta) + (x - cx) * math.sin(theta)
        v = -(y - cy) * math.sin(theta) + (x - cx) * math.cos(theta)
        r = np.sqrt((u / ry) ** 2 + (v / rx) ** 2)
        return (contrast / (1.0 + np.exp(np.minimum((r - 1.0) * 6.0, 60.0)))).astype(np.float32)

    def crack(self, index: int) -> Crack:
        """The crack :meth:`cracked` draws on part ``index``. Its length is at most 80 % of the
        frame's long side and its polyline fits the frame with a margin of its width."""
        rng = np.random.default_rng([self.seed, int(index), 307])
        d = self.defects
        width = float(rng.uniform(*d.width_px))
        length = min(float(rng.uniform(*d.length_px)), 0.8 * max(self.height, self.width))
        contrast = float(rng.uniform(*d.contrast))
        steps = max(1, math.ceil(length / CRACK_STEP_PX))
        heading = float(rng.uniform(0, 2 * math.pi))
        turns = np.radians(d.turn_deg) * rng.standard_normal(steps)
        headings = heading + np.cumsum(turns)
        step = length / steps
        moves = step * np.stack([np.sin(headings), np.cos(headings)], axis=1)
        points = np.vstack([np.zeros((1, 2)), np.cumsum(moves, axis=0)])
        margin = width + 2
        lo, hi = points.min(axis=0), points.max(axis=0)
        extent = hi - lo
        room = np.array([self.height, self.width], dtype=float) - 2 * margin - extent
        if (room < 0).any():  # too long for the frame this way: shrink it about its start
            shrink = float(np.min((np.array([self.height, self.width]) - 2 * margin) / np.maximum(extent, 1e-6)))
            points, length = points * shrink, length * shrink
            lo, extent = points.min(axis=0), points.max(axis=0) - points.min(axis=0)
            room = np.maximum(np.array([self.height, self.width], dtype=float) - 2 * margin - extent, 0.0)
        offset = margin - lo + rng.uniform(0, 1, 2) * room
        return Crack(points + offset, width, length, contrast)

    def coverage(self, crack: Crack) -> np.ndarray:
        """The crack's antialiased coverage in [0, 1] (frame shape): 1 within its half-width of the
        polyline, tapered to half the width over the first and last fifth of its length."""
        pts, width = crack.points, crack.width_px
        reach = width + 2
        r0 = max(0, int(pts[:, 0].min() - reach))
        r1 = min(self.height, int(pts[:, 0].max() + reach) + 1)
        c0 = max(0, int(pts[:, 1].min() - reach))
        c1 = min(self.width, int(pts[:, 1].max() + reach) + 1)
        y, x = np.mgrid[r0:r1, c0:c1].astype(np.float32)
        y, x = y + 0.5, x + 0.5  # pixel centres
        dist = np.full(y.shape, np.inf, dtype=np.float32)
        along = np.zeros(y.shape, dtype=np.float32)  # arc length of the nearest point, 0..1
        seg_len = np.hypot(*np.diff(pts, axis=0).T)
        start = np.r_[0.0, np.cumsum(seg_len)[:-1]]
        total = max(float(seg_len.sum()), 1e-6)
        for (ay, ax), (by, bx), s0, ln in zip(pts[:-1], pts[1:], start, seg_len, strict=True):
            dy, dx = by - ay, bx - ax
            t = np.clip(((y - ay) * dy + (x - ax) * dx) / max(dy * dy + dx * dx, 1e-9), 0.0, 1.0)
            dd = np.hypot(y - ay - t * dy, x - ax - t * dx)
            closer = dd < dist
            dist = np.where(closer, dd, dist)
            along = np.where(closer, (s0 + t * ln) / total, along)
        end = np.minimum(along, 1.0 - along) / 0.2  # 0 at an end, 1 from a fifth of the length on
        half = width / 2 * (0.5 + 0.5 * np.clip(end, 0.0, 1.0))
        out = np.zeros((self.height, self.width), dtype=np.float32)
        out[r0:r1, c0:c1] = np.clip(half + 0.5 - dist, 0.0, 1.0)
        return out

    def cracked(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Part ``index`` (the surface of :meth:`good`) with its crack (:meth:`crack`), and the bool
        mask (module docstring)."""
        crack = self.crack(index)
        coverage = self.coverage(crack)
        frame = self.surface.with_offset(index, -crack.contrast * coverage)
        mask = coverage >= 0.5
        if self.defects.mask_margin_px:
            mask = ndimage.binary_dilation(mask, iterations=self.defects.mask_margin_px)
        return frame, mask


def write_crack_layout(
    root: str | os.PathLike,
    *,
    height: int = 1250,
    width: int = 500,
    n_train: int = 60,
    n_test_good: int = 30,
    n_test_cracked: int = 30,
    seed: int = 0,
    defects: CrackDefects | None = None,
    grain_px: int = 4,
    mark_rate: float = 0.02,
) -> Path:
    """Write the cracked product in the MVTec layout (module docstring) and return ``root``: good
    frames in ``train/good`` and ``test/good`` (those :func:`marked_goods` names with a benign
    mark), cracked ones in ``test/crack`` with masks. Every frame is a part of its own."""
    surface = CrackedSurface(height=height, width=width, seed=seed, defects=defects, grain_px=grain_px)
    marked = {*marked_goods(n_train, mark_rate), *(n_train + i for i in marked_goods(n_test_good, mark_rate))}
    return save_layout(
        root,
        good=lambda index: surface.good(index, marked=index in marked),
        defective=lambda index, _kind: surface.cracked(index),
        kinds=("crack",),
        n_train=n_train,
        n_test_good=n_test_good,
        n_test_per_defect=n_test_cracked,
    )

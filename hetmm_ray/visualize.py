"""Heat-map overlays for people: anomaly maps drawn over the inspected image.

Exact semantics: :func:`draw_overlay` is the one picture of a scored frame, drawn the same by
``hetmm predict --out``, ``hetmm inspect --heatmaps``, the service's ``heatmap_png``, ``hetmm
compare`` and the ``evaluate --report`` gallery: the map colourised on the product version's fixed
scale (:func:`heatmap_range`: 0 to ``HEATMAP_VMAX_OVER_THRESHOLD`` x the threshold), blended half
and half over the frame at the frame's size (:func:`heatmap_overlay`), the pixels outside an
inspection region greyed, and, where a ground-truth mask is given, its outline drawn over all of it
in :data:`MASK_OUTLINE_RGB` (:func:`mask_outline`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from .config import HEATMAP_VMAX_OVER_THRESHOLD

__all__ = [
    "MASK_OUTLINE_RGB",
    "colorize",
    "draw_overlay",
    "heatmap_overlay",
    "heatmap_range",
    "mask_outline",
    "save_png",
]

# Magenta: a colour the heat ramp below never takes, so an outline never reads as heat.
MASK_OUTLINE_RGB = (255, 0, 255)

# A perceptually ordered dark-blue -> cyan -> yellow -> red ramp ("jet"-like but
# without the harsh green band), as (position, RGB) stops.
_STOPS = np.array(
    [
        [0.00, 0, 0, 80],
        [0.20, 0, 60, 200],
        [0.40, 0, 190, 230],
        [0.60, 120, 230, 80],
        [0.80, 250, 200, 0],
        [1.00, 220, 20, 10],
    ],
    dtype=np.float64,
)


def colorize(values: np.ndarray) -> np.ndarray:
    """Values in [0, 1] -> RGB uint8 through the colour ramp."""
    v = np.clip(np.nan_to_num(values.astype(np.float64)), 0.0, 1.0)
    rgb = np.stack([np.interp(v, _STOPS[:, 0], _STOPS[:, c]) for c in (1, 2, 3)], axis=-1)
    return rgb.round().astype(np.uint8)


def heatmap_overlay(
    image: np.ndarray,
    amap: np.ndarray,
    *,
    vmin: float | None = None,
    vmax: float | None = None,
    alpha: float = 0.5,
    region: np.ndarray | None = None,
) -> np.ndarray:
    """Blend a colourised anomaly map over an RGB uint8 image, at the image's size.

    The map is scaled to [vmin, vmax] (default: its own min and max; pass a
    fixed range to compare images with each other).

    ``region`` (bool, the map's shape; ``Prediction.regions``): pixels outside the product's
    inspection region never count, and are drawn greyed: the image's luma, halved towards mid
    grey, without heat colour (the mask resized to the image by nearest neighbour).
    """
    lo = float(amap.min()) if vmin is None else vmin
    hi = float(amap.max()) if vmax is None else vmax
    norm = (amap - lo) / max(hi - lo, 1e-12)
    h, w = image.shape[:2]
    resized = np.asarray(Image.fromarray(norm.astype(np.float32), mode="F").resize((w, h), Image.Resampling.BILINEAR))
    heat = colorize(resized).astype(np.float32)
    out = image.astype(np.float32) * (1 - alpha) + heat * alpha
    if region is not None:
        inside = (
            np.asarray(
                Image.fromarray(np.asarray(region, dtype=np.uint8) * 255).resize((w, h), Image.Resampling.NEAREST)
            )
            > 0
        )
        luma = image.astype(np.float32) @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
        out = np.where(inside[..., None], out, (0.5 * luma + 64.0)[..., None])
    return out.round().clip(0, 255).astype(np.uint8)


def heatmap_range(amap: np.ndarray, threshold: float) -> tuple[float, float]:
    """One image's colour scale ``(vmin, vmax)``, the same in the CLI and over HTTP.

    From 0 to ``config.HEATMAP_VMAX_OVER_THRESHOLD`` times the verdict threshold: one fixed
    scale per product version, so maps compare with each other and never depend on the other
    images scored with them. Before calibration (threshold ``inf``): 0 to the map's own peak.
    """
    if np.isfinite(threshold):
        return 0.0, HEATMAP_VMAX_OVER_THRESHOLD * float(threshold)
    return 0.0, float(np.max(amap))


def mask_outline(mask: np.ndarray, height: int, width: int) -> np.ndarray:
    """The outline of a ground-truth ``mask`` at ``height x width``, as a bool array.

    The mask is brought to that size with a box filter and every pixel any mask pixel falls in
    counts as inside (a defect one pixel wide in a large frame stays visible in a thumbnail). The
    outline is the inside pixels with a 4-neighbour outside (the image border counts as outside),
    thickened to ``max(1, round(max(height, width) / 160))`` pixels so it reads at any size.
    """
    m = np.asarray(mask).astype(np.float32)
    if m.ndim != 2:
        raise ValueError(f"a mask is 2-D, got shape {m.shape}")
    inside = np.asarray(Image.fromarray(m, mode="F").resize((width, height), Image.Resampling.BOX)) > 0
    edge = np.zeros_like(inside)
    padded = np.pad(inside, 1, constant_values=False)
    for dy, dx in ((0, 1), (2, 1), (1, 0), (1, 2)):
        edge |= inside & ~padded[dy : dy + height, dx : dx + width]
    for _ in range(max(1, round(max(height, width) / 160)) - 1):
        grown = np.pad(edge, 1, constant_values=False)
        edge = edge | grown[:-2, 1:-1] | grown[2:, 1:-1] | grown[1:-1, :-2] | grown[1:-1, 2:]
    return edge


def draw_overlay(
    image: np.ndarray,
    amap: np.ndarray,
    *,
    threshold: float,
    region: np.ndarray | None = None,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """The picture of one scored frame (module docstring), RGB uint8 at ``image``'s size.

    ``image``: the frame as the detector saw it (``Detector.input_view``), or that view resized
    (a thumbnail: the map is drawn at the image's size whatever its own); ``threshold``: the
    verdict threshold the colour scale comes from; ``region``: the map's inspection region
    (outside greyed); ``mask``: a ground-truth mask of any size, outlined.
    """
    vmin, vmax = heatmap_range(amap, threshold)
    out = heatmap_overlay(image, amap, vmin=vmin, vmax=vmax, region=region)
    if mask is not None:
        out[mask_outline(mask, out.shape[0], out.shape[1])] = MASK_OUTLINE_RGB
    return out


def save_png(array: np.ndarray, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(p, format="PNG")
    return p

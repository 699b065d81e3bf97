"""Image geometry: how an image of any aspect reaches the backbone's square input, and back.

Two modes (``backbone.geometry``), both to a canvas of ``S x S`` (``S = image_size``):

- ``squash``: bilinear resize to ``S x S``; the aspect is not kept. The content box is the
  whole canvas, so nothing below changes anything (the behaviour of every product made
  before this setting existed).
- ``letterbox``: bilinear resize so the long side is ``S`` and the short side
  ``max(1, round(short * S / long))``, placed centred (``top = (S - h) // 2``,
  ``left = (S - w) // 2``) on a canvas filled with the ImageNet mean, i.e. zeros after the
  backbone's normalisation: the same values a convolution's zero padding supplies at an
  image border, so content next to the pad sees what content at a squashed image's border
  sees. A square image gives the whole canvas, exactly the squash input.

Padded pixels never count, at every stage (``Box`` = content rectangle in canvas pixels):

1. Features. Cell ``(i, j)`` of a layer with ``h x w`` cells is content iff its centre
   ``((i + 0.5) S / h, (j + 0.5) S / w)`` lies in the box; a box thinner than one cell keeps
   the cell holding its centre line. The content cells form a rectangle
   (:func:`cell_boxes`). :func:`zero_padding` sets every other cell's feature vector to
   zero, in queries and in the template bank alike. A zero vector has cosine 0 with
   everything, so in ATMM a pad candidate never beats a real match with positive cosine:
   a query pixel next to the pad is scored against the part texture in its window, not
   against pad features. (Exactly: a pad candidate counts as similarity 0, the "no
   evidence of normality" value; a window whose real candidates all have cosine <= 0
   scores 1 instead of more.)
2. Layer maps. Before the bilinear upsample, each layer map's pad cells are overwritten
   by the nearest content cell (edge replication, :func:`replicate_into_padding`), so
   interpolation near the box edge mixes content values only; whatever a pad cell held
   (forward ATM of a zero query vector is 1) never leaks in.
3. The fused map is cropped to the box (scaled to the output size, :func:`scale_box`). The
   image score's blur (reflect padding at the crop's edge, as squash does at the image's
   edge) and max run on the crop, so no pad pixel enters the score and a defect at the
   content edge is not diluted by pad values. The crop is the localisation map: it comes
   back at the image's own aspect.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "GEOMETRIES",
    "PAD_VALUE",
    "Box",
    "boxes_from_features",
    "canvas_box",
    "cell_boxes",
    "crop",
    "replicate_into_padding",
    "resized_shape",
    "scale_box",
    "zero_padding",
]

GEOMETRIES = ("squash", "letterbox")
PAD_VALUE = (0.485, 0.456, 0.406)
"""Canvas fill in [0, 1] RGB: the ImageNet mean (``core.backbone.IMAGENET_MEAN``), 0 once normalised."""


class Box(NamedTuple):
    """A content rectangle on a square canvas: rows ``top:top+height``, columns ``left:left+width``."""

    top: int
    left: int
    height: int
    width: int

    def is_full(self, size: int) -> bool:
        return self == (0, 0, size, size)


def resized_shape(height: int, width: int, size: int, geometry: str) -> tuple[int, int]:
    """(h, w) the image is resized to before it is placed on the ``size x size`` canvas."""
    if geometry == "squash":
        return size, size
    if geometry != "letterbox":
        raise ValueError(f"unknown geometry {geometry!r}; choose one of {', '.join(GEOMETRIES)}")
    if height >= width:
        return size, max(1, round(width * size / height))
    return max(1, round(height * size / width)), size


def canvas_box(height: int, width: int, size: int, geometry: str) -> Box:
    """Where an image of ``height x width`` lands on the canvas."""
    h, w = resized_shape(height, width, size, geometry)
    return Box((size - h) // 2, (size - w) // 2, h, w)


def scale_box(box: Box, size: int, out: int) -> Box:
    """``box`` on a ``size`` canvas mapped to an ``out`` canvas (edges rounded, at least 1 pixel)."""
    if out == size:
        return box
    f = out / size
    top, left = round(box.top * f), round(box.left * f)
    bottom, right = round((box.top + box.height) * f), round((box.left + box.width) * f)
    return Box(top, left, max(1, bottom - top), max(1, right - left))


def _cell_range(start: int, length: int, size: int, cells: int) -> tuple[int, int]:
    """Cells ``[a, b)`` whose centres ``(i + 0.5) * size / cells`` lie in ``[start, start + length)``."""
    # centre in range  <=>  start <= (i + .5) s / n < start + length  <=>  2 i n... solved exactly
    # in integers: (2i + 1) * size >= 2 * start * cells  and  (2i + 1) * size < 2 * (start + length) * cells.
    a = -(-(2 * start * cells - size) // (2 * size))  # ceil
    b = -(-(2 * (start + length) * cells - size) // (2 * size))  # first i failing the upper bound
    a, b = max(a, 0), min(b, cells)
    if b <= a:  # thinner than a cell: the cell holding the centre line
        a = min(cells - 1, max(0, int((start + length / 2) * cells / size)))
        b = a + 1
    return a, b


def cell_boxes(boxes: Sequence[Box], size: int, cells: tuple[int, int]) -> list[Box]:
    """The content cells of each box on a layer of ``cells = (h, w)``, as a Box in cell units."""
    h, w = cells
    out = []
    for box in boxes:
        r0, r1 = _cell_range(box.top, box.height, size, h)
        c0, c1 = _cell_range(box.left, box.width, size, w)
        out.append(Box(r0, c0, r1 - r0, c1 - c0))
    return out


def _cell_mask(cells: Sequence[Box], h: int, w: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    mask = torch.zeros((len(cells), 1, h, w), dtype=dtype, device=device)
    for b, cb in enumerate(cells):
        mask[b, :, cb.top : cb.top + cb.height, cb.left : cb.left + cb.width] = 1
    return mask


def zero_padding(features: dict[str, Tensor], boxes: Sequence[Box], size: int) -> dict[str, Tensor]:
    """Every layer's (B, C, h, w) features with the pad cells set to zero (new tensors)."""
    out = {}
    for name, feats in features.items():
        h, w = feats.shape[2:]
        cells = cell_boxes(boxes, size, (h, w))
        if all(cb == (0, 0, h, w) for cb in cells):
            out[name] = feats
        else:
            out[name] = feats * _cell_mask(cells, h, w, feats.device, feats.dtype)
    return out


def replicate_into_padding(layer_map: Tensor, cells: Sequence[Box]) -> Tensor:
    """(B, h, w) layer maps with each pad cell replaced by its nearest content cell (new tensor)."""
    _, h, w = layer_map.shape
    if all(cb == (0, 0, h, w) for cb in cells):
        return layer_map
    out = []
    for m, cb in zip(layer_map, cells, strict=True):
        rows = torch.arange(h, device=m.device).clamp(cb.top, cb.top + cb.height - 1)
        cols = torch.arange(w, device=m.device).clamp(cb.left, cb.left + cb.width - 1)
        out.append(m[rows][:, cols])
    return torch.stack(out)


def boxes_from_features(features: dict[str, Tensor], size: int) -> list[Box]:
    """Canvas boxes recovered from zeroed features (bank images whose boxes were not kept):
    the content cells of the finest layer, scaled to canvas pixels. Exact on a cell grid, so
    within half a cell of :func:`canvas_box`; full boxes where nothing was zeroed."""
    finest = max(features.values(), key=lambda f: f.shape[2] * f.shape[3])
    h, w = finest.shape[2:]
    content = finest.abs().amax(dim=1) > 0  # (B, h, w): a real feature is a unit vector
    boxes = []
    for c in content:
        rows = torch.nonzero(c.any(dim=1)).flatten()
        cols = torch.nonzero(c.any(dim=0)).flatten()
        if rows.numel() == 0 or (rows.numel() == h and cols.numel() == w):
            boxes.append(Box(0, 0, size, size))
            continue
        r0, r1 = int(rows[0]) * size // h, (int(rows[-1]) + 1) * size // h
        c0, c1 = int(cols[0]) * size // w, (int(cols[-1]) + 1) * size // w
        boxes.append(Box(r0, c0, r1 - r0, c1 - c0))
    return boxes


def crop(maps: Tensor, boxes: Sequence[Box]) -> list[Tensor]:
    """The content of each (H, W) map: a list of (height, width) views."""
    return [m[b.top : b.top + b.height, b.left : b.left + b.width] for m, b in zip(maps, boxes, strict=True)]

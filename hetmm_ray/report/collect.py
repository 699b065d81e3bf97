"""The report's gallery and curves, gathered as ``evaluate`` streams the test frames.

Exact semantics of :class:`ReportCollector`:

- It owns ``DIR/gallery/``: on construction the folder is made and emptied of PNGs; every picture
  the gallery shows is written there as soon as its frame is drawn, so thumbnails never pile up
  in memory.
- ``offer`` is called once per test frame, in the evaluation's order, with its score, verdict,
  map, ground-truth mask and region. The frame sorts into one of four kinds: ``false alarm`` (good,
  flagged), ``miss`` (defective, passed), ``good near`` (good, passed) and ``defect near``
  (defective, flagged). Each kind counts every frame. The two error kinds keep every frame; the
  two near kinds keep at most ``near`` entries each, the closest to the threshold on the right
  side of it: the highest scores of the good frames passed, the lowest of the defects caught; ties
  keep the earlier frame. An entry pushed out of a near kind has its two files removed.
- A frame is drawn (decoded again through ``frame()``, resized, overlaid, written as
  ``NNNNNN-frame.png`` and ``NNNNNN-overlay.png``, numbered by arrival) only when it is kept, so the
  drawing cost is bounded by the kept entries plus those later pushed out. What stays in memory is
  a path, a type and a score per error, and the near kinds' bounded heaps of the same.
- ``entries(kind)``: the kept entries of ``kind``, worst first (errors: false alarms highest score
  first, misses lowest first), ties in arrival order.
- ``set_pro_curve`` keeps the PRO curve resampled on a fixed FPR grid (a plot, not a measurement:
  the PRO figure itself comes from the full curve).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ..config import REPORT_GALLERY_NEAR, REPORT_THUMBNAIL_PX
from ..visualize import draw_overlay, save_png

__all__ = ["GALLERY_KINDS", "GalleryEntry", "ReportCollector", "thumbnail"]

# In the order the page shows them.
GALLERY_KINDS = ("false alarm", "miss", "good near", "defect near")
ERROR_KINDS = ("false alarm", "miss")
_PRO_GRID = np.linspace(0.0, 1.0, 1001)


@dataclass(frozen=True)
class GalleryEntry:
    kind: str  # one of GALLERY_KINDS
    path: str
    defect_type: str
    score: float
    is_anomaly: bool
    frame_file: str  # under the collector's gallery folder: the thumbnail (:func:`thumbnail`) of the frame
    overlay_file: str  # draw_overlay of the same, with the mask outline


def thumbnail(image: np.ndarray, side: int) -> np.ndarray:
    """``image`` resized (bilinear, aspect kept) to the area of a ``side`` x ``side`` square, its long
    side at most ``2 * side``: a wide frame's thumbnail is as legible as a square one's."""
    h, w = image.shape[:2]
    f = min(side / (h * w) ** 0.5, 2 * side / max(h, w))
    size = (max(1, round(w * f)), max(1, round(h * f)))
    return np.asarray(Image.fromarray(np.ascontiguousarray(image)).resize(size, Image.Resampling.BILINEAR))


class ReportCollector:
    """The gallery (drawn to ``directory/gallery`` as frames come) and the PRO curve of one
    evaluation (module docstring)."""

    def __init__(
        self,
        directory: str | Path,
        *,
        near: int = REPORT_GALLERY_NEAR,
        thumbnail_px: int = REPORT_THUMBNAIL_PX,
    ) -> None:
        for name, value, least in (("near", near, 0), ("thumbnail_px", thumbnail_px, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        self.directory = Path(directory)
        self.gallery = self.directory / "gallery"
        self.gallery.mkdir(parents=True, exist_ok=True)
        for old in self.gallery.glob("*.png"):
            old.unlink()
        self.near = near
        self.thumbnail_px = thumbnail_px
        self.counts = dict.fromkeys(GALLERY_KINDS, 0)
        self._errors: dict[str, list[tuple[float, int, GalleryEntry]]] = {k: [] for k in ERROR_KINDS}
        # min-heaps of (key, -arrival, entry): the root is the entry the next closer frame pushes out
        self._heaps: dict[str, list[tuple[float, int, GalleryEntry]]] = {"good near": [], "defect near": []}
        self._arrival = itertools.count()
        self.pro_fpr: np.ndarray | None = None
        self.pro_values: np.ndarray | None = None
        self.pro_fpr_limit: float | None = None

    def offer(
        self,
        *,
        path: str,
        defect_type: str,
        label: int,
        score: float,
        is_anomaly: bool,
        amap: np.ndarray,
        threshold: float,
        frame: Callable[[], np.ndarray],
        mask: np.ndarray | None = None,
        region: np.ndarray | None = None,
    ) -> None:
        good = label == 0
        kind = ("false alarm" if is_anomaly else "good near") if good else ("defect near" if is_anomaly else "miss")
        self.counts[kind] += 1
        key = float(score) if good else -float(score)  # larger: worse, or closer to the threshold
        number = next(self._arrival)
        order = -number  # an earlier frame wins a tie: it is the larger

        def drawn() -> GalleryEntry:
            view = thumbnail(frame(), self.thumbnail_px)
            overlay = draw_overlay(view, amap, threshold=threshold, region=region, mask=mask if not good else None)
            frame_file = save_png(view, self.gallery / f"{number:06d}-frame.png").name
            overlay_file = save_png(overlay, self.gallery / f"{number:06d}-overlay.png").name
            return GalleryEntry(kind, path, defect_type, float(score), bool(is_anomaly), frame_file, overlay_file)

        if kind in ERROR_KINDS:
            self._errors[kind].append((key, order, drawn()))
            return
        heap = self._heaps[kind]
        if self.near == 0 or (len(heap) == self.near and (key, order) <= heap[0][:2]):
            return
        if len(heap) < self.near:
            heapq.heappush(heap, (key, order, drawn()))
        else:
            _, _, out = heapq.heapreplace(heap, (key, order, drawn()))
            (self.gallery / out.frame_file).unlink(missing_ok=True)
            (self.gallery / out.overlay_file).unlink(missing_ok=True)

    def entries(self, kind: str) -> list[GalleryEntry]:
        """The kept entries of ``kind``, worst first (module docstring)."""
        kept = self._errors[kind] if kind in ERROR_KINDS else self._heaps[kind]
        return [e for _, _, e in sorted(kept, key=lambda t: t[:2], reverse=True)]

    def set_pro_curve(self, fpr: Any, pro: Any, fpr_limit: float) -> None:
        """The PRO curve's points (``PixelMetrics.pro_curve``), kept on a fixed FPR grid."""
        f = np.asarray(fpr, dtype=np.float64)
        p = np.asarray(pro, dtype=np.float64)
        self.pro_fpr = _PRO_GRID.copy()
        self.pro_values = np.interp(_PRO_GRID, f, p)
        self.pro_fpr_limit = float(fpr_limit)

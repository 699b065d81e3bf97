"""The report's gallery and curves, gathered as ``evaluate`` streams the test frames.

Exact semantics of :class:`ReportCollector`:

- ``offer`` is called once per test frame, in the evaluation's order, with its score, verdict,
  map, ground-truth mask and region. The frame sorts into one of four kinds: ``false alarm`` (good,
  flagged), ``miss`` (defective, passed), ``good near`` (good, passed) and ``defect near``
  (defective, flagged). Each kind counts every frame and keeps at most its cap of entries, the
  worst of their kind: the highest scores for the two good kinds, the lowest for the two defective
  ones; ties keep the earlier frame.
- A frame is drawn (decoded again through ``frame()``, resized, overlaid) only when it enters its
  heap, so the cost is bounded by the kept entries plus those later pushed out, and memory by the
  caps times two thumbnails.
- ``set_pro_curve`` keeps the PRO curve resampled on a fixed FPR grid (a plot, not a measurement:
  the PRO figure itself comes from the full curve).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from ..config import REPORT_GALLERY_ERRORS, REPORT_GALLERY_NEAR, REPORT_THUMBNAIL_PX
from ..visualize import draw_overlay

__all__ = ["GALLERY_KINDS", "GalleryEntry", "ReportCollector", "thumbnail"]

# In the order the page shows them.
GALLERY_KINDS = ("false alarm", "miss", "good near", "defect near")
_PRO_GRID = np.linspace(0.0, 1.0, 1001)


@dataclass(frozen=True)
class GalleryEntry:
    kind: str  # one of GALLERY_KINDS
    path: str
    defect_type: str
    score: float
    is_anomaly: bool
    frame: np.ndarray  # RGB uint8 thumbnail (:func:`thumbnail`) of the frame as the detector saw it
    overlay: np.ndarray  # draw_overlay of the same, with the mask outline


def thumbnail(image: np.ndarray, side: int) -> np.ndarray:
    """``image`` resized (bilinear, aspect kept) to the area of a ``side`` x ``side`` square, its long
    side at most ``2 * side``: a wide frame's thumbnail is as legible as a square one's."""
    h, w = image.shape[:2]
    f = min(side / (h * w) ** 0.5, 2 * side / max(h, w))
    size = (max(1, round(w * f)), max(1, round(h * f)))
    return np.asarray(Image.fromarray(np.ascontiguousarray(image)).resize(size, Image.Resampling.BILINEAR))


class ReportCollector:
    """Bounded gallery heaps and the PRO curve of one evaluation (module docstring)."""

    def __init__(
        self,
        *,
        errors: int = REPORT_GALLERY_ERRORS,
        near: int = REPORT_GALLERY_NEAR,
        thumbnail_px: int = REPORT_THUMBNAIL_PX,
    ) -> None:
        for name, value in (("errors", errors), ("near", near), ("thumbnail_px", thumbnail_px)):
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if name == "thumbnail_px" else 0):
                raise ValueError(f"{name} must be an integer >= {1 if name == 'thumbnail_px' else 0}, got {value!r}")
        self.caps = {"false alarm": errors, "miss": errors, "good near": near, "defect near": near}
        self.thumbnail_px = thumbnail_px
        self.counts = dict.fromkeys(GALLERY_KINDS, 0)
        # min-heaps of (key, -arrival, entry): the root is the entry the next worse frame pushes out
        self._heaps: dict[str, list[tuple[float, int, GalleryEntry]]] = {k: [] for k in GALLERY_KINDS}
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
        key = float(score) if good else -float(score)  # larger: worse of its kind
        heap, cap = self._heaps[kind], self.caps[kind]
        order = -next(self._arrival)  # an earlier frame wins a tie: it is the larger
        if cap == 0 or (len(heap) == cap and (key, order) <= heap[0][:2]):
            return
        view = thumbnail(frame(), self.thumbnail_px)
        overlay = draw_overlay(view, amap, threshold=threshold, region=region, mask=mask if not good else None)
        entry = GalleryEntry(kind, path, defect_type, float(score), bool(is_anomaly), view, overlay)
        if len(heap) < cap:
            heapq.heappush(heap, (key, order, entry))
        else:
            heapq.heapreplace(heap, (key, order, entry))

    def entries(self, kind: str) -> list[GalleryEntry]:
        """The kept entries of ``kind``, worst first."""
        return [e for _, _, e in sorted(self._heaps[kind], key=lambda t: t[:2], reverse=True)]

    def set_pro_curve(self, fpr: Any, pro: Any, fpr_limit: float) -> None:
        """The PRO curve's points (``PixelMetrics.pro_curve``), kept on a fixed FPR grid."""
        f = np.asarray(fpr, dtype=np.float64)
        p = np.asarray(pro, dtype=np.float64)
        self.pro_fpr = _PRO_GRID.copy()
        self.pro_values = np.interp(_PRO_GRID, f, p)
        self.pro_fpr_limit = float(fpr_limit)

"""What every product's detector answers, whether it scores a frame on one canvas or in tiles.

Exact semantics (both implementations hold them; ``detector.HETMM`` scores a frame on one canvas,
``tiled.TiledHETMM`` cuts it into tiles, each tile position a small product of its own):

- **Input.** Every call that takes images takes whole frames: file paths, encoded bytes or decoded
  ``(H, W, 3)`` uint8 arrays (``scorer.ImageInput``). The detector brings them to its canvas (or
  cuts its tiles) itself; no caller resizes.
- **Digests.** A frame's digest is ``core.device.image_digest`` of the frame as decoded, before any
  resize, on every path (fit, update, the service, the archive): the same images give the same
  digests, hence the same folds and the same "already held" decisions.
- **The members** (twelve; ``config`` and ``version``, None while unsaved, are plain attributes):

  - ``fit(frames)``, ``update(frames)`` (hot update: frames already held are skipped, so the bank
    grows by the new ones only), ``drop(digests)``, ``compress(kind, sheets, seed=)`` change this
    detector in place and leave it unsaved (``version`` None) when anything changed;
    ``with_region(region)`` returns a new, unsaved detector with the same templates recalibrated
    under ``region``; it refuses a product on the ``validation`` threshold rule
    (:func:`~hetmm_ray.core.region.check_region_change`).
  - ``template_set()`` is what a store holds for this detector (one set; a tiled product's
    positions ride inside it, :func:`~hetmm_ray.detection.tiled.position_sets` reads them back);
    the facts of the bank are its own: ``image_digests``, ``n_images``, ``sheets`` (a tiled
    product's: position 0's), ``weights_id``. ``save(store, product)`` publishes it and sets
    ``version``.
  - ``predict(frames, sigmas=, false_alarm_rate=)`` returns a
    :class:`~hetmm_ray.detection.scorer.Prediction` (its maps at :meth:`~Detector.input_view`'s
    resolution). ``operating_point(sigmas=, false_alarm_rate=)`` / ``calibration``: the verdict
    rule on the product's out-of-fold scores (a tiled product's are per frame; None before a fit).
  - ``layout(h, w)``: how an ``h x w`` frame is cut (:class:`Layout`).

- **Facts of the configuration** (plain functions of ``config``, whichever class):
  :func:`frame_grid` (rows and columns of tiles per frame), :func:`tiles_per_frame` (their count),
  :func:`frames_per_pass` (frames ``predict`` takes through the backbone together) and
  :func:`stream_chunk` (whole passes of them a streaming caller scores at a time, with the scores of
  one call on every frame).
- **Elsewhere.** ``hetmm_ray.detection.detector_choice`` is the one place that chooses an
  implementation: ``load_detector`` (the one loader), ``new_detector`` (the one constructor; its
  ``report=`` option sends a fit's stages and counts to a job's progress), ``frame_cost_of`` and
  ``ms_per_frame_of`` (the measured cost model of one frame, ``frame_cost.FrameCost``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from ..config import DetectorConfig
from ..core.region import check_region_change
from ..core.scoring import Calibration, OperatingPoint
from ..core.templates import TemplateSet

if TYPE_CHECKING:  # annotations only: the scorer imports the backbones, which the facts below do not need
    from ..store.protocol import Store
    from .scorer import ImageInput, Prediction

__all__ = [
    "Detector",
    "Layout",
    "frame_grid",
    "frames_per_pass",
    "positions_per_frame",
    "stream_chunk",
    "tiles_per_frame",
]


@dataclass(frozen=True)
class Layout:
    """How a ``height x width`` frame reaches the canvas: ``rows x cols`` tiles (1 x 1: the frame
    itself), the first tile's size, whether the whole frame is one more position, and how many tiles
    the product's region leaves wholly out."""

    rows: int
    cols: int
    tile_height: int
    tile_width: int
    height: int
    width: int
    whole_view: bool = False
    tiles_outside_region: int = 0

    @property
    def tiles(self) -> int:
        return self.rows * self.cols

    @property
    def per_tile(self) -> str:
        """`` per tile`` after a count that is per tile position; nothing for one canvas."""
        return " per tile" if self.tiles > 1 else ""

    def fitted_note(self) -> str:
        """``4 tiles + the whole view; `` in a fit's summary; nothing for one canvas."""
        return f"{self.tiles} tiles{' + the whole view' if self.whole_view else ''}; " if self.tiles > 1 else ""

    def region_note(self) -> str:
        """``; 1 of 4 tiles wholly outside it`` after a region's description; nothing for one canvas."""
        return f"; {self.tiles_outside_region} of {self.tiles} tiles wholly outside it" if self.tiles > 1 else ""

    def describe(self, image_size: int) -> str:
        """``tiles 2 x 2 (4 per frame, 512 x 512 px of a 1024 x 1024 frame, 2.00 frame px per canvas px)``."""
        scale = max(self.tile_height, self.tile_width) / image_size
        if self.tiles == 1:
            part = f"a {self.height} x {self.width} frame"
        else:
            part = f"{self.tile_height} x {self.tile_width} px of a {self.height} x {self.width} frame"
        return f"tiles {self.rows} x {self.cols} ({self.tiles} per frame, {part}, {scale:.2f} frame px per canvas px)"


class Detector(ABC):
    """A product's detector (module docstring): one interface, two implementations."""

    config: DetectorConfig
    version: int | None

    # --- templates ------------------------------------------------------------------------
    @abstractmethod
    def fit(self, frames: Sequence[ImageInput]) -> Self:
        """Templates and calibration from good frames."""

    @abstractmethod
    def update(self, frames: Sequence[ImageInput]) -> Self:
        """Hot update: new good frames added, frames already held skipped."""

    @abstractmethod
    def drop(self, digests: Sequence[str]) -> Self:
        """The good frames of ``digests`` removed from the bank, re-selected and recalibrated."""

    @abstractmethod
    def compress(self, kind: str | None = None, sheets: int | str | None = None, *, seed: int | None = None) -> Self:
        """The selection made again from the bank (PTS or a baseline), recalibrated."""

    def with_region(self, region: dict[str, Any] | None) -> Detector:
        """This product under another inspection region (None: every pixel), recalibrated; refused
        for a product on the ``validation`` rule (its labelled threshold was chosen under the old region)."""
        check_region_change(self.config)
        return self._with_region(region)

    @abstractmethod
    def _with_region(self, region: dict[str, Any] | None) -> Detector: ...

    @abstractmethod
    def template_set(self) -> TemplateSet:
        """What the store holds for this detector (one set): its bank's digests, image count,
        sheets and weights are this set's."""

    def save(self, store: Store, product: str) -> int:
        """Publish :meth:`template_set` as a new version of ``product``; returns it."""
        self.version = int(store.put(product, self.template_set()))
        return self.version

    # --- scoring --------------------------------------------------------------------------
    @property
    @abstractmethod
    def calibration(self) -> Calibration | None:
        """The out-of-fold calibration the verdict threshold is set on (None before a fit)."""

    @abstractmethod
    def operating_point(
        self, *, sigmas: float | None = None, false_alarm_rate: float | None = None
    ) -> OperatingPoint | None:
        """The verdict threshold under the product's rule, or the given override (None before a fit)."""

    @abstractmethod
    def predict(
        self, frames: Sequence[ImageInput], *, sigmas: float | None = None, false_alarm_rate: float | None = None
    ) -> Prediction:
        """Scores, maps and verdicts of whole frames."""

    @abstractmethod
    def input_view(self, image: np.ndarray) -> np.ndarray:
        """``image`` as :meth:`predict`'s maps are drawn over it."""

    @abstractmethod
    def layout(self, height: int, width: int) -> Layout:
        """How an ``height x width`` frame is cut (:class:`Layout`)."""


# --- facts of the configuration -------------------------------------------------------------
def frame_grid(config: DetectorConfig) -> tuple[int, int]:
    """Rows and columns of tiles a detector of ``config`` cuts each frame into ((1, 1): the frame on
    one canvas); a grid still ``auto`` is resolved from frames first (``geometry_rule.resolve_tiles``)."""
    tiles = config.geometry.tiles
    if tiles == "auto":
        raise ValueError("geometry.tiles 'auto' is resolved from frames first (resolve_tiles)")
    rows, cols = (int(v) for v in tiles)
    return rows, cols


def tiles_per_frame(config: DetectorConfig) -> int:
    """Tiles a detector of ``config`` cuts each frame into (1: the frame on one canvas)."""
    rows, cols = frame_grid(config)
    return rows * cols


def positions_per_frame(config: DetectorConfig) -> int:
    """Positions a detector of ``config`` fits and scores apart in each frame: its tiles, and the whole
    view when a tiled product has one (1: the frame on one canvas)."""
    tiles = tiles_per_frame(config)
    return tiles + int(tiles > 1 and bool(config.geometry.tile_whole_view))


def frames_per_pass(config: DetectorConfig) -> int:
    """Frames ``predict`` takes through the backbone together, ``max(1, batch_size // tiles)``: a
    caller that streams frames in chunks of a multiple of it scores exactly as one call on all of
    them would (the frame's tiles share a batch; ``tiled.py``, "Batching")."""
    return max(1, config.batch_size // tiles_per_frame(config))


def stream_chunk(config: DetectorConfig, frames: int) -> int:
    """Frames a caller streaming about ``frames`` at a time (``hetmm predict``, ``evaluate``, labelled
    calibration: ``STREAM_FRAMES``) decodes and scores per chunk: ``frames`` rounded down to a
    multiple of :func:`frames_per_pass`, and at least one pass, so its scores are those of one call
    on every frame."""
    per_pass = frames_per_pass(config)
    return per_pass * max(1, frames // per_pass)

"""What every product's detector answers, whether it scores a frame on one canvas or in tiles.

Exact semantics (both implementations hold them; ``detector.HETMM`` scores a frame on one canvas,
``tiled.TiledHETMM`` cuts it into tiles, each tile position a small product of its own):

- **Input.** Every call that takes images takes whole frames: file paths, encoded bytes or decoded
  ``(H, W, 3)`` uint8 arrays (``scorer.ImageInput``). The detector brings them to its canvas (or
  cuts its tiles) itself; no caller resizes.
- **Digests.** A frame's digest is ``core.device.image_digest`` of the frame as decoded, before any
  resize, on every path (fit, update, the service, the archive): the same images give the same
  digests, hence the same folds and the same "already held" decisions.
- ``fit(frames)``, ``update(frames)`` (hot update: frames already held are skipped, counted in
  ``skipped_duplicates``), ``compress(kind, sheets, seed=)`` change this detector in place and
  leave it unsaved (``version`` None) when anything changed; ``with_region(region)`` returns a new,
  unsaved detector with the same templates recalibrated under ``region``; it refuses a product on
  the ``validation`` threshold rule (:func:`~hetmm_ray.core.region.check_region_change`).
- ``predict(frames, sigmas=, false_alarm_rate=)`` returns a :class:`~hetmm_ray.detection.scorer.Prediction`
  (its maps at :meth:`input_view`'s resolution). ``operating_point`` / ``threshold`` /
  ``calibration``: the verdict rule on the product's out-of-fold scores (a tiled product's are per
  frame).
- ``template_set()`` is what a store holds for this detector (one set; a tiled product's positions
  ride inside it), ``save(store, product)`` publishes it; ``hetmm_ray.detection.detector_choice.load_detector`` is the
  one loader and ``hetmm_ray.detection.detector_choice.new_detector`` the one constructor (they are the only places
  that choose an implementation).
- ``selections()``: each scored position's own template set (one for a frame on one canvas);
  ``layout(h, w)``: how an ``h x w`` frame is cut; ``frame_cost(frame)``: the measured cost model of
  one frame (``frame_cost.FrameCost``).
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
from .frame_cost import FrameCost
from .scorer import ImageInput, Prediction

if TYPE_CHECKING:
    from ..store.protocol import Store

__all__ = ["Detector", "Layout"]


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
    skipped_duplicates: int

    # --- templates ------------------------------------------------------------------------
    @abstractmethod
    def fit(self, frames: Sequence[ImageInput]) -> Self:
        """Templates and calibration from good frames."""

    @abstractmethod
    def update(self, frames: Sequence[ImageInput]) -> Self:
        """Hot update: new good frames added, frames already held skipped (``skipped_duplicates``)."""

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
        """What the store holds for this detector (one set)."""

    @abstractmethod
    def selections(self) -> list[TemplateSet]:
        """Each scored position's own template set (one for a frame on one canvas)."""

    @property
    @abstractmethod
    def image_digests(self) -> tuple[str, ...]:
        """The digests of the good frames the bank holds."""

    @property
    def n_images(self) -> int:
        return len(self.image_digests)

    @property
    @abstractmethod
    def sheets(self) -> int:
        """Sheets per position of the selection in use (0 before a fit)."""

    @abstractmethod
    def report_to(self, report: Any) -> None:
        """The fit's stages and counts to ``report`` (``steps.Report``: a job's progress), per position."""

    def save(self, store: Store, product: str) -> int:
        """Publish :meth:`template_set` as a new version of ``product``; returns it."""
        self.version = int(store.put(product, self.template_set()))
        return self.version

    # --- scoring --------------------------------------------------------------------------
    @property
    @abstractmethod
    def backbone(self) -> Any: ...

    @property
    @abstractmethod
    def calibration(self) -> Calibration | None:
        """The out-of-fold calibration the verdict threshold is set on (None before a fit)."""

    @abstractmethod
    def operating_point(
        self, *, sigmas: float | None = None, false_alarm_rate: float | None = None
    ) -> OperatingPoint | None:
        """The verdict threshold under the product's rule, or the given override."""

    @property
    def threshold(self) -> float:
        """Current verdict threshold (``inf`` before calibration)."""
        op = self.operating_point()
        return op.threshold if op else float("inf")

    @abstractmethod
    def predict(
        self, frames: Sequence[ImageInput], *, sigmas: float | None = None, false_alarm_rate: float | None = None
    ) -> Prediction:
        """Scores, maps and verdicts of whole frames."""

    @abstractmethod
    def input_view(self, image: np.ndarray) -> np.ndarray:
        """``image`` as :meth:`predict`'s maps are drawn over it."""

    @property
    def frames_per_pass(self) -> int:
        """Frames ``predict`` takes through the backbone together: a caller that streams frames in
        chunks of a multiple of it scores exactly as one call on all of them would."""
        return max(1, self.config.batch_size // self.n_tiles)

    @property
    def grid(self) -> tuple[int, int]:
        """Rows and columns of tiles per frame ((1, 1): the frame on one canvas)."""
        return (1, 1)

    @property
    def n_tiles(self) -> int:
        """Tiles per frame (1: the frame on one canvas)."""
        return self.grid[0] * self.grid[1]

    @abstractmethod
    def layout(self, height: int, width: int) -> Layout:
        """How an ``height x width`` frame is cut (:class:`Layout`)."""

    @abstractmethod
    def frame_cost(self, frame: ImageInput) -> FrameCost:
        """The measured cost model of one frame on this host."""

    def estimate_ms_per_frame(self, frame: ImageInput, n_train: int) -> float:
        """Milliseconds to score ``frame`` against as many sheets as a fit on ``n_train`` frames keeps."""
        return self.frame_cost(frame).ms_per_frame(self.config.templates.sheets_of(n_train))

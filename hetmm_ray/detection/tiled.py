"""Tiled detector: a frame cut into a fixed grid of tiles, each tile position a product of its own.

The tiled implementation of ``interface.Detector`` (``geometry.tiles`` other than ``[1, 1]``; the grid is
``core/tiles.py``'s), its storage and its serving copy. Nothing here imports Ray.

Exact semantics:

- **Positions.** Every frame is cut by :func:`~hetmm_ray.core.tiles.tile_grid` (the same rows and
  columns for every frame, the rectangles following its size). Position ``p`` (row-major) is a
  :class:`~hetmm_ray.detection.scorer.Scorer` of its own: templates fit by
  :class:`~hetmm_ray.detection.fitting.FitPipeline` from the ``p``-th tile of every good frame, its
  own out-of-fold calibration, the product's configuration with ``geometry`` at its default; all
  positions share one backbone.
- **Whole view** (``geometry.tile_whole_view``): the whole frame is one more position, the last,
  reaching the canvas as an untiled product's image does (its region mapped as an untiled product
  maps it), fed in the same backbone passes; its normalised score joins the frame's maximum below.
- **Batching.** Frames go in groups of ``max(1, batch_size // T)`` (``T`` tiles; the whole view does
  not shrink the group); a group's canvases go through the backbone ``batch_size`` at a time,
  positions mixed, and are scored per position, ATMM on the group's frames at once.
- **One verdict per frame.** Position ``p`` has a scale ``t_p``: the ``far`` threshold of its
  out-of-fold scores at ``threshold.false_alarm_rate`` when the positions were last calibrated (fit,
  hot update, compress, another region), stored as ``meta["tiles"]["scales"]``. The frame score is
  ``max_p s_p / t_p``; the frame calibration is the per-frame maximum of the positions' normalised
  out-of-fold scores (every position deals the same frame digests into the same folds), and the
  product's threshold rule applies to it. So a frame is flagged exactly when its score passes one
  frame threshold, and the estimated false-alarm rate is per frame. A far rule set later at another
  rate moves the frame threshold only: the scales, hence the scores, stay until the positions are
  next calibrated.
- **Maps.** Each tile's map divided by ``t_p`` and stitched at the frame's resolution, or at
  ``map_size`` (:func:`~hetmm_ray.core.tiles.stitch`: bilinear, the maximum where tiles overlap), on
  the frame threshold's scale. The whole view's map is not stitched in.
- **Storage** (one template set per version): position ``p``'s layers as ``tile<p>/<layer>``, the
  whole view's as ``whole/<layer>``; ``image_digests`` the frames'; ``calibration`` the frame
  calibration; ``meta["tiles"]`` the grid, the training frame size, the scales and each position's
  calibration, configuration and meta (the whole view last), with ``"whole_view": true`` when there
  is one. The stored configuration holds the resolved grid (``"auto"`` is never stored). A tiled
  product stored without a whole view loads and scores without one. :func:`position_sets` reads
  each position's own set back out of it.
- **Region** (frame coordinates; ``core/region.py`` rule 4): position ``p`` gets the part of the
  region inside its rectangle at the region's reference size, mapped onto its canvas by the
  geometry; excluded pixels never count. A position whose part counts no map pixel is not scored
  (NaN tile scores, map 0; the frame's maxima are over the others). ``Prediction.regions`` holds
  the region on each stitched map.
- **Hot update** (:meth:`TiledHETMM.update`): each position grows by the new frames' tiles
  (:meth:`~hetmm_ray.detection.fitting.FitPipeline.grown`, then refit), frames already held skipped, and the
  scales and frame calibration are recomputed: the product a fit on the old frames followed by the
  new ones gives.
- **Extraction apart from the fit.** :meth:`TiledHETMM.fit` is :meth:`TiledHETMM.extract_tiles`
  (every position's bank features of the frames, as plain arrays: :class:`TileFeatures`) then
  :meth:`TiledHETMM.fit_extracted` on them; :meth:`TiledHETMM.update` is the same extraction then
  :meth:`TiledHETMM.update_extracted`. A frame's features depend on its backbone group only
  (frames ``[k * G, (k + 1) * G)``, ``G`` = ``interface.frames_per_pass``), so extractions of consecutive
  slices starting at multiples of ``G``, run anywhere (the service: one Ray task per slice) and
  joined in order (:meth:`TileFeatures.gathered`), fit exactly the product one call on every
  frame fits.
- **Positions apart.** Each position's fit reads its own rows only (:meth:`TileFeatures.of_position`),
  so :meth:`TiledHETMM.fit_position` / :meth:`TiledHETMM.update_position` of each, run anywhere,
  then :meth:`TiledHETMM.with_positions` of them all, is exactly :meth:`TiledHETMM.fit_extracted`
  / :meth:`TiledHETMM.update_extracted`; with ``calibrate=False`` a position is only selected and
  its out-of-fold scores come in ranges of folds (:meth:`TiledHETMM.position_scores`), joined in
  fold order by :meth:`TiledHETMM.calibrated_position` into the same calibration.
- **Another region** (:meth:`TiledHETMM.with_region`): every position keeps its templates and is
  recalibrated under its part of the new region.

The service holds a tiled product as (position, layer) shards on its template hosts and scores it
with :meth:`TiledHETMM.serving` over those shards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..config import ConfigError, DetectorConfig, GeometryConfig, check_number, stored_config
from ..core.calibration import OutOfFold, TailModel
from ..core.device import TORCH_DTYPES, image_digest
from ..core.geometry import Box
from ..core.region import TilePart, check_visible, map_mask, raster, tile_regions
from ..core.scoring import Calibration, OperatingPoint, calibration_json, content_maps, image_scores, operating_point
from ..core.templates import TemplateError, TemplateMeta, TemplateSet, unseen_positions
from ..core.tiles import Tile, cut, stitch, tile_grid
from .detector import HETMM
from .fit_steps import FitSteps, Report
from .frame_cost import FrameCost
from .geometry_rule import check_resolved
from .interface import Detector, Layout, frame_grid, frames_per_pass, positions_per_frame
from .scorer import ImageInput, Prediction, as_rgb

if TYPE_CHECKING:
    from ..store.protocol import Store

__all__ = [
    "TileFeatures",
    "TiledHETMM",
    "TiledPrediction",
    "position_sets",
    "region_parts",
]


@dataclass(frozen=True)
class TiledPrediction(Prediction):
    """A :class:`~hetmm_ray.detection.scorer.Prediction` of frames, plus each position's normalised score (N, P):
    the ``tiles`` tiles, then the whole view when the product has one."""

    tile_scores: np.ndarray | None = None
    tiles: int = 1


@dataclass(frozen=True)
class TileFeatures:
    """Every position's bank features of some frames, as plain arrays (:meth:`TiledHETMM.extract_tiles`
    makes it, :meth:`TiledHETMM.fit_extracted` and :meth:`TiledHETMM.update_extracted` take it;
    picklable, so a Ray task returns it):

    - ``feats``: layer -> ``(N * P, C, h, w)`` numpy in the product's ``bank_dtype`` (``bfloat16``
      as float32 holding the same values: numpy has none), frame-major and position-minor (``P``
      positions: the tiles row-major, then the whole view when the product has one): row ``i * P + p``
      is position ``p`` of frame ``i``;
    - ``boxes``: each row's canvas box (None: ``backbone.geometry: squash``);
    - ``digests``, ``shapes``: each frame's digest (``core.device.image_digest`` of the frame as
      decoded) and its ``(height, width)``."""

    feats: dict[str, np.ndarray]
    boxes: list[Box] | None
    digests: list[str]
    shapes: list[tuple[int, int]]
    position: int | None = None  # None: every position's rows; else that position's alone (one row per frame)

    @property
    def n_frames(self) -> int:
        return len(self.digests)

    def of_position(self, p: int, positions: int) -> TileFeatures:
        """Position ``p``'s rows alone (``positions`` per frame here): what a fit or update of that
        one position reads (:meth:`TiledHETMM.fit_position`), a copy of ``1 / positions`` of the rows."""
        if self.position is not None:
            if self.position != p:
                raise ValueError(f"tile features of position {self.position}, position {p} asked")
            return self
        return replace(
            self,
            feats={k: np.ascontiguousarray(v[p::positions]) for k, v in self.feats.items()},
            boxes=None if self.boxes is None else self.boxes[p::positions],
            position=p,
        )

    @classmethod
    def interleaved(cls, positions: Sequence[TileFeatures]) -> TileFeatures:
        """Every position's rows of the same frames (:meth:`of_position` of each, in position order)
        as one, frame-major and position-minor again: the inverse of :meth:`of_position`. A
        ValueError for parts not of positions 0, 1, ... of the same frames."""
        if [part.position for part in positions] != list(range(len(positions))):
            raise ValueError(f"tile features of positions {[part.position for part in positions]}, not 0, 1, ...")
        first = positions[0]
        if any(part.digests != first.digests or list(part.feats) != list(first.feats) for part in positions):
            raise ValueError("tile features of different frames or layers")
        boxes = None
        if all(part.boxes is not None for part in positions):
            boxes = [b for row in zip(*(part.boxes or () for part in positions), strict=True) for b in row]
        return cls(
            feats={
                k: np.stack([part.feats[k] for part in positions], axis=1).reshape(-1, *v.shape[1:])
                for k, v in first.feats.items()
            },
            boxes=boxes,
            digests=list(first.digests),
            shapes=list(first.shapes),
        )

    @classmethod
    def gathered(cls, parts: Sequence[TileFeatures]) -> TileFeatures:
        """The frames of ``parts`` in their order as one (fresh arrays: ``np.concatenate``); a
        ValueError for no parts or parts of different layers."""
        if not parts:
            raise ValueError("no tile features to gather")
        layers = list(parts[0].feats)
        if any(list(part.feats) != layers for part in parts):
            raise ValueError(f"tile features of different layers: {[list(part.feats) for part in parts]}")
        if len({part.position for part in parts}) > 1:
            raise ValueError(f"tile features of different positions: {[part.position for part in parts]}")
        no_boxes = any(part.boxes is None for part in parts)
        return cls(
            feats={k: np.concatenate([part.feats[k] for part in parts]) for k in layers},
            boxes=None if no_boxes else [b for part in parts for b in part.boxes or ()],
            digests=[d for part in parts for d in part.digests],
            shapes=[s for part in parts for s in part.shapes],
            position=parts[0].position,
        )


def _bank_numpy(v: Tensor) -> np.ndarray:
    """A CPU bank tensor as numpy: ``bfloat16`` widened to float32 (exact; numpy has no bfloat16)."""
    return (v.float() if v.dtype == torch.bfloat16 else v).numpy()


def _sized(shape: tuple[int, int]) -> np.ndarray:
    """A stand-in frame of ``shape`` for the geometry rule, which reads frame sizes only (no memory:
    a broadcast view)."""
    return np.broadcast_to(np.zeros((1, 1, 3), dtype=np.uint8), (shape[0], shape[1], 3))


class _PositionReport:
    """A position's fit stages to a report, named with the position (``tile 2/5: calibrate``; the whole
    view, if any, is the last)."""

    def __init__(self, report: Any, position: int, positions: int) -> None:
        self.report, self.prefix = report, f"tile {position + 1}/{positions}: "

    def stage(self, name: str, total: int = 0) -> None:
        self.report.stage(self.prefix + name, total)

    def __call__(self, done: int, total: int) -> None:
        self.report(done, total)


def _visible(tile_config: DetectorConfig, part: TilePart) -> TilePart:
    """``part``, or a part that counts nothing when its region covers no pixel of the canvas's map (a
    sliver of a tile, or a region of the whole view all outside)."""
    if part.region is None:
        return part
    try:
        check_visible(replace(tile_config, region=part.region))
    except ConfigError:
        return TilePart(False, None)
    return part


def region_parts(config: DetectorConfig, tile_config: DetectorConfig | None = None) -> list[TilePart]:
    """Each tile's part of ``config``'s region (module docstring, "Region"), computed from the
    settings alone (no backbone); ConfigError when it counts no pixel of any tile's map."""
    rows, cols = frame_grid(config)
    region = config.region
    if region is None:
        return [TilePart(True, None)] * (rows * cols)
    tile_config = tile_config or replace(config, geometry=GeometryConfig(), region=None)
    height, width = region["size"]
    tiles = tile_grid(height, width, (rows, cols), config.geometry.tile_overlap)
    parts = [_visible(tile_config, part) for part in tile_regions(region, tiles)]
    if not any(part.counts for part in parts):
        h, w = region["size"]
        raise ConfigError(f"region: its included area covers no pixel of any tile's map of a {w} x {h} frame")
    return parts


def _position_key(p: int, layer: str, tiles: int) -> str:
    """Position ``p``'s bank key of ``layer`` in a tiled set of ``tiles`` tiles per frame:
    ``tile<p>/<layer>``, the whole view's (the position after the tiles) ``whole/<layer>``."""
    return f"whole/{layer}" if p >= tiles else f"tile{p}/{layer}"


def position_sets(ts: TemplateSet) -> list[TemplateSet]:
    """Each scored position's own template set inside a product's set (module docstring,
    "Storage"): the tiles' in row-major order, then the whole view's when there is one, each with
    its configuration, calibration, selection and meta; a product on one canvas is its one position."""
    if not ts.config.geometry.tiled:
        return [ts]
    info = ts.meta["tiles"]
    rows, cols = frame_grid(ts.config)
    sets = []
    for p, stored in enumerate(info["sets"]):
        keys = {layer: _position_key(p, layer, rows * cols) for layer in info["layers"]}
        sets.append(
            TemplateSet(
                bank={layer: ts.bank[key] for layer, key in keys.items()},
                config=stored_config(stored["config"]),
                weights_id=ts.weights_id,
                image_digests=ts.image_digests,
                calibration=Calibration.from_json(stored["calibration"]),
                indices=None if ts.indices is None else {la: ts.indices[k] for la, k in keys.items()},
                centres=None if ts.centres is None else {la: ts.centres[k] for la, k in keys.items()},
                meta=stored["meta"],
            )
        )
    return sets


class TiledHETMM(Detector):
    """A tiled product in process (see the module docstring): the :class:`~hetmm_ray.detection.interface.Detector`
    interface over one :class:`~hetmm_ray.detection.detector.HETMM` per tile position."""

    def __init__(
        self,
        config: DetectorConfig,
        *,
        progress: bool = False,
        map_size: int | None = None,
        backbone: Any = None,
        steps: FitSteps | None = None,
        report: Report | None = None,
    ) -> None:
        """``steps``: where each position's selection runs (``hetmm_ray/detection/fit_steps.py``: PTS as Ray tasks with
        ``ray_steps()``, as ``--address`` gives); the tiles go through the one shared backbone here,
        whatever ``steps`` says. ``report``: where every position's fit stages and counts go
        (``fit_steps.Report``: a job's progress), named with the position; None: nowhere."""
        self.config = config
        self.progress = progress
        self.map_size = map_size
        self.rows, self.cols = frame_grid(config)  # refuses a grid still "auto"
        self.whole_view = bool(config.geometry.tile_whole_view)
        tile_config = replace(config, geometry=GeometryConfig(), region=None)
        parts = self._region_parts(tile_config)
        if self.whole_view:
            parts.append(self._whole_part(tile_config))
        self.live = [part.counts for part in parts]  # False: the region counts none of its pixels
        # sheets: auto's time budget is per frame with all its tiles (_measure_cost)
        per_frame = {"tiles": self.n_positions, "scored": sum(self.live)}
        self.dets = [
            HETMM(
                replace(tile_config, region=part.region),
                progress=progress,
                steps=steps,
                report=None if report is None else _PositionReport(report, p, self.n_positions),
                **per_frame,
            )
            for p, part in enumerate(parts)
        ]
        if backbone is not None:  # an already-built one (replicas: one per backbone, not per product)
            self._share(backbone)
        self.scales: list[float] = []
        self.frame_calibration: Calibration | None = None  # the verdict's (module docstring)
        self.frame: tuple[int, int] | None = None
        self.version: int | None = None
        self.frame_digests: tuple[str, ...] = ()
        # what the geometry rule chose at the fit (meta["geometry_choice"]): kept by every later version
        self.geometry_choice: dict[str, Any] | None = None

    def _region_parts(self, tile_config: DetectorConfig) -> list[TilePart]:
        """Each position's part of the product's region ("Region" in the module docstring)."""
        return region_parts(self.config, tile_config)

    def _whole_part(self, tile_config: DetectorConfig) -> TilePart:
        """The whole view's region: the product's own, mapped onto the canvas as an untiled product's is."""
        return _visible(tile_config, TilePart(True, self.config.region))

    def _frame_regions(self, shapes: Sequence[tuple[int, int]]) -> list[np.ndarray] | None:
        """The region on each stitched map of these shapes (nearest sampling of its raster; None: no region)."""
        region = self.config.region
        if region is None:
            return None
        full = raster(region)
        return [map_mask(full, shape, shape, "squash") for shape in shapes]

    def _share(self, backbone: Any) -> None:
        for det in self.dets:
            det.scorer.backbone = backbone

    @property
    def n_tiles(self) -> int:
        """Tiles per frame (``interface.frame_grid`` of the configuration)."""
        return self.rows * self.cols

    @property
    def n_positions(self) -> int:
        """Positions scored per frame: the tiles, and the whole view when the product has one (the last;
        ``interface.positions_per_frame``)."""
        return positions_per_frame(self.config)

    @property
    def backbone(self) -> Any:
        """The one backbone every position shares, built on first use (a fit from features that
        were extracted elsewhere never builds it)."""
        backbone = self.dets[0].backbone
        self._share(backbone)
        return backbone

    def tiles_of(self, height: int, width: int) -> list[Tile]:
        return tile_grid(height, width, (self.rows, self.cols), self.config.geometry.tile_overlap)

    def _key(self, p: int, layer: str) -> str:
        """Position ``p``'s bank key of ``layer`` (:func:`_position_key`)."""
        return _position_key(p, layer, self.n_tiles)

    def _check_positions(self, info: dict[str, Any]) -> None:
        """A stored ``meta["tiles"]`` holds exactly this configuration's positions."""
        if bool(info.get("whole_view", False)) != self.whole_view:
            raise TemplateError(
                f"tiled set {'has' if info.get('whole_view') else 'has no'} whole view, its configuration "
                f"{'wants one' if self.whole_view else 'none'} (geometry.tile_whole_view)"
            )
        if len(info["sets"]) != self.n_positions:
            raise TemplateError(
                f"tiled set holds {len(info['sets'])} positions, its grid {info['grid']} needs {self.n_positions}"
            )

    # --- tiles -> features, in mixed-position batches ---------------------------------------
    def _groups(self, frames: Sequence[ImageInput], desc: str) -> Iterator[list[np.ndarray]]:
        """Frames decoded ``max(1, batch_size // T)`` at a time (``T`` tiles per frame: the module doc's
        "Batching"; a progress bar when ``progress``)."""
        g = frames_per_pass(self.config)
        with tqdm(total=len(frames), desc=desc, unit="frame", disable=not self.progress, leave=False) as bar:
            for i in range(0, len(frames), g):
                decoded = [as_rgb(x) for x in frames[i : i + g]]
                yield decoded
                bar.update(len(decoded))

    def tile_features(
        self, decoded: list[np.ndarray], *, bank: bool
    ) -> tuple[dict[str, Tensor], list[Box] | None, list[list[Tile]]]:
        """Features of every position of ``decoded`` frames (frame-major, position-minor: the tiles,
        then the whole frame when the product has a whole view), their canvas boxes, and each frame's tiles."""
        scorer = self.dets[0].scorer
        grids = [self.tiles_of(x.shape[0], x.shape[1]) for x in decoded]
        crops = [c for x, tiles in zip(decoded, grids, strict=True) for c in self._crops(x, tiles)]
        parts: dict[str, list[Tensor]] = {}
        boxes: list[Box] | None = None if self.config.backbone.geometry == "squash" else []
        dtype = TORCH_DTYPES[self.config.bank_dtype]
        for _, batch, b in scorer.decoded_batches(crops, "tiles"):
            if boxes is not None and b is not None:
                boxes.extend(b)
            for k, v in scorer.features(batch, b).items():
                parts.setdefault(k, []).append(v.to("cpu", dtype) if bank else v)
        return {k: torch.cat(v) for k, v in parts.items()}, boxes, grids

    # --- fit -------------------------------------------------------------------------------
    def frame_cost(self, frame: ImageInput) -> FrameCost:
        """:class:`~hetmm_ray.detection.frame_cost.FrameCost` of ``frame`` on this host: the backbone pass of all its
        tiles, the stitching of their maps at the frame's resolution, and ATMM of each tile the
        region leaves in (what ``sheets: auto``'s time budget is judged by; callers reach it through
        ``detector_choice.frame_cost_of``)."""
        x = as_rgb(frame)
        return FrameCost(self.dets[0].scorer, self._frame_crops(x), scored=sum(self.live), post=self._stitching(x))

    def _frame_crops(self, frame: np.ndarray) -> list[np.ndarray]:
        return self._crops(frame, self.tiles_of(frame.shape[0], frame.shape[1]))

    def _crops(self, frame: np.ndarray, tiles: list[Tile]) -> list[np.ndarray]:
        """What reaches the canvas of one frame, in position order: its tiles, then the frame itself
        when the product has a whole view."""
        crops = [np.ascontiguousarray(c) for c in cut(frame, tiles)]
        return [*crops, np.ascontiguousarray(frame)] if self.whole_view else crops

    def _stitching(self, frame: np.ndarray) -> Callable[[], object]:
        """A frame's per-frame work besides its tiles' backbone and ATMM, for the cost estimate: its
        tiles' maps stitched at the frame's resolution (or ``map_size``), as :meth:`predict` does."""
        h, w = frame.shape[:2]
        grid = self.tiles_of(h, w)
        side = self.config.scoring.output_size or self.config.backbone.image_size
        maps = [torch.zeros(side, side) for _ in grid]
        return lambda: stitch(maps, grid, (h, w), self._map_shape(h, w))

    def _measure_cost(self, frame: ImageInput | None) -> None:
        """With a time budget (``templates.auto_max_ms_per_image``), one
        :class:`~hetmm_ray.detection.frame_cost.FrameCost` of ``frame``'s tiles (None: a blank frame
        of the training frame's size) for every position's sheets auto: the frame's backbone pass
        of all its tiles + the stitching of their maps + ATMM of each scored tile. Without a budget
        nothing is measured."""
        cost = None
        if self.config.templates.auto_max_ms_per_image is not None:
            if frame is not None:
                x = as_rgb(frame)
            else:  # a blank frame of the training frames' size (one canvas per tile when not known)
                h, w = self.frame or (
                    self.config.backbone.image_size * self.rows,
                    self.config.backbone.image_size * self.cols,
                )
                x = np.full((h, w, 3), 128, dtype=np.uint8)
            cost = self.frame_cost(x)
        for det in self.dets:
            det.pipeline.cost = cost

    def extract_tiles(self, frames: Sequence[ImageInput], desc: str = "tile features") -> TileFeatures:
        """Bank features of every position of ``frames`` (:class:`TileFeatures`): each frame's tiles
        cut (and the whole frame, with a whole view), the frames decoded and put through the backbone
        ``interface.frames_per_pass`` at a time (module docstring, "Batching"), each group's features moved to
        the CPU in ``bank_dtype`` as it comes. Reads no templates: any detector of the product's
        configuration gives the same (module docstring, "Extraction apart from the fit")."""
        if len(frames) == 0:
            raise ValueError("no frames given")
        parts: dict[str, list[Tensor]] = {}
        boxes: list[Box] | None = None if self.config.backbone.geometry == "squash" else []
        digests: list[str] = []
        shapes: list[tuple[int, int]] = []
        for decoded in self._groups(frames, desc):
            digests.extend(image_digest(x) for x in decoded)
            shapes.extend((int(x.shape[0]), int(x.shape[1])) for x in decoded)
            feats, b, _ = self.tile_features(decoded, bank=True)
            if boxes is not None and b is not None:
                boxes.extend(b)
            for k, v in feats.items():
                parts.setdefault(k, []).append(v)
        return TileFeatures({k: _bank_numpy(torch.cat(v)) for k, v in parts.items()}, boxes, digests, shapes)

    def _bank(self, extracted: TileFeatures) -> dict[str, Tensor]:
        """``extracted``'s features as bank tensors (``bank_dtype``), refused (ValueError) unless they
        hold this product's positions of each frame (or, for ``extracted.position``, that position's
        row of each); a read-only array (one from Ray's object store) is copied first."""
        n = extracted.n_frames
        per_frame = self.n_positions if extracted.position is None else 1
        if extracted.position is not None and not 0 <= extracted.position < self.n_positions:
            raise ValueError(f"tile features of position {extracted.position}; this product has {self.n_positions}")
        if len(extracted.shapes) != n:
            raise ValueError(f"tile features of {n} frames (digests) hold {len(extracted.shapes)} frame sizes")
        held = {f"rows of {k}": v.shape[0] for k, v in extracted.feats.items()}
        if extracted.boxes is not None:
            held["boxes"] = len(extracted.boxes)
        for what, count in held.items():
            if count != n * per_frame:
                raise ValueError(
                    f"tile features of {n} frames hold {count} {what}; {per_frame} positions per frame "
                    f"need {n * per_frame}"
                )
        dtype = TORCH_DTYPES[self.config.bank_dtype]
        return {k: torch.from_numpy(v if v.flags.writeable else v.copy()).to(dtype) for k, v in extracted.feats.items()}

    def _position(
        self, feats: dict[str, Tensor], extracted: TileFeatures, p: int
    ) -> tuple[dict[str, Tensor], list[Box] | None]:
        """Position ``p``'s rows of ``extracted``'s features (frame-major, position-minor; or already
        that position's alone) and boxes."""
        if extracted.position is not None:
            return feats, extracted.boxes
        t, boxes = self.n_positions, extracted.boxes
        return {k: v[p::t].contiguous() for k, v in feats.items()}, None if boxes is None else boxes[p::t]

    @property
    def weights_id(self) -> str:
        """The backbone's weights identity (``core.backbone.weights_identity``), without building it."""
        from ..core.backbone import weights_identity

        return weights_identity(self.config.backbone)

    def fit(self, frames: Sequence[ImageInput]) -> Self:
        """One template set and one calibration per tile position from good frames; the frame calibration:
        :meth:`extract_tiles` of ``frames``, then :meth:`fit_extracted` (the configuration refused
        first, before any work, as there)."""
        if len(frames) < 2:
            raise ValueError(f"fit needs at least 2 good images, got {len(frames)}")
        check_resolved(self.config, frames)
        return self.fit_extracted(self.extract_tiles(frames, "fit: tile features"), frames[0])

    def fit_extracted(self, extracted: TileFeatures, cost_frame: ImageInput) -> Self:
        """The fit of the frames ``extracted`` holds (:meth:`extract_tiles` of them, or slices of them
        gathered in order): each position's template set and calibration
        (:meth:`FitPipeline.fit_features` on its rows), the scales, the frame calibration and the
        training frame size (the largest); exactly what :meth:`fit` on those frames gives.
        ``cost_frame``: the frame ``sheets: auto``'s time budget is measured on (the first; read only
        with ``templates.auto_max_ms_per_image``). Refused: fewer than 2 frames, features not of
        this product's positions (ValueError), a grid or canvas the geometry rule does not resolve
        for these frame sizes (:func:`check_resolved`, ConfigError)."""
        if extracted.position is not None:
            raise ValueError(f"tile features of position {extracted.position} alone: fit_position fits one position")
        feats = self._fit_inputs(extracted, cost_frame)
        sets = [self._fit_one(p, feats, extracted) for p in range(self.n_positions)]
        self.frame = None
        return self.with_positions(sets, extracted.shapes)

    def fit_position(self, extracted: TileFeatures, cost_frame: ImageInput, *, calibrate: bool = True) -> TemplateSet:
        """Position ``extracted.position``'s template set and calibration from its rows alone
        (:meth:`TileFeatures.of_position`): exactly the set :meth:`fit_extracted` makes for that
        position, so a fit can run each position apart (the service: a task each) and
        :meth:`with_positions` of them all is the product. The same refusals and ``cost_frame``.
        ``calibrate=False``: selected only, its out-of-fold scores left to
        :meth:`position_scores` (any fold ranges, anywhere) and :meth:`calibrated_position`."""
        if extracted.position is None:
            raise ValueError("fit_position takes one position's tile features (TileFeatures.of_position)")
        feats = self._fit_inputs(extracted, cost_frame)
        return self._fit_one(extracted.position, feats, extracted, calibrate=calibrate)

    def position_scores(self, p: int, ts: TemplateSet, folds: Sequence[int]) -> OutOfFold:
        """Position ``p``'s out-of-fold scores of folds ``folds`` of ``ts`` (its set, selected:
        :meth:`fit_position` or :meth:`update_position` with ``calibrate=False``), under its own
        selection (``FitPipeline.out_of_fold``) and under ``ts``'s own settings
        (``Scorer.settings_of``), as a fit or hot update in one process scores it."""
        det = self.dets[p]
        det.scorer.config = det.scorer.settings_of(ts)
        return det.pipeline.out_of_fold(ts, templates=ts.config.templates, folds=folds)

    def calibrated_position(self, p: int, ts: TemplateSet, parts: Sequence[OutOfFold]) -> TemplateSet:
        """Position ``p``'s selected set ``ts`` calibrated from :meth:`position_scores` of consecutive
        fold ranges that cover every fold, in order: exactly the calibrated set
        (``FitPipeline.calibrated_from``)."""
        return self.dets[p].pipeline.calibrated_from(ts, parts)

    def fold_count(self, ts: TemplateSet) -> int:
        """Folds of the out-of-fold calibration of a position's set ``ts`` (every position has the same)."""
        return len(self.dets[0].pipeline.fold_plan(ts))

    def _fit_inputs(self, extracted: TileFeatures, cost_frame: ImageInput) -> dict[str, Tensor]:
        """A fit's refusals, then ``extracted``'s bank tensors; ``sheets: auto``'s cost measured."""
        if extracted.n_frames < 2:
            raise ValueError(f"fit needs at least 2 good images, got {extracted.n_frames}")
        check_resolved(self.config, [_sized(s) for s in sorted(set(extracted.shapes))])
        feats = self._bank(extracted)
        self._measure_cost(cost_frame)
        return feats

    def _fit_one(
        self, p: int, feats: dict[str, Tensor], extracted: TileFeatures, *, calibrate: bool = True
    ) -> TemplateSet:
        det = self.dets[p]
        pos, boxes = self._position(feats, extracted, p)
        return det.pipeline.fit_features(
            pos, extracted.digests, weights_id=self.weights_id, config=det.config, boxes=boxes, calibrate=calibrate
        )

    def with_positions(self, sets: Sequence[TemplateSet], shapes: Sequence[tuple[int, int]]) -> Self:
        """This detector holding ``sets``, every position's in order (:meth:`fit_position` or
        :meth:`update_position` of each), with the frames of ``shapes`` joining the training frame
        size: the scales and the frame calibration computed from them, as :meth:`fit_extracted` and
        :meth:`update_extracted` install them. Refused (ValueError): not one set per position, or
        sets of different frames. The version becomes None (unsaved)."""
        if len(sets) != self.n_positions:
            raise ValueError(f"{len(sets)} position sets given; this product has {self.n_positions} positions")
        if any(ts.image_digests != sets[0].image_digests for ts in sets):
            raise ValueError("position sets of different frames")
        self.frame = max([*shapes, *([self.frame] if self.frame else [])])
        self._install(list(sets), sets[0].image_digests)
        return self

    def update(self, frames: Sequence[ImageInput]) -> Self:
        """Hot update: every position's set grown by the new frames' tiles, re-selected and recalibrated
        (:meth:`FitPipeline.grown` then :meth:`FitPipeline.refit`, as :meth:`HETMM.update` does for an
        untiled product); the scales and the frame calibration are recomputed. So the result equals a
        fit on the old frames followed by the new ones (same banks, same folds, same scores).
        :meth:`extract_tiles` of ``frames``, then :meth:`update_extracted`.

        Frames already held (same content digest as a held frame or an earlier new one) are skipped:
        a retried update changes nothing (the frames held grow by the new ones only). The version
        becomes None (unsaved) when anything was added."""
        self._require_fitted()
        return self.update_extracted(self.extract_tiles(frames, "update: tile features"), frames)

    def update_extracted(self, extracted: TileFeatures, frames: Sequence[ImageInput]) -> Self:
        """:meth:`update` from the new frames' features (:meth:`extract_tiles` of them, or slices
        gathered in order): the same skipping, growth, selection and calibration, so exactly what
        :meth:`update` on those frames gives. ``frames``: those frames in the same order (encoded
        bytes will do); only the first new one is read, for ``sheets: auto``'s time budget, and
        only with ``templates.auto_max_ms_per_image``. Refused (ValueError): ``frames`` not one per
        extracted frame, features not of this product's positions."""
        if extracted.position is not None:
            raise ValueError(
                f"tile features of position {extracted.position} alone: update_position grows one position"
            )
        self._require_fitted()
        grown = self._update_inputs(extracted, frames, self.frame_digests)
        if grown is None:
            return self
        feats, keep = grown
        sets = [
            self._grow_one(p, det.scorer.require_templates(), feats, keep, extracted=extracted)
            for p, det in enumerate(self.dets)
        ]
        return self.with_positions(sets, extracted.shapes)

    def update_position(
        self,
        extracted: TileFeatures,
        frames: Sequence[ImageInput],
        *,
        base: TemplateSet | None = None,
        calibrate: bool = True,
    ) -> TemplateSet | None:
        """Position ``extracted.position``'s set grown by the new frames' rows alone
        (:meth:`TileFeatures.of_position`), re-selected and recalibrated: exactly the set
        :meth:`update_extracted` makes for that position (None: every frame already held), so
        :meth:`with_positions` of every position's is the hot update. The same ``frames`` and
        refusals. ``base``: the position's set to grow (its own, :func:`position_sets` of the
        stored product; the position scores under its settings, ``Scorer.settings_of``), so a
        detector that holds no templates can grow it; None: the position's installed set. This
        detector's installed templates are left as they were. ``calibrate=False``: as
        :meth:`fit_position`."""
        p = extracted.position
        if p is None:
            raise ValueError("update_position takes one position's tile features (TileFeatures.of_position)")
        scorer = self.dets[p].scorer
        if base is None:
            self._require_fitted()
            base = scorer.require_templates()
        else:
            scorer.config = scorer.settings_of(base)
        grown = self._update_inputs(extracted, frames, base.image_digests)
        if grown is None:
            return None
        return self._grow_one(p, base, *grown, extracted=extracted, calibrate=calibrate)

    def _update_inputs(
        self, extracted: TileFeatures, frames: Sequence[ImageInput], held: tuple[str, ...]
    ) -> tuple[dict[str, Tensor], list[int]] | None:
        """A hot update's refusals, then the new frames' bank tensors and the positions of the frames
        not in ``held`` (None: none); ``sheets: auto``'s cost measured on the first of them."""
        if len(frames) != extracted.n_frames:
            raise ValueError(f"tile features of {extracted.n_frames} frames, {len(frames)} frames given")
        feats = self._bank(extracted)
        keep = unseen_positions(held, extracted.digests)
        if not keep:
            return None
        self._measure_cost(frames[keep[0]])
        return feats, keep

    def _grow_one(
        self,
        p: int,
        base: TemplateSet,
        feats: dict[str, Tensor],
        keep: list[int],
        *,
        extracted: TileFeatures,
        calibrate: bool = True,
    ) -> TemplateSet:
        """Position ``p``'s ``base`` grown by its rows of ``extracted`` (the frames at ``keep``)."""
        pipeline = self.dets[p].pipeline
        pos, boxes = self._position(feats, extracted, p)
        grown, kept = pipeline.grown(base, pos, extracted.digests, boxes)
        assert grown is not None and kept == keep  # every position holds the same frames' digests
        if calibrate:
            return pipeline.refit(grown)
        return replace(pipeline.selected(pipeline.selectable(grown)), calibration=None)  # the old one is stale

    def _require_fitted(self) -> None:
        if not self.scales:
            raise RuntimeError("this detector has no templates yet: call fit() or load() first")

    def drop(self, digests: Sequence[str]) -> Self:
        """Every position's bank without the frames of ``digests``, re-selected and recalibrated
        (:meth:`FitPipeline.without`); the scales and the frame calibration are recomputed."""
        if not self.scales:
            raise RuntimeError("this detector has no templates yet: call fit() or load() first")
        sets = [det.pipeline.without(det.scorer.require_templates(), digests) for det in self.dets]
        self._install(sets, sets[0].image_digests)
        return self

    def compress(self, kind: str | None = None, sheets: int | str | None = None, *, seed: int | None = None) -> Self:
        """Every position's bank under another selection (``kind``, ``sheets``, ``seed``; None keeps
        each position's own), refit per position (:meth:`FitPipeline.compress`, as :meth:`HETMM.compress`):
        with ``sheets: auto`` each position measures its own K. The scales and the frame calibration
        are recomputed; the product's ``templates`` section takes the given values. The version
        becomes None (unsaved)."""
        changes = {"kind": kind, "sheets": sheets, "seed": seed}
        changes = {k: v for k, v in changes.items() if v is not None}
        self._measure_cost(None)
        sets = [det.pipeline.compress(det.scorer.require_templates(), kind, sheets, seed=seed) for det in self.dets]
        if changes:
            self.config = self.config.replace(**{f"templates.{k}": v for k, v in changes.items()})
        self._install(sets, self.frame_digests)
        return self

    def _with_region(self, region: dict[str, Any] | None) -> TiledHETMM:
        """This product under another region (None: every pixel counts): a new detector whose
        positions keep their templates (bank and selection) and are recalibrated under their parts
        of ``region`` (:meth:`FitPipeline.calibrated`), as ``hetmm region`` does for an untiled
        product; so it equals a fit under that region. Unsaved (version None)."""
        config = replace(self.config, region=region)
        steps = self.dets[0].steps  # every position's, given at construction
        new = TiledHETMM(config, progress=self.progress, map_size=self.map_size, steps=steps)
        for det in new.dets:
            det.scorer.backbone = self.backbone  # no second build
        sets = []
        for det, old in zip(new.dets, self.dets, strict=True):
            ts = old.scorer.require_templates()
            sets.append(det.pipeline.calibrated(replace(ts, config=replace(ts.config, region=det.config.region))))
        new.frame, new.geometry_choice = self.frame, self.geometry_choice
        new._install(sets, self.frame_digests)
        return new

    def _install(
        self,
        sets: list[TemplateSet],
        digests: tuple[str, ...],
        version: int | None = None,
        *,
        scales: Sequence[float] | None = None,
    ) -> None:
        """Hold ``sets`` (one per position); ``scales``: a stored version's (checked), else each
        position's own threshold at the product's rate (module docstring, "One verdict per frame")."""
        for det, ts in zip(self.dets, sets, strict=True):
            det.scorer.install(ts, version)
        self.frame_digests = digests
        self.version = version
        if scales is None:
            self.scales = [self._scale(ts, live) for ts, live in zip(sets, self.live, strict=True)]
        else:
            self.scales = self._checked_scales(scales)
        self.frame_calibration = self._frame_calibration(sets)

    def _checked_scales(self, scales: Sequence[float]) -> list[float]:
        """Stored scales, refused unless one finite positive number per position."""
        try:
            values = [float(s) for s in scales]
        except (TypeError, ValueError):
            raise TemplateError(f"stored tile scales are not numbers: {scales!r}") from None
        if len(values) != self.n_positions or not all(np.isfinite(v) and v > 0 for v in values):
            raise TemplateError(
                f"stored tile scales {values} do not give one positive number to each of {self.n_positions} positions"
            )
        return values

    def _scale(self, ts: TemplateSet, live: bool = True) -> float:
        """The tile's own threshold: ``far`` at the product's false-alarm rate on its out-of-fold scores
        (1 for a position that never counts)."""
        if ts.calibration is None or not live:
            return 1.0
        t = TailModel(ts.calibration.scores).threshold(self.config.threshold.false_alarm_rate)
        return float(t) if np.isfinite(t) and t > 0 else 1.0

    def _frame_calibration(self, sets: list[TemplateSet]) -> Calibration | None:
        if any(ts.calibration is None for ts in sets):
            return None
        calibrations = [ts.calibration for ts in sets if ts.calibration is not None]  # all of them, checked above
        scores = np.array([c.scores for c in calibrations], dtype=np.float64)  # (T, n): same frames
        normalised = (scores / np.array(self.scales)[:, None])[self.live]  # positions that count
        return Calibration(scores=tuple(normalised.max(axis=0).tolist()))

    # --- predict ---------------------------------------------------------------------------
    def operating_point(
        self, *, sigmas: float | None = None, false_alarm_rate: float | None = None
    ) -> OperatingPoint | None:
        """The frame threshold under the product's rule (or the override), on the frame calibration."""
        return operating_point(self.frame_calibration, self.config, sigmas=sigmas, false_alarm_rate=false_alarm_rate)

    def input_view(self, image: np.ndarray) -> np.ndarray:
        """``image`` as ``predict`` is given it: the whole frame (it is cut into tiles there), and its
        stitched maps are at the frame's resolution (``HETMM.input_view``'s tiled counterpart)."""
        return image

    @property
    def calibration(self) -> Calibration | None:
        """The frame calibration (module docstring, "One verdict per frame")."""
        return self.frame_calibration

    def _map_shape(self, h: int, w: int) -> tuple[int, int]:
        if self.map_size is None:
            return h, w
        f = self.map_size / max(h, w)
        return max(1, round(h * f)), max(1, round(w * f))

    def predict(
        self, frames: Sequence[ImageInput], *, sigmas: float | None = None, false_alarm_rate: float | None = None
    ) -> TiledPrediction:
        """Frame scores, stitched maps and verdicts (module docstring)."""
        if sigmas is not None:
            check_number("threshold.sigmas", sigmas)
        if false_alarm_rate is not None:
            check_number("threshold.false_alarm_rate", false_alarm_rate)
        if not self.scales:
            raise RuntimeError("this detector has no templates yet: call fit() or load() first")
        op = self.operating_point(sigmas=sigmas, false_alarm_rate=false_alarm_rate)
        start = time.perf_counter()
        t, n_tiles = self.n_positions, self.n_tiles
        sc = self.config.scoring
        frame_scores: list[float] = []
        tile_scores: list[np.ndarray] = []
        maps: list[np.ndarray] = []
        for decoded in self._groups(frames, "predict: frames"):
            feats, boxes, grids = self.tile_features(decoded, bank=False)
            n = len(decoded)
            scores = np.zeros((n, t))
            tile_maps: list[list[Tensor]] = [[torch.zeros(1, 1)] * n_tiles for _ in range(n)]
            for p, det in enumerate(self.dets):
                if not self.live[p]:  # the region counts none of its pixels: not scored, 0 on the map
                    scores[:, p] = np.nan
                    continue
                rows = list(range(p, n * t, t))
                pos = {k: v[rows] for k, v in feats.items()}
                pos_boxes = None if boxes is None else [boxes[i] for i in rows]
                scorer = det.scorer
                m = scorer.score_maps(pos, scorer.prepared, pos_boxes)
                in_map = scorer.map_boxes(pos_boxes)
                regions = scorer.region_masks(in_map, n)  # the position's part of the region (None: all)
                position_scores = image_scores(m, sc.score_sigma, in_map, regions, top_k=self.config.score_pixels)
                scores[:, p] = position_scores.cpu().numpy() / self.scales[p]
                if p >= n_tiles:  # the whole view: its score counts, its map is not stitched
                    continue
                for f, cm in enumerate(content_maps(m, sc.map_sigma, in_map, regions)):
                    tile_maps[f][p] = cm.cpu() / self.scales[p]
            for f, x in enumerate(decoded):
                h, w = x.shape[:2]
                maps.append(stitch(tile_maps[f], grids[f], (h, w), self._map_shape(h, w)).numpy())
            tile_scores.append(scores)
            frame_scores.extend(scores[:, self.live].max(axis=1).tolist())
        s = np.asarray(frame_scores, dtype=np.float32)
        return TiledPrediction.judged(
            s,
            maps,
            op,
            version=self.version,
            start=start,
            regions=self._frame_regions([m.shape for m in maps]),
            tile_scores=np.concatenate(tile_scores),
            tiles=n_tiles,
        )

    # --- persistence -----------------------------------------------------------------------
    def template_set(self) -> TemplateSet:
        """Every position's set as one template set (module docstring, "Storage")."""
        sets = [det.scorer.require_templates() for det in self.dets]
        key = self._key
        bank = {key(p, k): v for p, ts in enumerate(sets) for k, v in ts.bank.items()}
        indices = centres = None
        if all(ts.indices is not None for ts in sets):
            indices = {key(p, k): v for p, ts in enumerate(sets) for k, v in ts.indices.items()}  # type: ignore[union-attr]
        if all(ts.centres is not None for ts in sets):
            centres = {key(p, k): v for p, ts in enumerate(sets) for k, v in ts.centres.items()}  # type: ignore[union-attr]
        tiles_meta: dict[str, Any] = {
            "grid": [self.rows, self.cols],
            "frame": list(self.frame) if self.frame else None,
            "layers": list(sets[0].layers),
            "scales": self.scales,
            "sets": [
                {
                    "config": ts.config.stored_dict(),
                    "calibration": calibration_json(ts.calibration),
                    "meta": {k: v for k, v in ts.meta.items() if k not in ("version", "parent")},
                }
                for ts in sets
            ],
        }
        if self.whole_view:  # written only then: a product without one stores what it always did
            tiles_meta["whole_view"] = True
        return TemplateSet(
            bank=bank,
            config=self.config,
            weights_id=sets[0].weights_id,
            image_digests=self.frame_digests,
            calibration=self.frame_calibration,
            indices=indices,
            centres=centres,
            meta=TemplateMeta(
                {"created": time.time(), "tiles": tiles_meta}
                | ({} if self.geometry_choice is None else {"geometry_choice": self.geometry_choice})
            ),
        )

    def layout(self, height: int, width: int) -> Layout:
        tile = self.tiles_of(height, width)[0]
        outside = self.n_tiles - sum(self.live[: self.n_tiles])  # tiles only (the whole view is not one)
        return Layout(self.rows, self.cols, tile.height, tile.width, height, width, self.whole_view, outside)

    @classmethod
    def from_store(cls, store: Store, product: str, version: int, **options: Any) -> Self:
        """A stored tiled product's detector (:meth:`from_template_set`); callers use
        :func:`hetmm_ray.detection.detector_choice.load_detector`, which chooses the class."""
        return cls.from_template_set(store.get(product, version), version, **options)

    @classmethod
    def from_template_set(cls, ts: TemplateSet, version: int | None = None, **options: Any) -> Self:
        """A detector over a stored tiled set (``options``: ``progress=``, ``map_size=``, ``steps=``,
        run-time settings)."""
        run_time = {k: v for k, v in options.items() if k not in ("progress", "map_size", "steps")}
        config = ts.config.replace(**run_time) if run_time else ts.config
        progress, map_size, steps = options.get("progress", False), options.get("map_size"), options.get("steps")
        det = cls(config, progress=progress, map_size=map_size, steps=steps)
        info = ts.meta["tiles"]
        if det.weights_id != ts.weights_id:
            raise TemplateError(
                f"tiled templates were built with weights {ts.weights_id}, the backbone now loads {det.weights_id}"
            )
        det._check_positions(info)
        sets = position_sets(ts)
        det.frame = tuple(info["frame"]) if info.get("frame") else None
        det.geometry_choice = ts.meta.get("geometry_choice")
        det._install(sets, ts.image_digests, version, scales=info.get("scales"))
        det.frame_calibration = ts.calibration  # the stored frame calibration (a labelled one would ride here)
        return det

    @classmethod
    def serving(
        cls,
        config: DetectorConfig,
        templates: dict[str, Tensor],
        *,
        tiles: dict[str, Any],
        weights_id: str,
        calibration: Calibration | None,
        version: int | None,
        backbone: Any = None,
        map_size: int | None = None,
    ) -> Self:
        """A predict-only tiled detector over published tiny sets, as the service's replicas hold it:
        ``templates`` maps ``tile<p>/<layer>`` to that position's (K, C, H, W) sheets (the template
        hosts' shards), ``tiles`` is the stored ``meta["tiles"]`` (grid, layers, each position's
        configuration and calibration), ``calibration`` the frame calibration. Each position scores
        exactly as :meth:`from_template_set` would (the same sheets, scales and frame threshold)."""
        det = cls(config, map_size=map_size, backbone=backbone)
        if det.backbone.weights_id != weights_id:
            raise TemplateError(
                f"tiled templates were built with weights {weights_id}, the backbone has {det.backbone.weights_id}"
            )
        det._check_positions(tiles)
        sets = []
        for p, stored in enumerate(tiles["sets"]):
            bank = {layer: templates[det._key(p, layer)] for layer in tiles["layers"]}
            k = next(iter(bank.values())).shape[0]
            sets.append(
                TemplateSet(
                    bank=bank,
                    config=stored_config(stored["config"]),
                    weights_id=weights_id,
                    image_digests=tuple(f"sheet-{i}" for i in range(k)),  # sheets, not images
                    calibration=Calibration.from_json(stored["calibration"]),
                    meta=TemplateMeta({"tiny": True}),
                )
            )
        det.frame = tuple(tiles["frame"]) if tiles.get("frame") else None
        det._install(sets, (), version, scales=tiles.get("scales"))
        det.frame_calibration = calibration  # the published frame calibration
        return det

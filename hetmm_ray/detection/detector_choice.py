"""The one place that chooses a product's detector class: a frame on one canvas
(:class:`~hetmm_ray.detection.detector.HETMM`) or cut into tiles (:class:`~hetmm_ray.detection.tiled.TiledHETMM`).

Exact semantics:

- :func:`new_detector` ``(config, frames)``: a detector to fit. ``geometry.tiles: auto`` is resolved
  from ``frames`` (their headers; ``geometry_rule.resolve_tiles``); a grid of 1 x 1 is the frame on one
  canvas, any other grid the tiled detector. ``options`` are ``progress=``, ``steps=``, ``map_size=``
  and ``report=`` (``fit_steps.Report``: where the fit's stages and counts go, a tiled product's
  named with the position).
- :func:`load_detector` ``(store, product, version)``: the stored version as the detector its stored
  configuration names; ``options`` are ``progress=``, ``steps=``, ``map_size=`` (a tiled product's
  stitched map size; a canvas map is the canvas's) and run-time settings (``device=``...).
- :func:`check_region`: a region's visibility under either layout, from the settings alone.
- :func:`serving_detector`: a predict-only detector over published tiny sets, as replicas hold it
  (``tiles``: a tiled product's stored ``meta["tiles"]``, None for one canvas).
- :func:`frame_cost_of` ``(detector, frame)``: the measured cost model of one frame on this host
  (:class:`~hetmm_ray.detection.frame_cost.FrameCost`): a frame on one canvas is that canvas, as
  ``predict`` brings the frame to it; a tiled frame is the backbone pass of all its positions'
  canvases, the stitching of their maps and ATMM of each position the region leaves in.
  :func:`ms_per_frame_of` ``(detector, frame, n_train)``: its milliseconds per frame against as
  many sheets as a fit on ``n_train`` frames keeps (``hetmm fit``'s cost line, a create job's
  estimate).

Callers never ask which class they hold: both answer :class:`~hetmm_ray.detection.interface.Detector`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch import Tensor

from ..config import DetectorConfig
from ..core.region import check_visible
from ..core.scoring import Calibration
from ..core.templates import TemplateError
from .detector import HETMM
from .frame_cost import FrameCost
from .geometry_rule import resolve_tiles
from .interface import Detector
from .scorer import ImageInput
from .tiled import TiledHETMM, region_parts

if TYPE_CHECKING:
    from ..store.protocol import Store

__all__ = ["check_region", "frame_cost_of", "load_detector", "ms_per_frame_of", "new_detector", "serving_detector"]


def check_region(config: DetectorConfig) -> None:
    """ConfigError, before any work, when ``config``'s region counts no pixel of the map: the canvas's
    for a frame on one canvas, every tile's for a tiled product (``tiled.region_parts``); a grid still
    ``auto`` is checked when the fit resolves it."""
    if config.region is None or config.geometry.tiles == "auto":
        return
    if config.geometry.tiled:
        region_parts(config)
    else:
        check_visible(config)


def new_detector(config: DetectorConfig, frames: Sequence[ImageInput] = (), **options: Any) -> Detector:
    """A detector of ``config`` to fit on ``frames`` (``tiles: auto`` resolved from them first);
    ``options``: ``progress=``, ``steps=``, ``map_size=``, ``report=``."""
    config = resolve_tiles(config, frames) if frames else config
    if config.geometry.tiled:
        return TiledHETMM(config, **options)
    options.pop("map_size", None)  # a canvas's map is the canvas's
    return HETMM(config, **options)


def load_detector(store: Store, product: str, version: int | None = None, **options: Any) -> Detector:
    """The stored version of ``product`` (default: head) as its detector (module docstring)."""
    if version is None:
        version = store.head(product)
    if store.record(product, version).config.geometry.tiled:
        return TiledHETMM.from_store(store, product, version, **options)
    options.pop("map_size", None)  # an untiled map is the canvas crop, as always
    return HETMM.from_store(store, product, version, **options)


def serving_detector(
    config: DetectorConfig,
    templates: dict[str, Tensor],
    *,
    tiles: dict[str, Any] | None,
    weights_id: str,
    calibration: Calibration | None,
    version: int | None,
    backbone: Any = None,
    map_size: int | None = None,
) -> Detector:
    """A predict-only detector over published tiny sets (module docstring)."""
    if config.geometry.tiled != (tiles is not None):
        raise TemplateError(
            f"v{version}: a {'tiled' if config.geometry.tiled else 'one-canvas'} configuration "
            f"{'without' if tiles is None else 'with'} a tile record"
        )
    provenance = {"weights_id": weights_id, "calibration": calibration, "version": version, "backbone": backbone}
    if tiles is not None:
        return TiledHETMM.serving(config, templates, tiles=tiles, map_size=map_size, **provenance)
    return HETMM.serving(config, templates, **provenance)


def frame_cost_of(detector: Detector, frame: ImageInput) -> FrameCost:
    """The measured cost model of scoring ``frame`` with ``detector`` on this host (module docstring)."""
    # What a frame becomes on the canvas is each implementation's own: a measurement of it belongs
    # beside the choice of class, not in the interface every caller of predict sees.
    if not isinstance(detector, HETMM | TiledHETMM):
        raise TypeError(f"no cost model for a {type(detector).__name__}")
    return detector.frame_cost(frame)


def ms_per_frame_of(detector: Detector, frame: ImageInput, n_train: int) -> float:
    """Milliseconds to score ``frame`` with ``detector`` against as many sheets as a fit on ``n_train``
    frames keeps (:func:`frame_cost_of`)."""
    return frame_cost_of(detector, frame).ms_per_frame(detector.config.templates.sheets_of(n_train))

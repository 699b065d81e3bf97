"""The one place that chooses a product's detector class: a frame on one canvas
(:class:`~hetmm_ray.detection.detector.HETMM`) or cut into tiles (:class:`~hetmm_ray.detection.tiled.TiledHETMM`).

Exact semantics:

- :func:`new_detector` ``(config, frames)``: a detector to fit. ``geometry.tiles: auto`` is resolved
  from ``frames`` (their headers; ``geometry_rule.resolve_tiles``); a grid of 1 x 1 is the frame on one
  canvas, any other grid the tiled detector.
- :func:`load_detector` ``(store, product, version)``: the stored version as the detector its stored
  configuration names; ``options`` are ``progress=``, ``steps=``, ``map_size=`` (a tiled product's
  stitched map size; a canvas map is the canvas's) and run-time settings (``device=``...).
- :func:`check_region`: a region's visibility under either layout, from the settings alone.
- :func:`serving_detector`: a predict-only detector over published tiny sets, as replicas hold it
  (``tiles``: a tiled product's stored ``meta["tiles"]``, None for one canvas).

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
from .geometry_rule import resolve_tiles
from .interface import Detector
from .scorer import ImageInput
from .tiled import TiledHETMM, region_parts

if TYPE_CHECKING:
    from ..store.protocol import Store

__all__ = ["check_region", "load_detector", "new_detector", "serving_detector"]


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
    ``options``: ``progress=``, ``steps=``, ``map_size=``."""
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

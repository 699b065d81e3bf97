"""Typed records for what crosses processes: registry -> replicas, registry -> HTTP clients.

- :class:`ProductSnapshot`: a product's published version as the registry hands it to the
  detector replicas (``ProductRegistry.snapshot``): the calibration a
  :class:`~hetmm_ray.core.scoring.Calibration`, the configuration a ``DetectorConfig`` (the
  product's stored settings; each replica applies its own run-time ones), built once by the
  registry from the template set or the stored version's record (store/manifest.py) it publishes.
- :class:`ProductDescription` / :class:`UnreadableProduct`: one entry of ``GET /v1/products``,
  as the registry describes it; ``to_json()`` is the JSON the HTTP API sends.
- :class:`JobRecord`: a create / normals / calibrate job as ``GET /v1/jobs/{id}`` shows it.

The keys of the JSON-bound records are the HTTP API's (the generated HTTP reference), so a rename here is an API
change. Job records stay ``TypedDict``s: the job board updates them in place as the job runs
(progress, notes such as ``skipped_duplicates`` that only some kinds have) and sends them as
they are.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

from .config import DetectorConfig
from .core.scoring import Calibration

__all__ = [
    "JobError",
    "JobProgressRecord",
    "JobRecord",
    "ProductDescription",
    "ProductSnapshot",
    "UnreadableProduct",
]


@dataclass(frozen=True)
class ProductSnapshot:
    """A product's published version for replicas: its scoring metadata and per-layer tiny-set refs."""

    product: str
    version: int
    config: DetectorConfig  # the product's stored settings (run-time ones at their defaults)
    weights_id: str
    calibration: Calibration | None
    # layer -> ObjectRef of the (K, C, H, W) tiny set, owned by the registry (shared memory); a tiled
    # product's keys are ``tile<p>/<layer>`` (one per (tile position, layer) shard, hetmm_ray/detection/tiled.py)
    tiny: dict[str, Any] = field(default_factory=dict)
    # a tiled product's stored ``meta["tiles"]`` (grid, layers, each position's configuration and
    # calibration: tiled.TiledHETMM.serving); None for an untiled one
    tiles: dict[str, Any] | None = None


@dataclass(frozen=True)
class ProductDescription:
    """One product of ``GET /v1/products``: its head version, selection, backbone and threshold."""

    product: str
    version: int
    images: int
    templates: str
    sheets: int  # sheets the selection holds (min(K, images); images for ALL)
    backbone: str
    weights_id: str
    image_size: int
    geometry: str
    sheets_auto: dict[str, Any] | None  # the sheets: auto record (chosen K, why, ladder), None for a fixed K
    threshold: float | None
    threshold_rule: str | None
    rule_target: float | None
    estimated_false_alarm_rate: float | None
    created: float | None
    # whether the product has an inspection region, and its tile grid ([1, 1]: untiled)
    region: bool = False
    tiles: tuple[int, int] = (1, 1)
    # why the threshold may flag few defects (core/scoring.OperatingPoint.warning), None when nothing
    threshold_warning: str | None = None
    # the estimate behind estimated_false_alarm_rate: its interval and the good scores above the
    # threshold (core/calibration.FalseAlarmEstimate.to_json), None without a calibration
    false_alarm_estimate: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class UnreadableProduct:
    """A product of ``GET /v1/products`` whose head could not be described (one bad product must
    not break the list of all)."""

    product: str
    version: int
    error: str  # "<exception type>: <message>"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class JobProgressRecord(TypedDict):
    stage: str
    done: int
    total: int


class JobError(TypedDict):
    type: str
    message: str
    status: int  # the HTTP status of the error in the one table (errors.py)
    code: str  # its stable code


class JobRecord(TypedDict, total=False):
    id: str
    kind: str  # create | normals | calibrate | region | region_preview | compare
    product: str
    state: str  # running | succeeded | failed
    progress: JobProgressRecord
    version: int | None
    error: JobError | None
    created: float
    finished: float | None
    skipped_duplicates: int  # normals: images already in the bank
    preview: dict[str, Any]  # region_preview: current vs proposed (distributed/registry.py region_preview)
    # create of a tiled product, before the long work: its grid, tile size, sheets per position and the
    # estimated milliseconds per frame with all its tiles (detector_choice.ms_per_frame_of); an untiled
    # product's create: sheets and estimated_ms_per_frame (frame_cost.estimate_ms_per_frame, measured in
    # the first feature-extraction task with its backbone), when that task's batch is back
    tiles: list[int]
    tile_px: list[int]
    # create whose geometry a rule chose (geometry_rule.choose_geometry: geometry.min_defect_px alone or with
    # tiles "auto", tiles "auto" alone, or geometry.canvas "aspect"): "tiles", the grid, and "why" (from
    # min_defect_px and the backbone's finest tap, or the scale rule; None when only the canvas was
    # chosen), plus "canvas", the canvas line, only with geometry.canvas "aspect"
    tiles_auto: dict[str, Any]
    sheets: int
    estimated_ms_per_frame: float
    # whether the job stores its version as a candidate (normals, calibrate, region), and a
    # compare job's result (compare.py, heat-maps as PNG data URLs)
    candidate: bool
    compare: dict[str, Any]
    # create and normals: the good frames standing apart (core/good_outliers.py OutlierReport.to_json:
    # the rule, each frame's bank index, digest and out-of-fold score, the threshold with and without them)
    outliers: dict[str, Any]

"""Typed records for what crosses processes: registry -> replicas, registry -> HTTP clients.

- :class:`ProductSnapshot`: a product's published version as the detector replicas use it
  (parsed once, by :meth:`ProductSnapshot.from_published`, from what the registry hands out:
  the calibration a :class:`~hetmm_ray.core.scoring.Calibration`, the configuration a
  ``DetectorConfig`` with this host's run-time settings).
- :class:`ProductDescription`: one entry of ``GET /v1/products`` (JSON as it is sent).
- :class:`JobRecord`: a create / normals / calibrate job as ``GET /v1/jobs/{id}`` shows it.

The JSON-bound records are ``TypedDict``s: they are sent as they are, and the keys are the
HTTP API's (README), so a rename here is an API change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict

from .config import DetectorConfig, stored_config
from .core.scoring import Calibration

__all__ = ["JobError", "JobProgressRecord", "JobRecord", "ProductDescription", "ProductSnapshot"]


@dataclass(frozen=True)
class ProductSnapshot:
    """A product's published version for replicas: its scoring metadata and per-layer tiny-set refs."""

    product: str
    version: int
    config: DetectorConfig  # the product's stored settings (run-time ones at their defaults)
    weights_id: str
    calibration: Calibration | None
    # layer -> ObjectRef of the (K, C, H, W) tiny set, owned by the registry (shared memory)
    tiny: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_published(cls, published: dict[str, Any]) -> ProductSnapshot:
        """The record of what ``ProductRegistry.snapshot`` returns (plain JSON-able fields and the
        tiny-set refs): the one place its configuration and calibration are parsed."""
        return cls(
            product=published["product"],
            version=int(published["version"]),
            config=stored_config(published["config"]),
            weights_id=published["weights_id"],
            calibration=Calibration.from_json(published["calibration"]),
            tiny=dict(published["tiny"]),
        )


class ProductDescription(TypedDict):
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


class JobProgressRecord(TypedDict):
    stage: str
    done: int
    total: int


class JobError(TypedDict):
    type: str
    message: str


class JobRecord(TypedDict, total=False):
    id: str
    kind: str  # create | normals | calibrate
    product: str
    state: str  # running | succeeded | failed
    progress: JobProgressRecord
    version: int | None
    error: JobError | None
    created: float
    finished: float | None
    skipped_duplicates: int  # normals: images already in the bank

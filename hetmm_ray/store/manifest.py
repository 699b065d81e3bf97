"""A stored version's manifest as a typed record: parsed once here, read everywhere else.

:meth:`VersionedStore.record <hetmm_ray.store.versioned.VersionedStore.record>` returns a
:class:`VersionRecord` for one version of a product: what the version is (its parent, when it
was made, its images, its stored settings and calibration), never how its bytes are laid out
(chunks and selection objects stay the store's business: store/versioned.py, store/layout.py).

Exact semantics of the fields, for both readable manifest formats (1 and 2):

- ``config``: the product's stored settings, parsed by ``config.stored_config`` (run-time
  settings at their defaults; a stored run-time setting from an older writer is ignored). A
  stored configuration that does not parse raises its ``ConfigError`` from :meth:`parse`.
- ``calibration``: the out-of-fold scores (and any labelled validation result), or None.
- ``parent``: the version this one was published over (None for a product's first version).
- ``created``: unix time of publishing, None if the manifest lacks it.
- ``selected``: whether the version holds a selection (False for ALL, or after an append
  reset it).
- ``sheets_auto``: the ``sheets: auto`` record (chosen K, why, the ladder) when this version's
  selection measured its K; None for a fixed K or without a selection.
- ``migrated_from``: ``{"version", "format"}`` when ``hetmm migrate`` republished it, else None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..config import DetectorConfig, stored_config
from ..core.scoring import Calibration, OperatingPoint, operating_point

__all__ = ["VersionRecord"]


@dataclass(frozen=True)
class VersionRecord:
    """One stored version of a product, as its manifest describes it (see the module docstring)."""

    product: str
    version: int
    format: int
    parent: int | None
    created: float | None
    config: DetectorConfig
    weights_id: str
    layers: tuple[str, ...]
    images: int
    calibration: Calibration | None
    selected: bool
    sheets_auto: Mapping[str, Any] | None
    migrated_from: Mapping[str, Any] | None
    # a tiled product's ``meta["tiles"]`` (hetmm_ray/detection/tiled.py: grid, layers, each position's settings
    # and calibration); None for an untiled one
    tiles: Mapping[str, Any] | None = None
    # the bank's frames' content digests, in bank order (what names the out-of-fold scores' frames,
    # core/good_outliers.py); empty where a manifest holds none
    image_digests: tuple[str, ...] = ()

    @classmethod
    def parse(cls, manifest: Mapping[str, Any]) -> VersionRecord:
        """The record of a verified manifest (``VersionedStore.manifest``); ConfigError if its
        stored configuration does not parse."""
        meta = manifest.get("meta") or {}
        selected = bool(manifest.get("selection"))
        parent = manifest.get("parent")
        created = manifest.get("created")
        return cls(
            product=str(manifest["product"]),
            version=int(manifest["version"]),
            format=int(manifest["format"]),
            parent=None if parent is None else int(parent),
            created=None if created is None else float(created),
            config=stored_config(manifest["config"]),
            weights_id=str(manifest["weights_id"]),
            layers=tuple(manifest["layers"]),
            images=int(manifest["images"]),
            calibration=Calibration.from_json(manifest.get("calibration")),
            selected=selected,
            sheets_auto=meta.get("sheets_auto") if selected else None,
            migrated_from=meta.get("migrated_from"),
            tiles=meta.get("tiles"),
            image_digests=tuple(str(d) for d in manifest.get("image_digests") or ()),
        )

    @property
    def templates(self) -> str:
        """The selection kind (``all``, ``pts_o``, ...)."""
        return self.config.templates.kind

    @property
    def sheets(self) -> int:
        """Sheets the selection holds: ``min(K, images)``, all images for ALL (not the configured K)."""
        return self.config.templates.sheets_of(self.images)

    def operating_point(self) -> OperatingPoint | None:
        """The threshold in force under the stored rule, and its estimated false-alarm rate
        (None without a calibration)."""
        return operating_point(self.calibration, self.config)

    def under_far_rule(self, false_alarm_rate: float) -> dict[str, Any]:
        """This version's stored configuration with the ``far`` rule at ``false_alarm_rate``, to
        republish its templates and out-of-fold scores under (``VersionedStore.republish``; the
        service's far rule and ``hetmm calibrate --far``). TemplateError without out-of-fold scores,
        ConfigError for a rate out of range. A tiled product's tile scales are stored apart and stay
        (hetmm_ray/detection/tiled.py, "One verdict per frame")."""
        from ..core.templates import TemplateError

        if self.calibration is None:
            raise TemplateError(
                f"product {self.product!r} v{self.version} has no out-of-fold scores: the far rule needs them"
            )
        threshold = replace(self.config.threshold, rule="far", false_alarm_rate=false_alarm_rate)
        return replace(self.config, threshold=threshold).stored_dict()

"""Persistence of a detector through a template store, and serving copies.

``save`` publishes a scorer's installed template set (a new version); ``load`` builds a
detector from a stored version (``overrides`` change this run's settings only,
config.RUN_TIME_SETTINGS) and refuses templates built with other backbone weights; ``serving``
builds a predict-only detector over a tiny set, as the service's replicas hold it.

Functions over a detector's public scorer (``scorer.py``), not a part of it:
:class:`~hetmm_ray.detection.detector.HETMM`'s ``save``, ``load`` and ``serving`` call them with its
scorer (or its class, ``make``), so this module never imports the detector.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from torch import Tensor

from ..config import DetectorConfig
from ..core.templates import TemplateError, TemplateMeta, TemplateSet
from .fit_steps import FitSteps
from .scorer import Scorer

if TYPE_CHECKING:
    from ..core.backbone import Backbone
    from ..store.protocol import Store

__all__ = ["Persisted", "load", "save", "serving"]


class Persisted(Protocol):
    """What persistence needs of a detector: its scorer."""

    scorer: Scorer


def save(scorer: Scorer, store: Store, product: str) -> int:
    """Publish ``scorer``'s installed template set to ``store``; returns the new version."""
    scorer.version = store.put(product, scorer.require_templates())
    return scorer.version


def load(
    make: Any,
    store: Store,
    product: str,
    version: int | None = None,
    *,
    progress: bool = False,
    steps: FitSteps | None = None,
    **overrides: Any,
) -> Any:
    """A detector (``make(config, progress=, steps=)``) from a stored template set;
    ``overrides`` change run-time settings (device, dtype...)."""
    if version is None:
        version = store.head(product)
    ts = store.get(product, version)
    config = ts.config.replace(**overrides) if overrides else ts.config
    det = make(config, progress=progress, steps=steps)
    if det.scorer.backbone.weights_id != ts.weights_id:
        raise TemplateError(
            f"product {product!r} v{version} was built with weights {ts.weights_id}, "
            f"but the backbone now loads {det.scorer.backbone.weights_id}"
        )
    det.scorer.install(replace(ts, config=config), version, config=config)
    return det


def serving(
    make: Any,
    config: DetectorConfig,
    templates: dict[str, Tensor],
    *,
    weights_id: str,
    calibration: Any,
    version: int | None,
    backbone: Backbone | None = None,
) -> Any:
    """A predict-only detector (``make(config)``) over a tiny set (layer -> (K, C, H, W)), as
    replicas hold it. ``backbone`` shares one already-built backbone between products with the same one.
    """
    det = make(config)
    scorer: Scorer = det.scorer
    if backbone is not None:
        scorer.backbone = backbone
    if scorer.backbone.weights_id != weights_id:
        raise TemplateError(
            f"templates were built with weights {weights_id}, the backbone has {scorer.backbone.weights_id}"
        )
    k = next(iter(templates.values())).shape[0]
    ts = TemplateSet(
        bank=templates,
        config=config,
        weights_id=weights_id,
        image_digests=tuple(f"sheet-{i}" for i in range(k)),  # sheets, not images: nothing to refit from
        calibration=calibration,
        meta=TemplateMeta({"tiny": True}),
    )
    scorer.install(ts, version, config=config)
    return det

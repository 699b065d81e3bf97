"""The injectable steps of a fit: where its work runs, in process or elsewhere.

The fit pipeline (``fitting.FitPipeline``) runs extract -> select -> calibrate. Its steps may
run somewhere else without the pipeline knowing where: ``FitSteps.extract`` builds the feature
bank of a list of images, ``FitSteps.pts`` runs PTS over one layer's bank, ``FitSteps.select``
makes a fixed-K selection of every layer, ``FitSteps.select_folds`` makes the out-of-fold
calibration's selections (one per fold, from the fold's kept images), ``FitSteps.auto_select``
measures ``sheets: auto`` and ``FitSteps.calibrate`` computes the out-of-fold calibration.
Left at None, each runs in this process (the scorer's backbone; ``core.pts``; the pipeline's own methods).
``hetmm_ray.distributed.ray_steps.ray_steps()`` gives the Ray versions of extract and PTS (image
batches and pixel chunks as tasks); the service's registry (``distributed/registry.py``) also
selects on its template shards and calibrates in tasks. The single-process API never imports Ray.

Contracts (what an injected step must return, exactly as the in-process step would):

- ``extract(config, images, progress)`` -> (layer -> ``(N, C, h, w)`` numpy array holding
  ``config.bank_dtype`` values, the N image digests of ``core.device.image_digest``) in input
  order; ``progress(done, total)`` as images finish. Pad cells are zeroed (letterbox).
- ``pts(bank, k, init, *, seed, progress)`` -> ``core.pts.pts_indices(bank, k, init, seed=seed)``.
- ``select(ts, templates, *, progress)`` -> ``core.pts.select_layers(ts.bank, templates.kind,
  templates.sheets, templates.seed)``: per-layer (indices, centres); ``progress`` counts pixels.
- ``select_folds(bank, templates, kept, *, progress)`` -> for each fold's kept rows ``rows`` (in
  order), ``core.pts.select_layers({layer: b[rows]}, templates.kind, templates.sheets,
  templates.seed)``; ``progress`` counts folds. Indices point into the fold's kept bank.
- ``auto_select(ts)`` -> ``FitPipeline.auto_selected(ts)``; ``calibrate(ts)`` -> ``ts`` with the
  calibration ``FitPipeline.calibrated`` computes in process.

A :class:`Report` (the service's ``JobProgress``) hears each stage's name and its counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from torch import Tensor

from ..config import DetectorConfig, TemplateConfig

if TYPE_CHECKING:
    from ..core.templates import TemplateSet

__all__ = [
    "ExtractStep",
    "FitSteps",
    "FoldSelectStep",
    "Progress",
    "PtsStep",
    "Report",
    "SelectStep",
    "Selection",
    "TemplateStep",
]

Progress = Callable[[int, int], None]
Selection = tuple[dict[str, Tensor] | None, dict[str, Tensor] | None]
"""Per-layer (indices, centres), each None when the selection kind has none (``select_layers``)."""


class ExtractStep(Protocol):
    def __call__(
        self, config: DetectorConfig, images: Sequence[Any], *, progress: Progress | None = None
    ) -> tuple[dict[str, np.ndarray], list[str]]: ...


class PtsStep(Protocol):
    def __call__(
        self, bank: Tensor, k: int, init: str = "optics", *, seed: int = 0, progress: Progress | None = None
    ) -> Tensor: ...


class SelectStep(Protocol):
    def __call__(
        self, ts: TemplateSet, templates: TemplateConfig, *, progress: Progress | None = None
    ) -> Selection: ...


class FoldSelectStep(Protocol):
    def __call__(
        self,
        bank: dict[str, Tensor],
        templates: TemplateConfig,
        kept: Sequence[Sequence[int]],
        *,
        progress: Progress | None = None,
    ) -> list[Selection]: ...


class TemplateStep(Protocol):
    def __call__(self, ts: TemplateSet) -> TemplateSet: ...


class Report(Protocol):
    """Hears a fit's progress: each stage's name and total, then done/total counts of it."""

    def stage(self, name: str, total: int = 0) -> None: ...
    def __call__(self, done: int, total: int) -> None: ...


@dataclass(frozen=True)
class FitSteps:
    """Where a fit's steps run (None: in this process)."""

    extract: ExtractStep | None = None
    pts: PtsStep | None = None
    select: SelectStep | None = None
    select_folds: FoldSelectStep | None = None
    auto_select: TemplateStep | None = None
    calibrate: TemplateStep | None = None

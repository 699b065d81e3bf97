"""The injectable steps of a fit: feature extraction and PTS, in process or elsewhere.

:class:`~hetmm_ray.detector.HETMM` runs extract -> select -> calibrate. Two of those steps
may run somewhere else without the detector knowing where: ``FitSteps.extract`` builds the
feature bank of a list of images, ``FitSteps.pts`` runs PTS over one layer's bank. Left at
None, both run in this process (the detector's backbone; ``core.pts.pts_indices``).
``hetmm_ray.distributed.steps.ray_steps()`` gives the Ray versions (image batches and pixel
chunks as tasks): the single-process API never imports Ray.

Contracts (what an injected step must return, exactly as the in-process step would):

- ``extract(config, images, progress)`` -> (layer -> ``(N, C, h, w)`` numpy array holding
  ``config.bank_dtype`` values, the N image digests of ``core.device.image_digest``) in input
  order; ``progress(done, total)`` as images finish. Pad cells are zeroed (letterbox).
- ``pts(bank, k, init, *, seed, progress)`` -> ``core.pts.pts_indices(bank, k, init, seed=seed)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from torch import Tensor

from .config import DetectorConfig

__all__ = ["ExtractStep", "FitSteps", "PtsStep"]

Progress = Callable[[int, int], None]


class ExtractStep(Protocol):
    def __call__(
        self, config: DetectorConfig, images: Sequence[Any], *, progress: Progress | None = None
    ) -> tuple[dict[str, np.ndarray], list[str]]: ...


class PtsStep(Protocol):
    def __call__(
        self, bank: Tensor, k: int, init: str = "optics", *, seed: int = 0, progress: Progress | None = None
    ) -> Tensor: ...


@dataclass(frozen=True)
class FitSteps:
    """Where a fit's feature extraction and PTS run (None: in this process)."""

    extract: ExtractStep | None = None
    pts: PtsStep | None = None

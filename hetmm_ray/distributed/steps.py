"""The Ray versions of a fit's injectable steps (``hetmm_ray/steps.py``).

``HETMM(config, steps=ray_steps())`` extracts features as image-batch tasks
(:func:`~hetmm_ray.distributed.extract.extract_features_ray`) and runs PTS as pixel-chunk
tasks (:func:`~hetmm_ray.distributed.pts_fanout.pts_indices_ray`) on the connected cluster;
results equal the in-process steps'.
"""

from __future__ import annotations

from ..steps import FitSteps
from .extract import extract_features_ray
from .pts_fanout import pts_indices_ray

__all__ = ["ray_steps"]


def ray_steps() -> FitSteps:
    return FitSteps(extract=extract_features_ray, pts=pts_indices_ray)

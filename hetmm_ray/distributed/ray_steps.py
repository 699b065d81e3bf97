"""The Ray versions of a fit's injectable steps (``hetmm_ray/detection/fit_steps.py``).

``HETMM(config, steps=ray_steps())`` extracts features as image-batch tasks
(:func:`~hetmm_ray.distributed.extract.extract_features_ray`), runs PTS as pixel-chunk
tasks (:func:`~hetmm_ray.distributed.pts_fanout.pts_indices_ray`) and the out-of-fold
calibration's selections as one task per fold (:func:`select_folds_ray`) on the connected
cluster; results equal the in-process steps'.

The service's registry runs the same fit pipeline with :func:`service_steps`: PTS as pixel-chunk
tasks, ``sheets: auto`` and the out-of-fold calibration each in a task (the in-process pipeline
there, reporting its progress to the job through :class:`JobReport`; its fold selections again
one task per fold), and a hot update's fixed-K selection on the product's template shards
(:func:`shard_select`).

Why a task per fold: a compressed product's calibration makes ten selections (PTS on a
large bank is slow, ten of them in a row much slower). In one process each selection already
uses every core, so running them side by side there would gain nothing; on a cluster the ten
run at once, each on its own CPUs. Each fold task holds its kept bank (all but its fold)
while it selects.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import ray
import torch

from ..config import TASK_CPUS, TemplateConfig
from ..core.pts import select_layers
from ..core.templates import TemplateSet
from ..detection.fit_steps import FitSteps, Progress, Selection
from .extract import extract_features_ray
from .pts_fanout import pts_indices_ray
from .runtime import as_completed, use_assigned_cpus

if TYPE_CHECKING:
    from ..detection.fitting import FitPipeline

__all__ = ["JobReport", "ray_steps", "select_folds_ray", "service_steps", "shard_select"]


def ray_steps() -> FitSteps:
    return FitSteps(extract=extract_features_ray, pts=pts_indices_ray, select_folds=select_folds_ray)


@ray.remote(num_cpus=TASK_CPUS)
def _fold_selection(
    bank: dict[str, torch.Tensor], rows: list[int], kind: str, sheets: int | str, seed: int
) -> Selection:
    """One fold's selection from its kept ``rows`` of the bank (``FitPipeline.fold_selections``)."""
    use_assigned_cpus()
    kept = torch.as_tensor(rows, dtype=torch.long)
    return select_layers({k: v[kept] for k, v in bank.items()}, kind, sheets, seed)


def select_folds_ray(
    bank: dict[str, torch.Tensor],
    templates: TemplateConfig,
    kept: Sequence[Sequence[int]],
    *,
    progress: Progress | None = None,
) -> list[Selection]:
    """The ``select_folds`` step (``hetmm_ray/detection/fit_steps.py``): every fold's selection as its own task,
    all at once, the bank put in the object store once. Needs a connected Ray."""
    ref = ray.put({k: v.detach().cpu() for k, v in bank.items()})  # any bank dtype (bfloat16 too)
    tc = templates
    refs = [_fold_selection.remote(ref, [int(i) for i in rows], tc.kind, tc.sheets, tc.seed) for rows in kept]
    for done, _ in enumerate(as_completed(refs), 1):
        if progress is not None:
            progress(done, len(refs))
    return ray.get(refs)


class JobReport:
    """A fit's progress from a task to its job in the registry (``ProductRegistry.job_report``):
    stages always, counts at most every ``every_s`` seconds (and the last)."""

    def __init__(self, registry: Any, job_id: str, every_s: float = 0.5) -> None:
        self.registry, self.job_id, self.every_s = registry, job_id, every_s
        self._last = 0.0

    def stage(self, name: str, total: int = 0) -> None:
        self.registry.job_report.remote(self.job_id, name, 0, total)

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done >= total or now - self._last >= self.every_s:
            self._last = now
            self.registry.job_report.remote(self.job_id, None, done, total)


def _task_pipeline(ts: TemplateSet, report: JobReport | None) -> FitPipeline:
    """The in-process fit pipeline inside a task, on the task's full CPUs (the registry itself
    runs on a sliver of one)."""
    from ..detection.detector import HETMM  # torchvision only where a backbone is involved
    from ..detection.fitting import FitPipeline

    use_assigned_cpus()
    return FitPipeline(HETMM(ts.config).scorer, steps=FitSteps(select_folds=select_folds_ray), report=report)


@ray.remote(num_cpus=TASK_CPUS)
def _calibrated(ts: TemplateSet, report: JobReport | None = None) -> TemplateSet:
    """The out-of-fold calibration (``FitPipeline.calibrated``) in a task."""
    return _task_pipeline(ts, report).calibrated(ts)


@ray.remote(num_cpus=TASK_CPUS)
def _auto_selected(ts: TemplateSet, report: JobReport | None = None) -> TemplateSet:
    """``templates.sheets: auto`` (``FitPipeline.auto_selected``) in one task: the ladder's
    selections and out-of-fold scorings; the result's config holds the chosen K (hot updates keep it)."""
    return _task_pipeline(ts, report).auto_selected(ts)


def shard_select(
    shards: dict[str, Any], ts: TemplateSet, tc: TemplateConfig, *, progress: Progress | None = None
) -> tuple[dict[str, torch.Tensor] | None, dict[str, torch.Tensor] | None]:
    """The fixed-K selection step of a hot update, on the product's shards (layer -> shard
    handle; they already hold the grown bank): each re-selects its layer (``LayerShard.select``,
    PTS fanned out as tasks), then hands its selection back."""
    ray.get([s.select.remote(tc.kind, tc.sheets, tc.seed) for s in shards.values()])
    chosen = dict(zip(ts.layers, ray.get([shards[k].selection.remote() for k in ts.layers]), strict=True))
    indices, centres = (
        {k: torch.from_numpy(np.array(c[part])) for k, c in chosen.items() if c[part] is not None} or None
        for part in ("indices", "centres")
    )
    return indices, centres


def service_steps(shards: dict[str, Any] | None = None, report: JobReport | None = None) -> FitSteps:
    """The registry's steps (see the module docstring); ``shards``: a hot update's shards, which
    select; ``report``: where the tasks report progress. Call the pipeline from a thread: these
    steps wait on Ray."""
    return FitSteps(
        pts=partial(pts_indices_ray, num_cpus=TASK_CPUS),
        select=None if shards is None else partial(shard_select, shards),
        # Ray's stubs count a remote function's parameters without their defaults (RemoteFunction0)
        auto_select=lambda ts: ray.get(_auto_selected.remote(ts, report)),  # type: ignore[call-arg]
        calibrate=lambda ts: ray.get(_calibrated.remote(ts, report)),  # type: ignore[call-arg]
    )

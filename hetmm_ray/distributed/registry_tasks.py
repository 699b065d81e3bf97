"""The registry's task bodies (``distributed/registry.py``): each job's long work as a Ray task on a
full CPU, over one detector (``detectors.load_detector`` / ``new_detector``) or the compare of two
versions. The actor starts them and publishes what they return; nothing here holds state.

- :func:`fit_in_task`, :func:`update_in_task`, :func:`with_region_in_task`: a product's create, hot
  update and region change as one detector in a task (a tiled product's path: its tiles are cut from
  whole frames in one process; :func:`whole_frames` says which products take it).
- :func:`labelled_calibration`: labelled validation (``validation.calibrate_with_labels``).
- :func:`compare_task`: ``compare.compare_versions`` as JSON for a compare job's record.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import ray

from ..config import TASK_CPUS, DetectorConfig
from ..core.templates import TemplateSet
from ..steps import FitSteps
from ..store import open_store
from .pts_fanout import pts_indices_ray
from .runtime import use_assigned_cpus
from .steps import JobReport

__all__ = [
    "COMPARE_MAP_SIZE",
    "compare_task",
    "fit_in_task",
    "labelled_calibration",
    "update_in_task",
    "whole_frames",
    "with_region_in_task",
]

COMPARE_MAP_SIZE = 512  # a tiled product's compare heat-maps: long side at most (a frame's map is large)


@ray.remote(num_cpus=TASK_CPUS)
def labelled_calibration(
    store_uri: str, product: str, version: int, images: list[bytes], labels: list[int], objective: str, cap: float
) -> tuple[TemplateSet, dict[str, Any]]:
    """Score labelled images with ``version`` and choose its validation threshold (hetmm_ray.validation;
    a tiled product at the frame level, its frames at their own resolution)."""
    from ..data.decode import decode_image
    from ..detectors import load_detector
    from ..validation import calibrate_with_labels

    use_assigned_cpus()
    det = load_detector(open_store(store_uri), product, version)
    decoded = [decode_image(data) for data in images]
    return calibrate_with_labels(det, decoded, labels, objective=objective, max_false_alarm_rate=cap)


@ray.remote(num_cpus=TASK_CPUS)
def compare_task(
    store_uri: str,
    product: str,
    candidate: int,
    base: int | None,
    images: list[tuple[str, bytes]],
    labels: list[int] | None,
    max_maps: int,
) -> dict[str, Any]:
    """``compare.compare_versions`` of ``candidate`` against ``base`` (None = HEAD) on encoded images,
    as JSON (flips' heat-maps as PNG data URLs, the first ``max_maps`` flips only; each side's map at
    most ``COMPARE_MAP_SIZE`` pixels long for a tiled product)."""
    from ..compare import as_json, compare_versions
    from ..data.decode import decode_image

    use_assigned_cpus()
    decoded = [(name, decode_image(data, source=name)) for name, data in images]
    result = compare_versions(
        open_store(store_uri), product, candidate, decoded, labels, base=base, map_size=COMPARE_MAP_SIZE
    )
    for flip in result["flips"][max_maps:]:
        flip.pop("heatmaps", None)
    return as_json(result)


def whole_frames(config: DetectorConfig) -> bool:
    """Whether a product's create, hot update and region jobs run as one detector in a task (the
    ``*_in_task`` functions), not on the sharded path. The one kind check of this module: a tiled
    product's tiles are cut from whole frames in one process, while a frame on one canvas is
    extracted as image-batch tasks across the cluster and grows its layer shards in place (its
    features never need the whole frame together)."""
    return config.geometry.tiled


def _fanned_out_pts() -> FitSteps:
    """A tiled job's steps: each position's PTS as pixel-chunk tasks of a full CPU each."""
    return FitSteps(pts=partial(pts_indices_ray, num_cpus=TASK_CPUS))


@ray.remote(num_cpus=TASK_CPUS)
def fit_in_task(config: dict[str, Any], images: list[bytes], registry: Any, job_id: str | None) -> TemplateSet:
    """A product fit as one detector (``detectors.new_detector``) in one task on a full CPU: every
    frame decoded, its canvases (a tiled product's tiles of several frames together) through the
    backbone, each position's selection with PTS fanned out as pixel-chunk tasks. Before the long
    work it reports the layout, the sheets per position and the estimated ms per frame to the job."""
    from ..data.decode import decode_image
    from ..detectors import new_detector

    use_assigned_cpus()
    cfg = DetectorConfig.from_dict(config)
    frames = [decode_image(data) for data in images]
    det = new_detector(cfg, frames, steps=_fanned_out_pts())
    report = None if job_id is None else JobReport(registry, job_id)
    if report is not None:
        det.report_to(report)
        layout = det.layout(max(f.shape[0] for f in frames), max(f.shape[1] for f in frames))
        sheets = cfg.templates.sheets_of(len(frames))
        ms = det.estimate_ms_per_frame(frames[0], len(frames))
        facts = {
            "tiles": [layout.rows, layout.cols],
            "tile_px": [layout.tile_height, layout.tile_width],
            "sheets": sheets,
            "estimated_ms_per_frame": round(ms, 1),
        }
        ray.get(registry.job_note.remote(job_id, facts))
        report.stage(
            f"fit {layout.rows} x {layout.cols} tiles ({layout.tile_height} x {layout.tile_width} px), "
            f"{sheets} sheets{layout.per_tile}, about {ms:.0f} ms per frame",
            len(frames),
        )
    det.fit(frames)
    return det.template_set()


@ray.remote(num_cpus=TASK_CPUS)
def update_in_task(store_uri: str, product: str, version: int, images: list[bytes]) -> tuple[TemplateSet | None, int]:
    """``Detector.update`` of ``product`` at ``version`` with encoded good frames, in a task (PTS fanned
    out): the new template set (None when every frame was already held) and how many frames it added."""
    from ..data.decode import decode_image
    from ..detectors import load_detector

    use_assigned_cpus()
    det = load_detector(open_store(store_uri), product, version, steps=_fanned_out_pts())
    det.update([decode_image(data) for data in images])
    added = len(images) - det.skipped_duplicates
    return (det.template_set() if added else None), added


@ray.remote(num_cpus=TASK_CPUS)
def with_region_in_task(store_uri: str, product: str, version: int, region: dict[str, Any] | None) -> TemplateSet:
    """``product`` at ``version`` under another region (``Detector.with_region``: the templates kept,
    every position recalibrated under its part), in a task; unsaved."""
    from ..detectors import load_detector

    use_assigned_cpus()
    return load_detector(open_store(store_uri), product, version).with_region(region).template_set()

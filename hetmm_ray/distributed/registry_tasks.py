"""The registry's task bodies (``distributed/registry.py``): each job's long work as a Ray task on a
full CPU, over one detector (``detector_choice.load_detector``, ``tiled.TiledHETMM``) or the compare of two
versions. The actor starts them and publishes what they return; nothing here holds state. A tiled
product's create and hot update are spread over tasks by ``position_fit.py``.

- :func:`whole_frames`: which products' create and hot update take the tiled path.
- :func:`with_region_in_task`: any product's region change (``Detector.with_region``, what ``hetmm
  region`` runs) as one detector in a task.
- :func:`labelled_calibration`: labelled validation (``validation.calibrate_with_labels``).
- :func:`compare_task`: ``compare.compare_versions`` as JSON for a compare job's record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ray

from ..config import TASK_CPUS, DetectorConfig
from ..core.templates import TemplateSet
from ..store import open_store
from .runtime import use_assigned_cpus

if TYPE_CHECKING:
    from ..detection.interface import Layout

__all__ = [
    "COMPARE_MAP_SIZE",
    "compare_task",
    "fit_line",
    "labelled_calibration",
    "whole_frames",
    "with_region_in_task",
]

COMPARE_MAP_SIZE = 512  # a tiled product's compare heat-maps: long side at most (a frame's map is large)


@ray.remote(num_cpus=TASK_CPUS)
def labelled_calibration(
    store_uri: str, product: str, version: int, images: list[bytes], labels: list[int], objective: str, cap: float
) -> tuple[TemplateSet, dict[str, Any]]:
    """Score labelled images with ``version`` and choose its validation threshold (hetmm_ray.workflows.validation;
    a tiled product at the frame level, its frames at their own resolution)."""
    from ..data.decode import decode_image
    from ..detection.detector_choice import load_detector
    from ..workflows.validation import calibrate_with_labels

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
    from ..data.decode import decode_image
    from ..workflows.compare import as_json, compare_versions

    use_assigned_cpus()
    decoded = [(name, decode_image(data, source=name)) for name, data in images]
    result = compare_versions(
        open_store(store_uri), product, candidate, decoded, labels, base=base, map_size=COMPARE_MAP_SIZE
    )
    for flip in result["flips"][max_maps:]:
        flip.pop("heatmaps", None)
    return as_json(result)


def whole_frames(config: DetectorConfig) -> bool:
    """Whether a product's create and hot update jobs take the tiled path (a frame's tiles cut where
    its frame is: whole frames go into the feature tasks, each task extracts every position of its
    frames, and each position is fit or grown in tasks of its own, ``position_fit.py``), not the
    sharded path of a frame on one canvas (its features extracted as image-batch tasks, its layer
    shards grown in place)."""
    return config.geometry.tiled


def fit_line(layout: Layout, sheets: int, ms: float) -> str:
    """A tiled create's fit stage in its job's record: ``fit 2 x 2 tiles (68 x 68 px), 4 sheets per
    tile, about 12 ms per frame``."""
    return (
        f"fit {layout.rows} x {layout.cols} tiles ({layout.tile_height} x {layout.tile_width} px), "
        f"{sheets} sheets{layout.per_tile}, about {ms:.0f} ms per frame"
    )


@ray.remote(num_cpus=TASK_CPUS)
def with_region_in_task(store_uri: str, product: str, version: int, region: dict[str, Any] | None) -> TemplateSet:
    """``product`` at ``version`` under another region (``Detector.with_region``: the templates kept,
    every position recalibrated under its part), in a task; unsaved."""
    from ..detection.detector_choice import load_detector

    use_assigned_cpus()
    return load_detector(open_store(store_uri), product, version).with_region(region).template_set()

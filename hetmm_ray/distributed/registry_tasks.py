"""The registry's task bodies (``distributed/registry.py``): each job's long work as a Ray task on a
full CPU, over one detector (``detector_choice.load_detector``, ``tiled.TiledHETMM``) or the compare of two
versions. The actor starts them and publishes what they return; nothing here holds state.

- :func:`fit_tiles_ray`, :func:`update_tiles_ray`: a tiled product's create and hot update from its
  frames' tile features, which frame-batch tasks extracted across the cluster first
  (``extract.extract_tiles_ray``): one task per position (:func:`fit_position_task`,
  :func:`update_position_task`) reads that position's rows of every batch and fits or grows it
  (``TiledHETMM.fit_position`` / ``update_position``, PTS fanned out), so the positions spread over
  the cluster as the frames did; :func:`tiles_fitted` / :func:`tiles_updated` join them into the
  product (``TiledHETMM.with_positions``: the scales and the frame calibration), exactly what one
  ``TiledHETMM`` in one process fits. :func:`whole_frames` says which products take these paths.
- :func:`with_region_in_task`: any product's region change (``Detector.with_region``, what ``hetmm
  region`` runs) as one detector in a task.
- :func:`labelled_calibration`: labelled validation (``validation.calibrate_with_labels``).
- :func:`compare_task`: ``compare.compare_versions`` as JSON for a compare job's record.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import ray

from ..config import TASK_CPUS, DetectorConfig
from ..core.templates import TemplateSet
from ..detection.fit_steps import FitSteps
from ..store import open_store
from .pts_fanout import pts_indices_ray
from .ray_steps import JobReport
from .runtime import use_assigned_cpus

if TYPE_CHECKING:
    from ..detection.interface import Layout
    from ..detection.tiled import TileFeatures
    from .extract import TileBatches

__all__ = [
    "COMPARE_MAP_SIZE",
    "compare_task",
    "fit_line",
    "fit_position_task",
    "fit_tiles_ray",
    "labelled_calibration",
    "tiles_fitted",
    "tiles_updated",
    "update_position_task",
    "update_tiles_ray",
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
    frames, and one detector in a task fits or grows every position from them), not the sharded
    path of a frame on one canvas (its features extracted as image-batch tasks, its layer shards
    grown in place)."""
    return config.geometry.tiled


def _fanned_out_pts() -> FitSteps:
    """A tiled job's steps: each position's PTS as pixel-chunk tasks of a full CPU each."""
    return FitSteps(pts=partial(pts_indices_ray, num_cpus=TASK_CPUS))


def fit_line(layout: Layout, sheets: int, ms: float) -> str:
    """A tiled create's fit stage in its job's record: ``fit 2 x 2 tiles (68 x 68 px), 4 sheets per
    tile, about 12 ms per frame``."""
    return (
        f"fit {layout.rows} x {layout.cols} tiles ({layout.tile_height} x {layout.tile_width} px), "
        f"{sheets} sheets{layout.per_tile}, about {ms:.0f} ms per frame"
    )


def _position_rows(parts: list[ray.ObjectRef]) -> TileFeatures:
    """One position's rows of every frame batch (``extract.TileBatches.positions[p]``), joined in
    input order."""
    from ..detection.tiled import TileFeatures

    return TileFeatures.gathered(ray.get(parts))


@ray.remote(num_cpus=TASK_CPUS)
def fit_position_task(
    config: dict[str, Any],
    parts: list[ray.ObjectRef],
    cost_image: bytes,
    registry: Any,
    job_id: str | None,
) -> tuple[TemplateSet, dict[str, Any]]:
    """One position's fit (``TiledHETMM.fit_position``, its PTS fanned out as pixel-chunk tasks) from its
    rows of the frame batches (``parts``: ``extract.TileBatches.positions[p]``); ``cost_image``: the first
    frame, encoded (``sheets: auto``'s time budget is measured on it). The position's stages go to
    the job (``job_id``) through ``registry``. Returns the position's set and :func:`_ran` of it."""
    from ..detection.tiled import TiledHETMM

    use_assigned_cpus()
    report = None if job_id is None else JobReport(registry, job_id)
    det = TiledHETMM(DetectorConfig.from_dict(config), steps=_fanned_out_pts(), report=report)
    rows = _position_rows(parts)
    return det.fit_position(rows, cost_image), _ran(rows)


def _ran(rows: TileFeatures) -> dict[str, Any]:
    """What a position task reports beside its set: the frames' sizes (the training frame size is
    their largest) and the node it ran on."""
    return {"shapes": rows.shapes, "node": ray.get_runtime_context().get_node_id()}


@ray.remote(num_cpus=TASK_CPUS)
def update_position_task(
    store_uri: str, product: str, version: int, parts: list[ray.ObjectRef], images: list[bytes]
) -> tuple[TemplateSet | None, dict[str, Any]]:
    """One position of ``product`` at ``version`` grown by the new frames (``TiledHETMM.update_position``,
    PTS fanned out) from its rows of the frame batches (``parts`` as in :func:`fit_position_task`)
    and the encoded frames (only the first new one is read: ``sheets: auto``'s budget): the
    position's new set (None when every frame was already held) and :func:`_ran` of it."""
    from ..detection.tiled import TiledHETMM

    use_assigned_cpus()
    det = TiledHETMM.from_store(open_store(store_uri), product, version, steps=_fanned_out_pts())
    rows = _position_rows(parts)
    return det.update_position(rows, images), _ran(rows)


def fit_tiles_ray(
    config: DetectorConfig,
    batches: TileBatches,
    cost_image: bytes,
    registry: Any = None,
    job_id: str | None = None,
    *,
    num_cpus: float = TASK_CPUS,
) -> list[ray.ObjectRef]:
    """A tiled product's fit spread over the cluster: one :func:`fit_position_task` of ``num_cpus``
    CPUs per position (the tiles, then the whole view; SPREAD over the nodes), each reading only
    its rows of the frame batches; the refs of their results, in position order
    (:func:`tiles_fitted` joins them)."""
    cfg, task = config.to_dict(), fit_position_task.options(num_cpus=num_cpus, scheduling_strategy="SPREAD")
    return [task.remote(cfg, parts, cost_image, registry, job_id) for parts in batches.positions]


def update_tiles_ray(
    store_uri: str, product: str, version: int, batches: TileBatches, images: list[bytes]
) -> list[ray.ObjectRef]:
    """A tiled product's hot update spread over the cluster: one :func:`update_position_task` per
    position (SPREAD over the nodes); the refs of their results, in position order
    (:func:`tiles_updated` joins them)."""
    task = update_position_task.options(scheduling_strategy="SPREAD")
    return [task.remote(store_uri, product, version, parts, images) for parts in batches.positions]


def tiles_fitted(config: DetectorConfig, results: list[tuple[TemplateSet, dict[str, Any]]]) -> TemplateSet:
    """The product's unsaved template set from every position's fit (:func:`fit_tiles_ray`'s
    results): what ``TiledHETMM(config).fit(frames)`` gives (``TiledHETMM.with_positions``)."""
    from ..detection.tiled import TiledHETMM

    sets = [ts for ts, _ in results]
    return TiledHETMM(config).with_positions(sets, results[0][1]["shapes"]).template_set()


def tiles_updated(
    head: TemplateSet, results: list[tuple[TemplateSet | None, dict[str, Any]]]
) -> tuple[TemplateSet | None, int]:
    """The hot update's unsaved template set from every position's (:func:`update_tiles_ray`'s
    results) over ``head`` (the version they grew), and how many frames it added; (None, 0) when
    every frame was already held."""
    from ..detection.tiled import TiledHETMM

    sets = [ts for ts, _ in results]
    if any(ts is None for ts in sets):
        if not all(ts is None for ts in sets):
            raise RuntimeError("positions of one hot update disagree on the frames already held")
        return None, 0
    grown = TiledHETMM.from_template_set(head).with_positions(sets, results[0][1]["shapes"]).template_set()  # type: ignore[arg-type]
    return grown, grown.n_images - head.n_images


@ray.remote(num_cpus=TASK_CPUS)
def with_region_in_task(store_uri: str, product: str, version: int, region: dict[str, Any] | None) -> TemplateSet:
    """``product`` at ``version`` under another region (``Detector.with_region``: the templates kept,
    every position recalibrated under its part), in a task; unsaved."""
    from ..detection.detector_choice import load_detector

    use_assigned_cpus()
    return load_detector(open_store(store_uri), product, version).with_region(region).template_set()

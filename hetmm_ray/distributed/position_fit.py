"""A tiled product's create and hot update spread over the cluster, position by position.

The frames' tile features come from frame-batch tasks (``extract.extract_tiles_ray``), a part per
position in the object store (``extract.TileBatches.positions``). Then, exactly as one
``TiledHETMM`` in one process fits or grows every position (``hetmm_ray/detection/tiled.py``):

- **Select.** One task per position (:func:`fit_position_task`, :func:`update_position_task`;
  SPREAD over the nodes) reads that position's parts alone, builds or grows its bank and selects
  its templates (``TiledHETMM.fit_position`` / ``update_position`` with ``calibrate=False``, PTS
  fanned out as pixel-chunk tasks). Its result stays in the object store.
- **Calibrate.** Each position's out-of-fold folds are cut into :func:`fold_chunks` consecutive
  ranges, one task each (:func:`position_scores_task`, ``TiledHETMM.position_scores``), started
  as soon as their position is selected: a position's calibration is most of its fit, and
  ranges of it let the positions' work fill every task slot to the end instead of leaving the
  last positions to a few nodes.
- **Join.** :func:`tiles_fitted` / :func:`tiles_updated` calibrate each position from its
  ranges in fold order (``TiledHETMM.calibrated_position``: the same scores one call gives) and
  join the positions (``TiledHETMM.with_positions``: the scales and the frame calibration).

The position and fold-range tasks are all started by the caller (the registry actor, or a
benchmark's driver), the fold ranges depending on their position's result, not started by it: a
task waiting on tasks it started holds its worker while they need new ones. Only a position's PTS
(kind ``pts``) fans out from inside its task, as pixel chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import ray

from ..config import TASK_CPUS, DetectorConfig
from ..core.calibration import OutOfFold
from ..core.templates import TemplateSet
from ..detection.fit_steps import FitSteps
from .pts_fanout import pts_indices_ray
from .ray_steps import JobReport
from .runtime import task_slots, use_assigned_cpus

if TYPE_CHECKING:
    from ..detection.tiled import TiledHETMM, TileFeatures
    from .extract import TileBatches

__all__ = [
    "PositionFits",
    "fit_position_task",
    "fit_tiles_ray",
    "fold_chunks",
    "position_scores_task",
    "tiles_fitted",
    "tiles_updated",
    "update_position_task",
    "update_tiles_ray",
]

Selected = tuple[TemplateSet | None, dict[str, Any]]
"""A position task's result: the position's selected, uncalibrated set (None: a hot update whose
frames were all held already) and what :func:`_ran` reports."""
Results = tuple[list[Selected], list[list[OutOfFold | None]]]
"""Every task's result of a spread fit or hot update (:meth:`PositionFits.results`)."""


def _fanned_out_pts() -> FitSteps:
    """A position's steps: its PTS as pixel-chunk tasks of a full CPU each."""
    return FitSteps(pts=partial(pts_indices_ray, num_cpus=TASK_CPUS))


def _position_rows(parts: list[ray.ObjectRef]) -> TileFeatures:
    """One position's rows of every frame batch (``extract.TileBatches.positions[p]``), joined in
    input order."""
    from ..detection.tiled import TileFeatures

    return TileFeatures.gathered(ray.get(parts))


def _ran(rows: TileFeatures) -> dict[str, Any]:
    """What a position task reports beside its set: the frames' sizes (the training frame size is
    their largest) and the node it ran on."""
    return {"shapes": rows.shapes, "node": ray.get_runtime_context().get_node_id()}


@ray.remote(num_cpus=TASK_CPUS)
def fit_position_task(
    config: dict[str, Any], parts: list[ray.ObjectRef], cost_image: bytes, registry: Any, job_id: str | None
) -> Selected:
    """One position's bank and selection (``TiledHETMM.fit_position``, uncalibrated) from its rows of
    the frame batches (``parts``); ``cost_image``: the first frame, encoded (``sheets: auto``'s
    time budget is measured on it). Its stages go to the job (``job_id``) through ``registry``."""
    from ..detection.tiled import TiledHETMM

    use_assigned_cpus()
    report = None if job_id is None else JobReport(registry, job_id)
    det = TiledHETMM(DetectorConfig.from_dict(config), steps=_fanned_out_pts(), report=report)
    rows = _position_rows(parts)
    return det.fit_position(rows, cost_image, calibrate=False), _ran(rows)


@ray.remote(num_cpus=TASK_CPUS)
def update_position_task(
    config: dict[str, Any], base: TemplateSet, parts: list[ray.ObjectRef], images: list[bytes]
) -> Selected:
    """One position of a stored product grown by the new frames and selected again
    (``TiledHETMM.update_position``, uncalibrated; ``config``: the product's settings) from ``base``,
    the position's stored set (Ray passes the value of its ref), its rows of the frame batches
    (``parts``) and the encoded frames (only the first new one is read: ``sheets: auto``'s budget);
    None for the set when every frame was already held."""
    from ..detection.tiled import TiledHETMM

    use_assigned_cpus()
    det = TiledHETMM(DetectorConfig.from_dict(config), steps=_fanned_out_pts())
    rows = _position_rows(parts)
    return det.update_position(rows, images, base=base, calibrate=False), _ran(rows)


@ray.remote(num_cpus=TASK_CPUS)
def position_scores_task(
    config: dict[str, Any], position: int, selected: Selected, chunk: int, chunks: int
) -> OutOfFold | None:
    """Range ``chunk`` of ``chunks`` of ``position``'s out-of-fold folds scored
    (``TiledHETMM.position_scores``); ``selected``: its position task's result (Ray passes the value
    of the ref). None when that set is None."""
    from ..detection.tiled import TiledHETMM

    ts = selected[0]
    if ts is None:
        return None
    use_assigned_cpus()
    det = TiledHETMM(DetectorConfig.from_dict(config))
    folds = det.fold_count(ts)
    return det.position_scores(position, ts, range(folds * chunk // chunks, folds * (chunk + 1) // chunks))


def fold_chunks(positions: int, folds: int, slots: float) -> int:
    """How many ranges each position's ``folds`` folds are scored in, over ``slots`` task slots: the
    count ``c`` (1 to ``folds``) whose ``positions * c`` equal tasks end soonest,
    ``ceil(positions * c / slots) / c`` of a position's whole calibration; the fewest on ties."""
    return min(range(1, max(1, folds) + 1), key=lambda c: (math.ceil(positions * c / max(slots, 1.0)) / c, c))


@dataclass(frozen=True)
class PositionFits:
    """The tasks of a spread fit or hot update (module docstring): ``selected[p]``, position ``p``'s
    task; ``scores[p]``, the refs of its fold ranges, in fold order."""

    selected: list[ray.ObjectRef]
    scores: list[list[ray.ObjectRef]]

    def results(self) -> Results:
        """Every task's result, waited for (``ray.get``)."""
        return ray.get(self.selected), [ray.get(refs) for refs in self.scores]


def _started(config: DetectorConfig, selected: list[ray.ObjectRef], num_cpus: float) -> PositionFits:
    """:class:`PositionFits` of position tasks ``selected``, with their fold-range tasks started."""
    chunks = fold_chunks(len(selected), config.threshold.folds, task_slots(num_cpus))
    task = position_scores_task.options(num_cpus=num_cpus, scheduling_strategy="SPREAD")
    cfg = config.to_dict()
    scores = [[task.remote(cfg, p, ref, c, chunks) for c in range(chunks)] for p, ref in enumerate(selected)]
    return PositionFits(selected, scores)


def fit_tiles_ray(
    config: DetectorConfig,
    batches: TileBatches,
    cost_image: bytes,
    registry: Any = None,
    job_id: str | None = None,
    *,
    num_cpus: float = TASK_CPUS,
) -> PositionFits:
    """A tiled product's fit spread over the cluster (module docstring), every task of ``num_cpus``
    CPUs; :func:`tiles_fitted` joins the results."""
    task = fit_position_task.options(num_cpus=num_cpus, scheduling_strategy="SPREAD")
    cfg = config.to_dict()
    selected = [task.remote(cfg, parts, cost_image, registry, job_id) for parts in batches.positions]
    return _started(config, selected, num_cpus)


def update_tiles_ray(
    head: TemplateSet, batches: TileBatches, images: list[bytes], *, num_cpus: float = TASK_CPUS
) -> PositionFits:
    """A hot update of the stored version ``head`` spread over the cluster (module docstring), every
    task of ``num_cpus`` CPUs, each position's task given its own stored set alone
    (``tiled.position_sets``, put in the object store here); :func:`tiles_updated` joins the results."""
    from ..detection.tiled import position_sets

    task = update_position_task.options(num_cpus=num_cpus, scheduling_strategy="SPREAD")
    cfg = head.config.to_dict()
    bases = position_sets(head)
    if len(bases) != len(batches.positions):
        raise ValueError(f"{len(batches.positions)} positions of tile features; the product holds {len(bases)}")
    selected = [
        task.remote(cfg, ray.put(base), parts, images) for base, parts in zip(bases, batches.positions, strict=True)
    ]
    return _started(head.config, selected, num_cpus)


def _calibrated(det: TiledHETMM, selected: list[Selected], scores: list[list[OutOfFold | None]]) -> list[TemplateSet]:
    """Each position's selected set calibrated from its fold ranges (``TiledHETMM.calibrated_position``)."""
    out = []
    for p, ((ts, _), parts) in enumerate(zip(selected, scores, strict=True)):
        if ts is None or any(part is None for part in parts):
            raise RuntimeError(f"position {p} of a spread fit has no selected set")
        out.append(det.calibrated_position(p, ts, [part for part in parts if part is not None]))
    return out


def tiles_fitted(config: DetectorConfig, results: Results) -> TemplateSet:
    """The product's unsaved template set from :func:`fit_tiles_ray`'s results
    (``PositionFits.results``): what ``TiledHETMM(config).fit(frames)`` gives."""
    from ..detection.tiled import TiledHETMM

    selected, scores = results
    det = TiledHETMM(config)
    return det.with_positions(_calibrated(det, selected, scores), selected[0][1]["shapes"]).template_set()


def tiles_updated(head: TemplateSet, results: Results) -> tuple[TemplateSet | None, int]:
    """The hot update's unsaved template set from :func:`update_tiles_ray`'s results over ``head``
    (the version they grew), and how many frames it added; (None, 0) when every frame was already
    held."""
    from ..detection.tiled import TiledHETMM

    selected, scores = results
    held = [ts is None for ts, _ in selected]
    if any(held):
        if not all(held):
            raise RuntimeError("positions of one hot update disagree on the frames already held")
        return None, 0
    det = TiledHETMM.from_template_set(head)
    grown = det.with_positions(_calibrated(det, selected, scores), selected[0][1]["shapes"]).template_set()
    return grown, grown.n_images - head.n_images

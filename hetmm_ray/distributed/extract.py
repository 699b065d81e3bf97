"""Feature extraction of many images in parallel: image batches as Ray tasks (docs/design.md, "Hot update").

Creating a product or adding good images starts with the backbone over every
image. Each batch runs as one Ray task that decodes its images (encoded bytes
travel through the object store, not pixels), runs the frozen backbone and
returns the batch's features in the bank's storage dtype. A worker process
builds each distinct backbone once and keeps it, so later batches (and later
calls) on the same worker only pay for the forward pass.

The result equals :meth:`hetmm_ray.detection.detector.HETMM.extract` with ``bank=True``
in one process: the same decoding, the same digests, the same batches through
the same code, reassembled in input order.

A tiled product's frames go the same way (:func:`extract_tiles_ray`): frame batches as
tasks, each of whole backbone groups (``interface.frames_per_pass`` frames, as many groups per
task as :func:`frames_per_batch` gives; hetmm_ray/detection/tiled.py "Extraction apart from the
fit"), the task cutting its frames' tiles and extracting
every position (:meth:`~hetmm_ray.detection.tiled.TiledHETMM.extract_tiles`), placed with Ray's
SPREAD strategy so every node of a cluster takes batches. Their results stay in the
object store, a part per position (:class:`TileBatches`: each position's parts in input
order, the node each batch ran on), for the fit that reads each position's alone
(``position_fit.py``), so they never pass through the caller; gathered, they equal the
one-process extraction of every frame.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import ray
import torch

from ..config import FEATURE_TASKS_PER_SLOT, BackboneConfig, DetectorConfig
from ..core.device import TORCH_DTYPES, image_digest, resolve_device
from ..data.decode import ImageError, canvas_digest, decode_image, images_to_tensor
from ..detection.interface import Layout, frames_per_pass, positions_per_frame
from .runtime import task_slots, use_assigned_cpus

if TYPE_CHECKING:
    from ..core.backbone import Backbone
    from ..detection.tiled import TiledHETMM, TileFeatures

__all__ = ["TileBatches", "extract_features_ray", "extract_tiles_ray", "frames_per_batch"]

ImageItem = bytes | np.ndarray
"""Encoded image bytes, or a decoded RGB uint8 array (H, W, 3)."""


@functools.lru_cache(maxsize=4)
def _backbone(config: BackboneConfig, device: str) -> Backbone:
    # Keyed by the whole frozen config (name, weights, layers, image size, pre_relu, seed):
    # building a backbone costs seconds, a forward pass on a batch far less.
    from ..core.backbone import Backbone  # torchvision: only in processes that extract

    return Backbone(config).to(device)


def _decode(item: ImageItem, index: int) -> np.ndarray:
    if isinstance(item, np.ndarray):
        if item.dtype != np.uint8 or item.ndim != 3 or item.shape[2] != 3:
            raise ImageError(f"image {index}", f"arrays must be RGB uint8 (H, W, 3), got {item.dtype} {item.shape}")
        return item
    if isinstance(item, (bytes, bytearray, memoryview)):
        return decode_image(bytes(item), source=f"image {index}")
    raise ImageError(f"image {index}", f"expected encoded bytes or an RGB uint8 array, got {type(item).__name__}")


@ray.remote
def _extract_batch(
    config: DetectorConfig,
    start: int,
    items: list[ImageItem],
    use_gpu: bool,
    estimate_sheets: int | None = None,
    canvas_digests: bool = False,
) -> tuple[dict[str, np.ndarray], list[str], float | None, list[str] | None]:
    use_assigned_cpus()  # Ray sets OMP_NUM_THREADS=1 in workers: use the CPUs this task was given
    decoded = [_decode(x, start + i) for i, x in enumerate(items)]
    # A CPU-only task must not grab a GPU it was not given, whatever config.device says.
    device = resolve_device(config.device) if use_gpu else torch.device("cpu")
    size, geometry = config.backbone.image_size, config.backbone.geometry
    batch = images_to_tensor(decoded, size, geometry).to(device)
    backbone = _backbone(config.backbone, str(device))
    feats = backbone(batch)
    estimate = None if estimate_sheets is None else _estimate(config, device, backbone, decoded[0], estimate_sheets)
    if geometry != "squash":  # pad cells zeroed as in HETMM.features (core/geometry.py)
        from ..core.geometry import canvas_box, zero_padding

        feats = zero_padding(feats, [canvas_box(x.shape[0], x.shape[1], size, geometry) for x in decoded], size)
    dtype = TORCH_DTYPES[config.bank_dtype]
    out = {}
    for layer, v in feats.items():
        stored = v.to("cpu", dtype)
        # numpy has no bfloat16: hand out its values widened to float32 (exact).
        out[layer] = (stored.float() if dtype == torch.bfloat16 else stored).numpy()
    canvas = [canvas_digest(x, size, geometry) for x in decoded] if canvas_digests else None
    return out, [image_digest(x) for x in decoded], estimate, canvas


def _estimate(
    config: DetectorConfig, device: torch.device, backbone: Backbone, image: np.ndarray, sheets: int
) -> float:
    """``frame_cost.estimate_ms_per_frame`` of one image against ``sheets`` templates, with the backbone
    this task extracted with (no second build)."""
    from ..detection.frame_cost import estimate_ms_per_frame
    from ..detection.scorer import Scorer

    scorer = Scorer(config.replace(device=str(device)))
    scorer.backbone = backbone
    return estimate_ms_per_frame(scorer, [image], sheets)


def extract_features_ray(
    config: DetectorConfig,
    images: Sequence[bytes | np.ndarray],
    *,
    batch_size: int | None = None,
    num_cpus: float = 1,
    num_gpus: float = 0,
    progress: Callable[[int, int], None] | None = None,
    estimate_sheets: int | None = None,
    on_estimate: Callable[[float], None] | None = None,
    canvas_digests: list[str] | None = None,
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Backbone features of ``images`` with batches as Ray tasks, and the images' digests.

    ``images`` are encoded bytes (PNG/JPEG/BMP/TIFF, decoded inside the tasks) or
    decoded RGB ``uint8`` arrays ``(H, W, 3)``. Returns layer -> ``(N, C, h, w)``
    numpy in ``config.bank_dtype`` (``bfloat16`` comes back as ``float32``
    holding the bfloat16 values: numpy has no bfloat16) and the per-image
    digests, in input order: the same as ``HETMM(config).extract(images,
    bank=True)`` with the same batch size. ``batch_size`` defaults to
    ``config.batch_size``; each task gets ``num_cpus`` CPUs (its torch
    threads) and ``num_gpus`` GPUs (``> 0`` runs it on ``config.device``).
    ``progress(done_images, total_images)`` is called as batches finish.
    With ``estimate_sheets`` (and ``on_estimate``), the first batch's task also measures
    ``frame_cost.estimate_ms_per_frame`` of its first image against that many templates with the
    backbone it extracted with, and ``on_estimate(ms)`` is called when that batch is back (a
    create job's cost without a backbone built for it alone).

    Raises :class:`~hetmm_ray.data.decode.ImageError` naming a failed image by
    its index (``"image 3: ..."``; batches run in parallel, so with several bad
    images it is the first batch to fail). Connects to Ray if not yet connected.
    """
    if len(images) == 0:
        raise ValueError("no images given")
    bs = batch_size or config.batch_size
    if bs < 1:
        raise ValueError(f"batch_size must be >= 1, got {bs}")
    if not ray.is_initialized():
        from .runtime import connect

        connect()
    total = len(images)
    task = _extract_batch.options(num_cpus=num_cpus, num_gpus=num_gpus)
    asked = estimate_sheets if on_estimate is not None else None
    starts = {
        task.remote(
            config, s, list(images[s : s + bs]), num_gpus > 0, asked if s == 0 else None, canvas_digests is not None
        ): s
        for s in range(0, total, bs)
    }
    layers: dict[str, np.ndarray] = {}
    digests: list[str] = [""] * total
    canvas: list[str] = [""] * total
    pending, done = list(starts), 0
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                feats, ds, estimate, cs = _get(ref)
                s = starts[ref]
                if estimate is not None and on_estimate is not None:
                    on_estimate(estimate)
                for layer, v in feats.items():
                    if layer not in layers:  # the first batch back tells the shapes; fill in place
                        layers[layer] = np.empty((total, *v.shape[1:]), dtype=v.dtype)
                    layers[layer][s : s + len(ds)] = v
                digests[s : s + len(ds)] = ds
                if cs is not None:
                    canvas[s : s + len(cs)] = cs
                done += len(ds)
                if progress is not None:
                    progress(done, total)
    except BaseException:
        for ref in pending:  # no point finishing the rest of a failed extraction
            ray.cancel(ref)
        raise
    if canvas_digests is not None:
        canvas_digests[:] = canvas
    return layers, digests


def _get(ref: ray.ObjectRef) -> Any:
    """``ray.get``, with the task's own error (an :class:`ImageError` names its image) raised as is."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, ImageError):
            raise exc.cause from None
        raise


# --- a tiled product's frames ------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def _tiled(config_json: str) -> TiledHETMM:
    # One detector per product configuration in a worker, keyed by its JSON (a region makes the
    # configuration unhashable): its backbone is built on the first batch and kept for the next.
    from ..detection.tiled import TiledHETMM  # torchvision: only in processes that extract

    return TiledHETMM(DetectorConfig.from_dict(json.loads(config_json)))


@ray.remote
def _extract_tiles_batch(
    config: DetectorConfig,
    start: int,
    items: list[ImageItem],
    use_gpu: bool,
    estimate: tuple[int, int, int] | None = None,
) -> tuple[Any, ...]:
    """One frame batch's :class:`~hetmm_ray.detection.tiled.TileFeatures`, a part per position
    (``TileFeatures.of_position``; the returns after the first, left in the object store), and what
    the caller reads at once (the first return): the node it ran on, its frames and, with
    ``estimate`` (frames trained on, largest height, largest width), the estimated ms per frame of
    its first frame against the sheets such a fit keeps and the layout of a frame of that size."""
    use_assigned_cpus()
    # A CPU-only task must not grab a GPU it was not given, whatever config.device says.
    device = config.device if use_gpu else "cpu"
    det = _tiled(json.dumps(config.replace(device=device).to_dict(), sort_keys=True))
    decoded = [_decode(x, start + i) for i, x in enumerate(items)]
    extracted = det.extract_tiles(decoded)
    info: dict[str, Any] = {"node": ray.get_runtime_context().get_node_id(), "frames": len(decoded)}
    if estimate is not None:
        from ..detection.detector_choice import ms_per_frame_of

        n_train, height, width = estimate
        info["ms"] = ms_per_frame_of(det, decoded[0], n_train)
        info["layout"] = det.layout(height, width)
    return (info, *(extracted.of_position(p, det.n_positions) for p in range(det.n_positions)))


@dataclass(frozen=True)
class TileBatches:
    """A tiled extraction's batches once every task has finished: ``positions[p]``, each batch's rows
    of position ``p`` (:meth:`~hetmm_ray.detection.tiled.TileFeatures.of_position`) in the object
    store, in input order, so a task fitting one position reads that position's alone; ``nodes``, the
    node id each batch ran on (``ray.get_runtime_context().get_node_id()``), in the same order."""

    positions: list[list[ray.ObjectRef]]
    nodes: list[str]

    def gathered(self) -> TileFeatures:
        """Every batch fetched and joined in input order, every position's rows of each frame
        (``TileFeatures.interleaved`` of ``TileFeatures.gathered``)."""
        from ..detection.tiled import TileFeatures

        return TileFeatures.interleaved([TileFeatures.gathered(ray.get(refs)) for refs in self.positions])


def frames_per_batch(frames: int, group: int, num_cpus: float) -> int:
    """Frames per feature task of a tiled extraction of ``frames`` frames: whole backbone groups
    (``group`` frames each), as many as leave about ``FEATURE_TASKS_PER_SLOT`` tasks per task slot
    of the connected cluster (its CPUs over ``num_cpus``), at least one group."""
    return group * max(1, int(frames // (group * FEATURE_TASKS_PER_SLOT * task_slots(num_cpus))))


def extract_tiles_ray(
    config: DetectorConfig,
    images: Sequence[bytes | np.ndarray],
    *,
    frames_per_task: int | None = None,
    num_cpus: float = 1,
    num_gpus: float = 0,
    progress: Callable[[int, int], None] | None = None,
    estimate_for: tuple[int, int] | None = None,
    on_estimate: Callable[[float, Layout], None] | None = None,
) -> TileBatches:
    """Every position's bank features of a tiled product's frames (``config``: its resolved
    configuration) as frame-batch Ray tasks (module docstring), waited for; returns their
    :class:`TileBatches`, whose :meth:`~TileBatches.gathered` equals
    ``TiledHETMM(config).extract_tiles(images)`` in one process (same decoding, digests, groups and
    code; the features in ``bank_dtype``, ``bfloat16`` as float32).

    ``images``: encoded bytes (decoded inside the tasks: bytes travel, not pixels) or RGB ``uint8``
    arrays. ``frames_per_task``: frames per task, a multiple of ``interface.frames_per_pass``, else a
    ValueError before any task (the default: :func:`frames_per_batch`). Each task gets ``num_cpus``
    CPUs (its torch threads) and ``num_gpus`` GPUs (``> 0`` runs it on ``config.device``), placed with
    the SPREAD strategy. ``progress(done_frames, total_frames)`` is called as batches finish. With
    ``on_estimate`` and ``estimate_for`` (the largest frame's height and width), the first batch's
    task also measures the milliseconds per frame of its first frame for a fit on all ``images``
    (``detector_choice.ms_per_frame_of``) and that size's ``Detector.layout``, and
    ``on_estimate(ms, layout)`` is called when that batch is back.

    Raises :class:`~hetmm_ray.data.decode.ImageError` naming a failed image by its index, as
    :func:`extract_features_ray` does; the tasks still running are cancelled. Connects to Ray if
    not yet connected."""
    if len(images) == 0:
        raise ValueError("no images given")
    group = frames_per_pass(config)
    if frames_per_task is not None and (frames_per_task < 1 or frames_per_task % group):
        raise ValueError(
            f"frames_per_task must be a positive multiple of {group} (frames per backbone pass), got {frames_per_task}"
        )
    if not ray.is_initialized():
        from .runtime import connect

        connect()
    total = len(images)
    bs = frames_per_task or frames_per_batch(total, group, num_cpus)
    positions = positions_per_frame(config)
    task = _extract_tiles_batch.options(
        num_cpus=num_cpus, num_gpus=num_gpus, scheduling_strategy="SPREAD", num_returns=1 + positions
    )
    asked = None if on_estimate is None or estimate_for is None else (total, *estimate_for)
    infos: dict[ray.ObjectRef, int] = {}
    refs: list[list[ray.ObjectRef]] = [[] for _ in range(positions)]
    for s in range(0, total, bs):
        info, *parts = task.remote(config, s, list(images[s : s + bs]), num_gpus > 0, asked if s == 0 else None)
        infos[info] = s
        for p, part in enumerate(parts):
            refs[p].append(part)
    nodes: dict[int, str] = {}
    pending, done = list(infos), 0
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                got = _get(ref)
                nodes[infos[ref]] = got["node"]
                if "ms" in got and on_estimate is not None:
                    on_estimate(got["ms"], got["layout"])
                done += got["frames"]
                if progress is not None:
                    progress(done, total)
    except BaseException:
        for ref in pending:  # no point finishing the rest of a failed extraction
            ray.cancel(ref)
        raise
    return TileBatches(refs, [nodes[s] for s in sorted(nodes)])

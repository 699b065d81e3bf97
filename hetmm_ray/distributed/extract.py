"""Feature extraction of many images in parallel: image batches as Ray tasks (docs/design.md, "Hot update").

Creating a product or adding good images starts with the backbone over every
image. Each batch runs as one Ray task that decodes its images (encoded bytes
travel through the object store, not pixels), runs the frozen backbone and
returns the batch's features in the bank's storage dtype. A worker process
builds each distinct backbone once and keeps it, so later batches (and later
calls) on the same worker only pay for the forward pass.

The result equals :meth:`hetmm_ray.detector.HETMM.extract` with ``bank=True``
in one process: the same decoding, the same digests, the same batches through
the same code, reassembled in input order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import ray
import torch

from ..config import BackboneConfig, DetectorConfig
from ..core.device import TORCH_DTYPES, image_digest, resolve_device
from ..data.decode import ImageError, canvas_digest, decode_image, images_to_tensor
from .runtime import use_assigned_cpus

if TYPE_CHECKING:
    from ..core.backbone import Backbone

__all__ = ["extract_features_ray"]

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
    from ..frame_cost import estimate_ms_per_frame
    from ..scorer import Scorer

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


def _get(ref: ray.ObjectRef) -> tuple[dict[str, np.ndarray], list[str], float | None, list[str] | None]:
    """``ray.get``, with the task's own error (an :class:`ImageError` names its image) raised as is."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, ImageError):
            raise exc.cause from None
        raise

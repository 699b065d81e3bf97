"""Settings of this run and this machine: how fast a product is computed, never what it is.

Exact semantics: nothing here is stored with a product. The run-time fields of
:class:`~hetmm_ray.config.DetectorConfig` (``device``, ``dtype``, batch and memory settings,
``backbone_runtime``, ``score_workers``) are declared there with ``run_time=True``; this module
holds the choices they validate against and the machine-wide constants of a run: where
machine-local caches live, and the CPU share and PTS chunk of the Ray tasks a run starts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = [
    "BACKBONE_RUNTIMES",
    "MODEL_CACHE_ENV",
    "PTS_CHUNK_PIXELS",
    "REPORT_GALLERY_NEAR",
    "REPORT_THUMBNAIL_PX",
    "STREAM_FRAMES",
    "TASK_CPUS",
    "is_device",
    "model_cache_dir",
]

BACKBONE_RUNTIMES = ("auto", "torch", "openvino")  # see DetectorConfig.backbone_runtime

STREAM_FRAMES = 8
"""Frames ``hetmm predict`` and ``evaluate`` decode, score and reduce at a time (rounded to a multiple of
what predict batches, ``detection.interface.frames_per_pass``): their memory holds this many frames and maps, not
the whole set (the memory model is in docs/operations.md, "Memory")."""


# --- hetmm evaluate --report ------------------------------------------------------
REPORT_GALLERY_NEAR = 8
"""Good frames passed with the highest scores, and defects caught with the lowest, the gallery
shows beside the errors (every false alarm and every missed defect): the frames closest to the
threshold on the right side of it."""
REPORT_THUMBNAIL_PX = 320
"""Size of the report gallery's pictures (the frame and its overlay): the area of a square of this
side, the aspect kept, the long side at most twice this (``report.collect.thumbnail``)."""


def is_device(value: Any) -> bool:
    """``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps`` (the device a run computes on)."""
    return isinstance(value, str) and (value == "auto" or value.split(":")[0] in ("cpu", "cuda", "mps"))


# --- machine-local caches --------------------------------------------------------
MODEL_CACHE_ENV = "HETMM_CACHE_DIR"
"""Environment variable naming the folder of machine-local caches (converted backbone models);
default ``~/.cache/hetmm``. Safe to delete: everything in it is rebuilt on demand."""


def model_cache_dir() -> Path:
    """The folder of machine-local caches (see :data:`MODEL_CACHE_ENV`)."""

    return Path(os.environ.get(MODEL_CACHE_ENV) or Path.home() / ".cache" / "hetmm")


# --- Ray placement -------------------------------------------------------------
TASK_CPUS = 0.5
"""CPUs a service-side Ray task reserves (PTS chunk, feature batch, calibration). Fractional so
that tasks still fit beside the resident actors (ingress, detector replicas, registry, shards)
on a small node; each task runs max(1, round(cpus)) torch threads."""
FEATURE_TASKS_PER_SLOT = 4
"""Frame-batch feature tasks a tiled extraction aims at per task slot of the cluster (its CPUs over
a task's): frames go in as few batches as keep about this many per slot, so each task's fixed
cost (scheduling, its result objects) is paid less often while the slots stay evenly loaded to
the end, and the job's frame count still moves several times per slot."""
PTS_CHUNK_PIXELS = 512
"""Pixels per PTS task when PTS fans out over Ray (``distributed/pts_fanout.py``): the CLI's
``--address`` runs and the shards' hot-update selection alike. Each task is a few hundred ms of
OPTICS at N=200 images, long enough to amortise Ray's scheduling."""

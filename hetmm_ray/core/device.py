"""Devices, compute dtypes and image digests: the small helpers every process shares.

``resolve_device("auto")`` is CUDA when one is visible, else the CPU; any other name is
passed to :class:`torch.device`. :data:`TORCH_DTYPES` maps ``config.DTYPES`` (the names a
configuration may use) to torch dtypes. :func:`image_digest` is a decoded image's identity in
a bank (the first 32 hex digits of the sha256 of its RGB bytes): the single-process detector
and the Ray feature tasks both call it, so their digests cannot drift apart.

:func:`compute_threads` is THE thread-count rule: torch intra-op threads for a number of CPUs
(a Ray task's or replica's assigned CPUs, ``distributed.runtime.use_assigned_cpus``), or for
the cores this process may run on (:func:`usable_cores`) when none is given. At least 1; a
fraction rounds up (half a CPU still needs a thread, and with passive waiting a thread that
finds its core taken sleeps instead of spinning).
"""

from __future__ import annotations

import hashlib
import math
import os

import numpy as np
import torch

from ..config import DTYPES

__all__ = ["TORCH_DTYPES", "compute_threads", "image_digest", "resolve_device", "usable_cores"]

TORCH_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
assert tuple(TORCH_DTYPES) == DTYPES  # one list of names (hetmm_ray.config), one mapping (here)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def image_digest(image: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest()[:32]


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; every core where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def compute_threads(cpus: float | None = None) -> int:
    """Torch intra-op threads for ``cpus`` CPUs (None: :func:`usable_cores`): ``max(1, ceil(cpus))``."""
    if cpus is None:
        cpus = usable_cores()
    return max(1, math.ceil(cpus))

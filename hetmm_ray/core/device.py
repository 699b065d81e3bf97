"""Devices, compute dtypes and image digests: the small helpers every process shares.

``resolve_device("auto")`` is CUDA when one is visible, else the CPU; any other name is
passed to :class:`torch.device`. :data:`TORCH_DTYPES` maps ``config.DTYPES`` (the names a
configuration may use) to torch dtypes. :func:`image_digest` is a decoded image's identity in
a bank (the first 32 hex digits of the sha256 of its RGB bytes): the single-process detector
and the Ray feature tasks both call it, so their digests cannot drift apart.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from ..config import DTYPES

__all__ = ["TORCH_DTYPES", "image_digest", "resolve_device"]

TORCH_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
assert tuple(TORCH_DTYPES) == DTYPES  # one list of names (config.py), one mapping (here)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def image_digest(image: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest()[:32]

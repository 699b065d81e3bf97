"""PTS fanned out over a Ray cluster: pixel chunks as tasks (docs/design.md, "PTS in parallel").

Pixels are independent (docs/algorithm.md §4), so a bank's H*W pixels are cut into
chunks and each chunk runs :func:`hetmm_ray.core.pts.pts_indices` as a Ray task
on whichever node has a free CPU (or GPU). The bank goes into the object store
once, as a numpy array that workers map without copying. The result is
bit-identical to the single-process call: the same code on the same pixels.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import ray
import torch
from torch import Tensor

from ..config import PTS_CHUNK_PIXELS
from ..core.pts import pts_indices
from .runtime import as_completed, use_assigned_cpus

__all__ = ["pts_indices_ray"]

DEFAULT_CHUNK_PIXELS = PTS_CHUNK_PIXELS  # the one default lives in hetmm_ray.config


@ray.remote
def _pts_chunk(bank: np.ndarray, p0: int, p1: int, k: int, init: str, seed: int) -> np.ndarray:
    use_assigned_cpus()  # Ray sets OMP_NUM_THREADS=1 in workers: use the CPUs this task was given
    n, c = bank.shape[:2]
    # The shared bank is read-only; copy just this chunk's pixels: (N, C, P, 1).
    pixels = torch.from_numpy(np.array(bank.reshape(n, c, -1)[:, :, p0:p1]))[..., None]
    if ray.get_gpu_ids() and torch.cuda.is_available():  # a task given a GPU computes there
        pixels = pixels.cuda()
    return pts_indices(pixels, k, init, seed=seed)[:, :, 0].cpu().numpy()


def pts_indices_ray(
    bank: Tensor,
    k: int,
    init: str = "optics",
    *,
    seed: int = 0,
    chunk_pixels: int = DEFAULT_CHUNK_PIXELS,
    num_cpus: float = 1,
    num_gpus: float = 0,
    progress: Callable[[int, int], None] | None = None,
) -> Tensor:
    """:func:`~hetmm_ray.core.pts.pts_indices` with pixel chunks as Ray tasks.

    Needs a connected Ray (``ray.init()``). Returns (min(k, N), H, W) int64 on the CPU.
    ``progress(done_pixels, total_pixels)`` is called as chunks finish.
    """
    n, _, h, w = bank.shape
    total = h * w
    if k >= n or chunk_pixels >= total:
        whole = pts_indices(bank.cpu(), k, init, seed=seed)
        if progress is not None:
            progress(total, total)
        return whole
    ref = ray.put(np.ascontiguousarray(bank.detach().cpu().numpy()))
    task = _pts_chunk.options(num_cpus=num_cpus, num_gpus=num_gpus)
    ranges = {
        task.remote(ref, p0, min(total, p0 + chunk_pixels), k, init, seed): p0 for p0 in range(0, total, chunk_pixels)
    }
    out = np.empty((min(k, n), total), dtype=np.int64)
    done = 0
    for r in as_completed(ranges):
        chunk = ray.get(r)
        p0 = ranges[r]
        out[:, p0 : p0 + chunk.shape[1]] = chunk
        done += chunk.shape[1]
        if progress is not None:
            progress(done, total)
    return torch.from_numpy(out).view(-1, h, w)

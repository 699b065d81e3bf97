"""PTS through Ray tasks equals the single-process result exactly (a real local Ray)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hetmm_ray.core.pts import pts_indices
from hetmm_ray.distributed import pts_indices_ray

pytestmark = pytest.mark.usefixtures("local_ray")


def clustered_bank(n: int, c: int, h: int, w: int, seed: int) -> torch.Tensor:
    """Unit vectors around a few centres per pixel, so OPTICS finds real clusters."""
    g = torch.Generator().manual_seed(seed)
    centres = F.normalize(torch.randn(4, c, h, w, generator=g), dim=1)
    pick = torch.randint(0, 4, (n,), generator=g)
    return F.normalize(centres[pick] + 0.3 * torch.randn(n, c, h, w, generator=g), dim=1)


@pytest.mark.parametrize(("init", "k", "chunk"), [("optics", 4, 7), ("optics", 1, 5), ("kmeans", 3, 9)])
def test_ray_fanout_equals_single_process(init: str, k: int, chunk: int) -> None:
    bank = clustered_bank(20, 8, 5, 7, seed=k)
    seen: list[tuple[int, int]] = []
    got = pts_indices_ray(bank, k, init, seed=3, chunk_pixels=chunk, progress=lambda d, t: seen.append((d, t)))
    assert torch.equal(got, pts_indices(bank, k, init, seed=3))
    assert seen[-1] == (35, 35) and len(seen) == -(-35 // chunk)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_whole_bank_and_fp16_banks() -> None:
    bank = clustered_bank(6, 4, 3, 3, seed=1)
    assert torch.equal(pts_indices_ray(bank, 9, chunk_pixels=2), pts_indices(bank, 9))
    half = clustered_bank(15, 6, 4, 4, seed=2).half()
    assert torch.equal(pts_indices_ray(half, 5, chunk_pixels=3), pts_indices(half, 5))

"""PTS through Ray tasks, and a calibration's fold selections as one task per fold, equal the
single-process results exactly (a real local Ray)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import small_pts_config

from hetmm_ray.config import TemplateConfig
from hetmm_ray.core.pts import pts_indices, select_layers
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.fit_steps import FitSteps
from hetmm_ray.distributed import pts_indices_ray
from hetmm_ray.distributed.ray_steps import select_folds_ray

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


@pytest.mark.parametrize("kind", ["pts_o", "pr", "ir"])
def test_fold_selections_as_tasks_equal_the_in_process_ones(kind: str) -> None:
    """``select_folds_ray``: every fold's selection from its kept rows alone, as its own task;
    the same indices a selection of the kept rows makes here, in fold order, any bank dtype."""
    bank = {"a": clustered_bank(12, 8, 4, 5, seed=5).half(), "b": clustered_bank(12, 6, 2, 3, seed=6).bfloat16()}
    kept = [[i for i in range(12) if i % 3 != f] for f in range(3)]
    seen: list[tuple[int, int]] = []
    got = select_folds_ray(
        bank, TemplateConfig(kind=kind, sheets=4, seed=2), kept, progress=lambda d, t: seen.append((d, t))
    )
    assert len(got) == 3 and seen == [(1, 3), (2, 3), (3, 3)]
    for rows, (indices, centres) in zip(kept, got, strict=True):
        want, want_centres = select_layers({k: v[rows] for k, v in bank.items()}, kind, 4, 2)
        assert indices is not None and want is not None and indices.keys() == want.keys() == bank.keys()
        for layer in bank:
            assert torch.equal(indices[layer], want[layer])
            assert int(indices[layer].max()) < len(rows)  # into the fold's kept bank
        assert centres is None and want_centres is None


def test_a_compressed_products_calibration_with_fold_tasks_is_the_in_process_one() -> None:
    """The out-of-fold scores of a PTS product are the same whether its ten (here three) fold
    selections run one after another in this process or as parallel tasks."""
    cfg = small_pts_config(max_images=9, folds=3)
    product = SyntheticProduct(seed=0, size=64)
    here = HETMM(cfg).fit([product.good(i) for i in range(9)])
    on_tasks = HETMM(cfg, steps=FitSteps(select_folds=select_folds_ray))
    oof_tasks = on_tasks.pipeline.out_of_fold(here.templates)
    oof_here = here.pipeline.out_of_fold(here.templates)
    assert oof_tasks.folds == 3 and len(oof_tasks.scores) == 9
    assert oof_tasks.by_image() == oof_here.by_image()
    assert here.templates.calibration is not None
    assert sorted(oof_here.scores) == sorted(here.templates.calibration.scores)

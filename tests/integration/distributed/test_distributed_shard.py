"""TemplateShard actors on a real local Ray: selection, append, tiny sets by object reference."""

from __future__ import annotations

import numpy as np
import pytest
import ray
import torch
import torch.nn.functional as F
from reference_impls import select

from hetmm_ray.core.pts import pts_indices, select_templates
from hetmm_ray.distributed.shard import ShardPlacement, TemplateShard, shard_options

pytestmark = pytest.mark.usefixtures("local_ray")


def bank(n: int, seed: int, c: int = 6, h: int = 4, w: int = 5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    centres = F.normalize(torch.randn(3, c, h, w, generator=g), dim=1)
    pick = torch.randint(0, 3, (n,), generator=g)
    return F.normalize(centres[pick] + 0.3 * torch.randn(n, c, h, w, generator=g), dim=1).half()


def test_shard_selects_exactly_like_the_single_process_code() -> None:
    b = bank(16, seed=0)
    opts = shard_options(ShardPlacement(), product="gear", layer="layer1")
    assert opts["num_gpus"] == 0 and opts["name"] == "hetmm-shard:gear:layer1"  # no GPUs in this cluster
    shard = TemplateShard.options(**opts).remote("gear", "layer1", b.numpy())
    assert ray.get(shard.info.remote())["sheets"] == 16  # ALL until a selection runs
    assert ray.get(shard.select.remote("pts_o", 4, chunk_pixels=6)) == 4
    sel = ray.get(shard.selection.remote())
    assert np.array_equal(sel["indices"], pts_indices(b, 4).numpy())
    tiny_ref = shard.tiny.remote()  # an object reference a replica can fetch
    assert torch.equal(torch.tensor(ray.get(tiny_ref)), select_templates(b, pts_indices(b, 4)))
    ray.kill(shard)


def test_append_then_reselect_uses_the_grown_bank() -> None:
    b, more = bank(10, seed=1), bank(5, seed=2)
    shard = TemplateShard.remote("gear", "layer2", b.numpy())
    ray.get(shard.select.remote("pts_o", 3))
    assert ray.get(shard.append.remote(more.numpy())) == 15
    assert ray.get(shard.selection.remote()) == {"indices": None, "centres": None}
    ray.get(shard.select.remote("pts_o", 3))
    grown = torch.cat([b, more])
    assert np.array_equal(ray.get(shard.selection.remote())["indices"], pts_indices(grown, 3).numpy())
    with pytest.raises(ray.exceptions.RayTaskError, match="do not fit"):
        ray.get(shard.append.remote(np.zeros((1, 2, 4, 5), dtype=np.float16)))
    ray.kill(shard)


@pytest.mark.parametrize("kind", ["ir", "pr", "pc_k"])
def test_baseline_selections_match(kind: str) -> None:
    b = bank(9, seed=3)
    shard = TemplateShard.remote("gear", "layer3", b.numpy())
    ray.get(shard.select.remote(kind, 4, seed=5))
    expected = select(kind, b, 4, 5).templates
    assert torch.equal(torch.tensor(ray.get(shard.tiny.remote())), expected)
    ray.kill(shard)


def test_adopt_appends_in_place_and_takes_a_selection_made_elsewhere() -> None:
    """A tiled hot update (registry._adopted_in_place): the new rows appended, the task's selection
    taken as is, so the tiny set is the grown bank's selection, as a reload from the store gives."""
    old, new = bank(10, seed=1), bank(3, seed=2)
    grown = torch.cat([old, new])
    indices = pts_indices(grown.float(), 4)
    shard = TemplateShard.remote("gear", "tile0/layer1", old.numpy())
    assert ray.get(shard.adopt.remote(new.numpy(), indices.numpy(), None)) == 13
    assert torch.equal(torch.from_numpy(ray.get(shard.tiny.remote())), select_templates(grown, indices))
    assert ray.get(shard.info.remote())["images"] == 13

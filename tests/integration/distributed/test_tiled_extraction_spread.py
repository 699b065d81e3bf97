"""A tiled product's create spreads over a real 2-node Ray cluster started in this process
(``ray.cluster_utils.Cluster``, 1 CPU per node): the frame-batch tasks of
``extract.extract_tiles_ray`` (what a tiled create and hot update run first) each report the node
they ran on, both nodes ran some, and the gathered features equal the one-process extraction bit
for bit; then the position fit tasks (``position_fit.fit_tiles_ray``) ran on both nodes too, and
their join is the product the one-process fit makes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import ray
import torch
from helpers import png

from hetmm_ray.config import TASK_CPUS, BackboneConfig, DetectorConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.interface import frames_per_pass
from hetmm_ray.detection.tiled import TiledHETMM
from hetmm_ray.distributed import connect, shutdown_ray
from hetmm_ray.distributed.extract import extract_tiles_ray
from hetmm_ray.distributed.position_fit import fit_tiles_ray, tiles_fitted

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FRAME = 80
FRAMES = 8
CONFIG = DetectorConfig(
    backbone=BackboneConfig(name="resnet18", weights="random", image_size=40),
    batch_size=4,  # 4 tiles: 1 frame per backbone pass, so 8 frames are 8 feature tasks
    device="cpu",
).replace(**{"geometry.tiles": [2, 2], "geometry.tile_overlap": 8, "geometry.tile_whole_view": False})


@pytest.fixture(scope="module")
def cluster(own_ray) -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    connect(c.address)  # the same entry point the CLI uses for --address
    yield c
    shutdown_ray()
    c.shutdown()


def test_the_frame_batch_tasks_ran_on_both_nodes_and_equal_one_process(cluster) -> None:
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 2
    part = SyntheticProduct(seed=8, size=FRAME)
    frames = [part.good(i) for i in range(FRAMES)]
    calls: list[tuple[int, int]] = []
    batches = extract_tiles_ray(
        CONFIG, [png(f) for f in frames], num_cpus=TASK_CPUS, progress=lambda d, t: calls.append((d, t))
    )
    assert frames_per_pass(CONFIG) == 1 and len(batches.nodes) == FRAMES
    per_node = Counter(batches.nodes)
    assert set(per_node) == nodes, per_node  # every node extracted some of the frames
    assert calls[-1] == (FRAMES, FRAMES) and len(calls) == FRAMES  # one count per finished batch
    got = batches.gathered()
    want = TiledHETMM(CONFIG).extract_tiles(frames)
    assert got.digests == want.digests and got.shapes == want.shapes and got.boxes == want.boxes
    assert list(got.feats) == list(want.feats)
    for layer, v in want.feats.items():
        assert got.feats[layer].shape == v.shape and got.feats[layer].shape[0] == FRAMES * 4
        assert np.array_equal(got.feats[layer], v), layer


def test_the_position_fit_tasks_ran_on_both_nodes_and_fit_the_one_process_product(cluster) -> None:
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    part = SyntheticProduct(seed=9, size=FRAME)
    frames = [part.good(i) for i in range(FRAMES)]
    images = [png(f) for f in frames]
    batches = extract_tiles_ray(CONFIG, images, num_cpus=1)
    assert len(batches.positions) == 4  # 2 x 2 tiles, no whole view: a fit task each
    results = fit_tiles_ray(CONFIG, batches, images[0], num_cpus=1).results()
    ran = Counter(info["node"] for _, info in results[0])
    assert set(ran) == nodes, ran  # the positions were fit on both nodes
    got = tiles_fitted(CONFIG, results)
    want = TiledHETMM(CONFIG).fit(frames).template_set()
    assert got.image_digests == want.image_digests and got.calibration == want.calibration
    assert got.meta["tiles"]["scales"] == want.meta["tiles"]["scales"]
    assert got.meta["tiles"]["frame"] == want.meta["tiles"]["frame"] == [FRAME, FRAME]
    assert set(got.bank) == set(want.bank)
    for key, bank in want.bank.items():
        assert torch.equal(got.bank[key], bank) and torch.equal(got.templates(key), want.templates(key)), key

"""Template shards on a real 3-node Ray cluster started in this process (``ray.cluster_utils.Cluster``).

Each node is its own raylet with ``gpu_standin`` units standing in for GPUs and
a ``node<i>`` marker. Shards of 3 products x 3 layers are placed with the
registry's options (``shard_options``: ``ShardPlacement(resources={"gpu_standin":
...})``, SPREAD, restarts without limit); each loads its layer from the store;
then a shard actor is killed and a whole node is removed, and every shard must
come back (on a surviving node) from the store with its tiny set bit for bit.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import ray

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.distributed import ShardPlacement, TemplateShard, connect, shard_options, shutdown_ray
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PRODUCTS = ("gear-a", "gear-b", "gear-c")
NODES = 3
STANDINS_PER_NODE = 4  # "GPUs" per node
SHARD_STANDINS = 0.5  # per shard, like ShardPlacement.num_gpus: room for 8 per node, so a lost node's shards fit
PLACEMENT = ShardPlacement(num_cpus=0.01, resources={"gpu_standin": SHARD_STANDINS})
LAYERS = ("layer1", "layer2", "layer3")
# Notice a killed node within ~1 s instead of Ray's default ~30 s of missed health checks.
FAST_FAILURE_DETECTION = {"health_check_period_ms": 300, "health_check_failure_threshold": 3}


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Three small products fitted in this process and published to a local store."""
    uri = str(tmp_path_factory.mktemp("cluster") / "store")
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=64),
        templates=TemplateConfig(kind="pts_o", sheets=3),
        threshold=ThresholdConfig(max_images=4, folds=2),
        batch_size=6,
    )
    for seed, product in enumerate(PRODUCTS):
        gear = SyntheticProduct(seed=seed, size=64)
        HETMM(config).fit([gear.good(i) for i in range(6)]).save(open_store(uri), product)
    return uri


@pytest.fixture(scope="module")
def cluster(own_ray) -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    c = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": {"node0": 1, "gpu_standin": STANDINS_PER_NODE},
            "include_dashboard": False,
            "_system_config": FAST_FAILURE_DETECTION,
        },
    )
    for i in range(1, NODES):
        c.add_node(num_cpus=1, resources={f"node{i}": 1, "gpu_standin": STANDINS_PER_NODE})
    c.wait_for_nodes()
    connect(c.address)  # the same entry point the CLI uses for --address
    yield c
    shutdown_ray()
    c.shutdown()


@pytest.fixture(scope="module")
def service(cluster, store_uri: str) -> dict[str, Any]:
    """9 shards placed as the registry places them, with each one's published tiny set and selection."""
    shards = {
        (p, layer): TemplateShard.options(**shard_options(PLACEMENT, product=p, layer=layer)).remote(
            p, layer, store_uri
        )
        for p in PRODUCTS
        for layer in LAYERS
    }
    return {
        "shards": shards,
        "tiny": {key: ray.get(s.tiny.remote()) for key, s in shards.items()},
        "indices": {key: ray.get(s.selection.remote())["indices"] for key, s in shards.items()},
    }


def alive_nodes() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


def node_of(shard: Any) -> str:
    return ray.get(shard.info.remote())["node"]


def back_from_the_store(shard: Any, old_pid: int, timeout: float = 60.0) -> dict[str, Any]:
    """The info of the shard's next incarnation (Ray restarts it; its constructor reads the store)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            info = ray.get(shard.info.remote(), timeout=10)
            if info["pid"] != old_pid:
                return info
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass  # dead or restarting
        time.sleep(0.2)
    raise AssertionError("the shard did not come back")


def assert_same_templates(service: dict[str, Any], key: tuple[str, str]) -> None:
    shard = service["shards"][key]
    assert np.array_equal(ray.get(shard.tiny.remote()), service["tiny"][key]), key
    assert np.array_equal(ray.get(shard.selection.remote())["indices"], service["indices"][key]), key


def test_shards_spread_evenly_over_the_nodes_that_have_the_resource(service) -> None:
    shards = service["shards"]
    assert len(shards) == len(PRODUCTS) * 3
    per_node = Counter(node_of(s) for s in shards.values())
    assert set(per_node) == alive_nodes()  # every node holds shards
    # SPREAD walks the feasible nodes round-robin; every node has room for all 9 here, so
    # the spread is exact: 9 shards / 3 nodes. (Resources are the hard limit, SPREAD the preference.)
    assert sorted(per_node.values()) == [3, 3, 3]
    used = ray.cluster_resources()["gpu_standin"] - ray.available_resources().get("gpu_standin", 0)
    assert used == pytest.approx(len(shards) * SHARD_STANDINS)  # each shard holds its configured fraction
    for (product, layer), s in shards.items():
        info = ray.get(s.info.remote())
        assert (info["product"], info["layer"], info["version"]) == (product, layer, 1)


def test_a_killed_shard_actor_comes_back_bit_for_bit(service) -> None:
    key = (PRODUCTS[1], "layer2")
    shard = service["shards"][key]
    old = ray.get(shard.info.remote())
    ray.kill(shard, no_restart=False)  # a crash mid-service
    info = back_from_the_store(shard, old["pid"])
    assert info["version"] == 1 and info["images"] == old["images"]
    assert_same_templates(service, key)


def test_a_removed_node_s_shards_come_back_on_the_other_nodes_bit_for_bit(service, cluster) -> None:
    shards = service["shards"]
    victim = sorted(cluster.worker_nodes, key=lambda n: n.node_id)[0]
    lost = {key: ray.get(s.info.remote())["pid"] for key, s in shards.items() if node_of(s) == victim.node_id}
    assert lost, "the node to remove holds no shard"
    cluster.remove_node(victim, allow_graceful=False)  # the machine dies: no goodbye to the GCS
    survivors = alive_nodes()
    for key, pid in lost.items():
        info = back_from_the_store(shards[key], pid)
        assert info["node"] != victim.node_id and info["node"] in survivors
        assert info["version"] == 1
    assert victim.node_id not in alive_nodes()
    for key in shards:  # the moved shards and the untouched ones alike
        assert_same_templates(service, key)
    assert Counter(node_of(s) for s in shards.values()).keys() <= survivors

"""Template hosts on a real 3-node Ray cluster (``ray.cluster_utils.Cluster``).

The registry runs 3 host actors (SPREAD: one per node) holding the (product, layer)
shards of several small products by the rendezvous rule. Then a host is killed for good
while a replica-like loop loads products' tiny sets and a writer hot-updates one product:
the lost host's shards come back on the other nodes' hosts from the store, bit for bit,
and meanwhile loads and updates either succeed or fail with a clean error (counted).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import ray
import torch
import torch.nn.functional as F

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.core.pts import pts_indices
from hetmm_ray.core.templates import TemplateSet
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.distributed import connect, get_registry, shutdown_ray
from hetmm_ray.distributed.placement import place
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NODES = HOSTS = 3
PRODUCTS = tuple(f"part-{i}" for i in range(6))
LAYERS = {"layer1": (8, 4, 4), "layer2": (16, 2, 2), "layer3": (32, 1, 1)}  # (C, H, W): tiny synthetic banks
FAST_FAILURE_DETECTION = {"health_check_period_ms": 300, "health_check_failure_threshold": 3}
CONFIG = DetectorConfig(
    backbone=BackboneConfig(name="resnet18", weights="random", image_size=32),
    templates=TemplateConfig(kind="pts_o", sheets=2),
    threshold=ThresholdConfig(max_images=4, folds=2),
)


def bank(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: F.normalize(torch.randn(n, c, h, w, generator=g), dim=1) for k, (c, h, w) in LAYERS.items()}


def digests(seed: int, n: int) -> tuple[str, ...]:
    return tuple(f"{seed:06x}{i:026x}" for i in range(n))


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = str(tmp_path_factory.mktemp("hosts") / "store")
    for seed, product in enumerate(PRODUCTS):
        b = bank(5, seed)
        ts = TemplateSet(
            bank=b,
            config=CONFIG,
            weights_id="random:seed=0",
            image_digests=digests(seed, 5),
            indices={k: pts_indices(v, 2) for k, v in b.items()},
        )
        open_store(uri).put(product, HETMM(CONFIG).calibrated(ts))
    return uri


@pytest.fixture(scope="module")
def cluster(own_ray) -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "_system_config": FAST_FAILURE_DETECTION},
    )
    for _ in range(1, NODES):
        c.add_node(num_cpus=1)
    c.wait_for_nodes()
    connect(c.address)
    yield c
    shutdown_ray()
    c.shutdown()


@pytest.fixture(scope="module")
def registry(cluster, store_uri: str) -> Any:
    reg = get_registry(store_uri, placement={"hosts": HOSTS, "num_cpus": 0})
    ray.get(reg.set_poll.remote(0.3))  # heal within a fraction of a second
    for product in PRODUCTS:
        ray.get(reg.snapshot.remote(product))
    return reg


def tiny_sets(registry: Any, product: str) -> dict[str, np.ndarray]:
    """What a replica does on a cold load: the published snapshot, then its tiny sets by reference."""
    snap = ray.get(registry.snapshot.remote(product))
    return dict(zip(snap.tiny, ray.get(list(snap.tiny.values())), strict=True))


def assert_bit_for_bit(registry: Any, store_uri: str, product: str) -> None:
    stored = open_store(store_uri).get(product)
    shards = ray.get(registry.shard_handles.remote(product))
    for layer in LAYERS:
        expected = stored.templates(layer).numpy()
        assert np.array_equal(ray.get(shards[layer].tiny.remote()), expected), (product, layer)
        assert np.array_equal(ray.get(shards[layer].selection.remote())["indices"], stored.indices[layer].numpy())
    assert ray.get(shards[next(iter(LAYERS))].info.remote())["version"] == stored.meta["version"]


def test_a_bounded_number_of_hosts_hold_every_shard_by_the_rule(registry, store_uri: str) -> None:
    hosts = ray.get(registry.hosts_info.remote())
    assert len(hosts) == HOSTS and len({h["pid"] for h in hosts}) == HOSTS
    assert len({h["node"] for h in hosts}) == NODES  # SPREAD: one host per node
    assert sum(h["shards"] for h in hosts) == len(PRODUCTS) * len(LAYERS)
    for product in PRODUCTS:
        where = ray.get(registry.placement_of.remote(product))
        assert where == {layer: place(product, layer, range(HOSTS)) for layer in LAYERS}
        assert_bit_for_bit(registry, store_uri, product)
    # Products are data: holding more of them adds no process (the hosts' pids are the same ones).
    assert {h["pid"] for h in ray.get(registry.hosts_info.remote())} == {h["pid"] for h in hosts}


def test_a_killed_host_s_shards_come_back_on_the_others_bit_for_bit(registry, store_uri: str) -> None:
    hosts = {h["slot"]: h for h in ray.get(registry.hosts_info.remote())}
    victim = max(hosts, key=lambda s: hosts[s]["shards"])
    lost = {p: [k for k, s in ray.get(registry.placement_of.remote(p)).items() if s == victim] for p in PRODUCTS}
    assert any(lost.values())
    handles = ray.get(registry.shard_handles.remote(next(p for p in PRODUCTS if lost[p])))
    victim_handle = next(h.host for h in handles.values() if h.slot == victim)

    outcomes: Counter[str] = Counter()
    errors: list[str] = []
    stop = threading.Event()

    def loads() -> None:  # replicas cold-loading products while the host dies
        while not stop.is_set():
            for product in PRODUCTS:
                try:
                    tiny_sets(registry, product)
                    outcomes["load ok"] += 1
                except ray.exceptions.RayError as exc:
                    outcomes["load failed"] += 1
                    errors.append(type(exc).__name__)
            time.sleep(0.05)  # a steady trickle, not a busy loop on the shared cores

    def updates() -> None:  # hot updates of one product meanwhile
        for i in range(2):
            b = bank(1, 100 + i)
            try:
                feats = {k: v.numpy() for k, v in b.items()}
                ray.get(registry.update.remote(PRODUCTS[0], feats, list(digests(100 + i, 1))))
                outcomes["update ok"] += 1
            except ray.exceptions.RayError as exc:
                outcomes["update failed"] += 1
                errors.append(type(exc).__name__)

    threads = [threading.Thread(target=loads), threading.Thread(target=updates)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        ray.kill(victim_handle, no_restart=True)  # the host is lost for good
        threads[1].join(timeout=120)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the registry's next poll re-places the lost shards
            where = {p: ray.get(registry.placement_of.remote(p)) for p in PRODUCTS}
            # a layer being re-placed is missing from the map for a moment: wait until every lost one is back
            if all(where[p] and all(where[p].get(k) not in (None, victim) for k in lost[p]) for p in PRODUCTS):
                break
            time.sleep(0.2)
        time.sleep(1.0)
    finally:  # the loader thread stops even when a check above fails (it would keep calling Ray)
        stop.set()
    threads[0].join(timeout=60)
    print(f"outcomes while a host died: {dict(outcomes)}; errors: {Counter(errors)}")
    assert outcomes["load ok"] > 0 and outcomes["update ok"] + outcomes["update failed"] == 2

    survivors = {h["slot"]: h for h in ray.get(registry.hosts_info.remote()) if h["slot"] != victim}
    for product in PRODUCTS:
        where = ray.get(registry.placement_of.remote(product))
        for layer in lost[product]:  # moved to a host on another node
            assert where.get(layer) not in (None, victim) and where[layer] in survivors, (product, layer, where)
            assert survivors[where[layer]]["node"] != hosts[victim]["node"]
        assert_bit_for_bit(registry, store_uri, product)
    # Every load after the heal works, and the stored head of the updated product is what is served.
    for product in PRODUCTS:
        tiny = tiny_sets(registry, product)
        stored = open_store(store_uri).get(product)
        for layer in LAYERS:
            assert np.array_equal(tiny[layer], stored.templates(layer).numpy())
    assert len(ray.get(registry.hosts_info.remote())) == HOSTS  # the lost slot was started afresh


def test_a_host_lost_under_another_product_s_load_leaves_no_product_unplaced(registry, store_uri: str) -> None:
    """A hot update of product A meets a dead host first (its append fails, the registry loads A
    again and the placement runs into the dead host); product B also had a shard on that host.
    After the next heal both are whole, off the dead host, and bit for bit the store's. (In
    full-suite runs the test above once ended with a product a layer short: a placement that met a
    dead host dropped the other products' shards from that host's books, so the heal's ping found
    nothing to reload; ``HostPool.place`` now hands them to the next ``check``.)"""
    ray.get(registry.set_poll.remote(3600))  # no background heal of ours: this test calls it
    try:
        deadline = time.monotonic() + 120  # every host up and every product whole (a test before may have killed one)
        while time.monotonic() < deadline:
            ray.get(registry.heal_hosts.remote())
            hosts = {h["slot"]: h for h in ray.get(registry.hosts_info.remote())}
            where = {p: ray.get(registry.placement_of.remote(p)) for p in PRODUCTS}
            if all(h.get("up", True) for h in hosts.values()) and all(len(w) == len(LAYERS) for w in where.values()):
                break
            time.sleep(0.5)
        holders = {slot: sorted(p for p in PRODUCTS if slot in where[p].values()) for slot in hosts}
        victim = max(holders, key=lambda s: len(holders[s]))
        assert len(holders[victim]) >= 2, holders
        updated, other = holders[victim][0], holders[victim][1]
        handles = ray.get(registry.shard_handles.remote(updated))
        ray.kill(next(h.host for h in handles.values() if h.slot == victim), no_restart=True)

        b = bank(1, 500)
        with pytest.raises(ray.exceptions.RayError):  # the append reaches the dead host
            ray.get(registry.update.remote(updated, {k: v.numpy() for k, v in b.items()}, list(digests(500, 1))))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ray.get(registry.heal_hosts.remote())
            placed = {p: ray.get(registry.placement_of.remote(p)) for p in (updated, other)}
            if all(set(w) == set(LAYERS) and victim not in w.values() for w in placed.values()):
                break
            time.sleep(0.5)
        for product in (updated, other):
            assert set(placed[product]) == set(LAYERS) and victim not in placed[product].values(), (product, placed)
            assert_bit_for_bit(registry, store_uri, product)
    finally:
        ray.get(registry.set_poll.remote(0.3))

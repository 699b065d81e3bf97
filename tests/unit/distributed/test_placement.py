"""Shard placement (rendezvous hashing) and the warm-set routing policy: pure logic, no Ray."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from hetmm_ray.distributed.placement import place, score
from hetmm_ray.serve.warm_set import WarmSet, alias, product_of

LAYERS = ("layer1", "layer2", "layer3")
SHARDS = [(f"p{i:04d}", layer) for i in range(1000) for layer in LAYERS]


def slow_place(product: str, layer: str, slots: list[int]) -> int:
    """The rule written out: the slot whose sha256("<product>/<layer>#<slot>") is largest."""
    best = None
    for slot in slots:
        value = int(hashlib.sha256(f"{product}/{layer}#{slot}".encode()).hexdigest()[:16], 16)
        if best is None or value > best[0]:
            best = (value, slot)
    assert best is not None
    return best[1]


def test_placement_is_the_rendezvous_rule_and_stable() -> None:
    for product, layer in SHARDS[:300]:
        assert place(product, layer, [0, 1, 2]) == slow_place(product, layer, [0, 1, 2])
        assert place(product, layer, [2, 0, 1]) == place(product, layer, range(3))  # order of slots is irrelevant
    assert score("a", "layer1", 0) == score("a", "layer1", 0)
    with pytest.raises(RuntimeError, match="no template host is up"):
        place("a", "layer1", [])


def test_placement_spreads_products_and_layers_over_hosts() -> None:
    per_slot = Counter(place(p, layer, range(3)) for p, layer in SHARDS)
    assert set(per_slot) == {0, 1, 2}
    assert all(abs(n - 1000) < 100 for n in per_slot.values()), per_slot  # 3,000 shards, ~1,000 each
    for layer in LAYERS:  # every layer is spread too, not one layer per host
        per_layer = Counter(place(p, layer_, range(3)) for p, layer_ in SHARDS if layer_ == layer)
        assert all(abs(n - 333) < 60 for n in per_layer.values()), (layer, per_layer)


def test_losing_a_host_moves_only_its_shards_and_spreads_them_over_the_others() -> None:
    before = {s: place(*s, range(4)) for s in SHARDS}
    after = {s: place(*s, [0, 1, 3]) for s in SHARDS}  # slot 2 lost
    moved = [s for s in SHARDS if before[s] != after[s]]
    assert moved and all(before[s] == 2 for s in moved)  # only slot 2's shards move
    assert {s for s in SHARDS if before[s] == 2} == set(moved)
    landed = Counter(after[s] for s in moved)
    assert set(landed) == {0, 1, 3} and min(landed.values()) > len(moved) / 3 * 0.8  # spread over the survivors
    back = {s: place(*s, range(4)) for s in SHARDS}
    assert back == before  # the host comes back: the rule gives the same placement again


def test_warm_set_pins_a_quiet_product_and_spreads_a_hot_one() -> None:
    warm = WarmSet(hot_inflight=3, spread=4)
    assert warm.model_id("gear") == "gear"
    held = [warm.request("gear") for _ in range(3)]
    ids = [h.__enter__() for h in held]
    assert ids == ["gear", "gear", "gear"]  # quiet until 3 are in flight
    hot = []
    for _ in range(8):  # now hot: the product's own id and its aliases in turn
        with warm.request("gear") as model_id:
            hot.append(model_id)
    assert hot == ["gear", "gear~1", "gear~2", "gear~3"] * 2
    assert {product_of(m) for m in hot} == {"gear"}
    assert warm.model_id("bolt") == "bolt"  # other products are not affected
    for h in held:
        h.__exit__(None, None, None)
    assert warm.inflight == Counter() and warm.model_id("gear") == "gear"  # quiet again
    assert WarmSet(hot_inflight=1, spread=1).model_id("gear") == "gear"  # spread 1: always pinned
    assert alias("gear", 0) == "gear" and product_of("gear") == "gear"


def test_warm_set_renames_its_aliases_while_hot(monkeypatch) -> None:
    """Aliases rotate every rotate_s so replicas added by autoscaling get a share (a name no
    replica holds goes to the replicas with the fewest models); the product's own id stays."""
    import hetmm_ray.serve.warm_set as warm_set

    now = [100.0]
    monkeypatch.setattr(warm_set.time, "monotonic", lambda: now[0])
    warm = WarmSet(hot_inflight=1, spread=3, rotate_s=10.0)
    with warm.request("gear"):
        first = [warm.model_id("gear") for _ in range(3)]
        now[0] += 10.0
        second = [warm.model_id("gear") for _ in range(3)]
    assert first == ["gear", "gear~1@10", "gear~2@10"] and second == ["gear", "gear~1@11", "gear~2@11"]
    assert {product_of(m) for m in first + second} == {"gear"}

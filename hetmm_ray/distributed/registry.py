"""ProductRegistry: product -> head version and shards, one writer per product.

A named actor (detached where it should outlive its creator) in front of the
template store. The store stays the truth: the registry keeps no state that it
cannot rebuild from it, so a restarted registry recovers by reading heads.
Writers go through :meth:`ProductRegistry.update`, serialised per product by
an asyncio lock; subscribers (replicas) long-poll :meth:`wait_for_version`.

Hot update, in order (DESIGN.md): the shards append the new features and
re-select their tiny sets (PTS fanned out as tasks) -> the template set is
rebuilt from the shards and recalibrated -> published to the store with
``expect_head`` (data, then head) -> the registry bumps the version and wakes
subscribers. If any step fails, the shards are reloaded from the old head and
the error is raised: the old version keeps serving everywhere.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import numpy as np
import ray
import torch

from ..core.templates import TemplateSet
from ..store import open_store
from .shard import ShardPlacement, TemplateShard, shard_options

__all__ = ["REGISTRY_NAME", "ProductRegistry", "get_registry"]

REGISTRY_NAME = "hetmm-registry"


@ray.remote
class ProductRegistry:
    def __init__(self, store_uri: str, placement: dict[str, Any] | None = None) -> None:
        self.store_uri = store_uri
        self.store = open_store(store_uri)
        self.placement = ShardPlacement(**(placement or {}))
        self.versions: dict[str, int] = {}
        self.shards: dict[str, dict[str, Any]] = {}
        self.locks: dict[str, asyncio.Lock] = {}
        self.changed: dict[str, asyncio.Condition] = {}

    def _lock(self, product: str) -> asyncio.Lock:
        return self.locks.setdefault(product, asyncio.Lock())

    def _condition(self, product: str) -> asyncio.Condition:
        return self.changed.setdefault(product, asyncio.Condition())

    async def products(self) -> dict[str, int]:
        names = await asyncio.to_thread(self.store.products)
        return {p: await self.head(p) for p in names}

    async def head(self, product: str) -> int:
        if product not in self.versions:
            self.versions[product] = await asyncio.to_thread(self.store.head, product)
        return self.versions[product]

    async def _load_shards(self, product: str) -> TemplateSet:
        """(Re)create the product's shards; each loads its layer of the store head itself."""
        ts = await asyncio.to_thread(self.store.get, product)
        for old in self.shards.pop(product, {}).values():
            ray.kill(old, no_restart=True)
        shards = {}
        for layer in ts.layers:
            opts = shard_options(self.placement, product=product, layer=layer)
            opts.pop("name")  # replaced shards must not collide with the old names while they die
            shards[layer] = TemplateShard.options(**opts).remote(product, layer, self.store_uri)
        infos = await asyncio.gather(*(s.info.remote() for s in shards.values()))
        if any(i["version"] != ts.meta["version"] for i in infos):  # the head moved meanwhile: retry
            return await self._load_shards(product)
        self.shards[product] = shards
        self.versions[product] = int(ts.meta["version"])
        return ts

    async def shard_handles(self, product: str) -> dict[str, Any]:
        async with self._lock(product):
            if product not in self.shards:
                await self._load_shards(product)
            return dict(self.shards[product])

    async def update(self, product: str, features: dict[str, np.ndarray], digests: list[str]) -> int:
        """Hot update with new good images' features (layer -> (n, C, H, W)); returns the new version."""
        from ..detector import HETMM

        async with self._lock(product):
            base = await self._load_shards(product) if product not in self.shards else None
            if base is None:
                base = await asyncio.to_thread(self.store.get, product, self.versions[product])
            shards = self.shards[product]
            try:
                if set(features) != set(shards):
                    raise ValueError(f"{product}: features have layers {sorted(features)}, shards {sorted(shards)}")
                await asyncio.gather(*(shards[k].append.remote(v) for k, v in features.items()))
                tc = base.config.templates
                await asyncio.gather(*(s.select.remote(tc.kind, tc.sheets, tc.seed) for s in shards.values()))
                grown = base.appended({k: torch.from_numpy(np.array(v)) for k, v in features.items()}, tuple(digests))
                selections = await asyncio.gather(*(shards[k].selection.remote() for k in grown.layers))
                chosen = dict(zip(grown.layers, selections, strict=True))
                # appended() reset the selection; take the shards' new one (indices or centres).
                grown = replace(
                    grown,
                    **{
                        part: {k: torch.from_numpy(c[part]) for k, c in chosen.items() if c[part] is not None} or None
                        for part in ("indices", "centres")
                    },
                )
                calibrated = await asyncio.to_thread(HETMM(base.config).calibrated, grown)
                version = await asyncio.to_thread(
                    self.store.put, product, calibrated, expect_head=self.versions[product]
                )
            except BaseException:
                await self._load_shards(product)  # back to the old head everywhere
                raise
            self.versions[product] = version
            await asyncio.gather(*(s.mark_published.remote(version) for s in shards.values()))
        async with self._condition(product):
            self._condition(product).notify_all()
        return version

    async def wait_for_version(self, product: str, after: int, timeout: float = 30.0) -> int:
        """Long-poll: return as soon as the head is newer than ``after`` (or at ``timeout``)."""
        cond = self._condition(product)
        async with cond:
            try:
                await asyncio.wait_for(cond.wait_for(lambda: self.versions.get(product, 0) > after), timeout)
            except TimeoutError:
                pass
        return await self.head(product)


def get_registry(store_uri: str, *, detached: bool = False, namespace: str = "hetmm") -> Any:
    """The cluster's registry actor, created on first use."""
    return ProductRegistry.options(
        name=REGISTRY_NAME,
        namespace=namespace,
        get_if_exists=True,
        lifetime="detached" if detached else None,
        num_cpus=0.1,
        max_restarts=-1,
        max_concurrency=64,
    ).remote(store_uri)

"""ProductRegistry: product -> head version and shards, one writer per product.

A named actor (detached where it should outlive its creator) in front of the
template store. The store stays the truth: the registry keeps no state that it
cannot rebuild from it, so a restarted registry recovers by reading heads.
Writers (:meth:`ProductRegistry.create`, :meth:`~ProductRegistry.update`,
:meth:`~ProductRegistry.rollback`, and the jobs that wrap them for the HTTP
service) are serialised per product by an asyncio lock. Replicas take the
published tiny set of a product by object reference (:meth:`snapshot`: shared
memory, never the full bank), check :meth:`head` between batches and may
long-poll :meth:`wait_for_version`.

Hot update, in order (DESIGN.md): the shards append the new features and
re-select their tiny sets (PTS fanned out as tasks) -> the template set is
rebuilt from the shards and recalibrated -> published to the store with
``expect_head`` (data, then head) -> the registry bumps the version and wakes
subscribers. If any step fails, the shards are reloaded from the old head and
the error is raised: the old version keeps serving everywhere.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np
import ray
import torch

from ..config import TASK_CPUS, DetectorConfig, stored_config
from ..core.pts import select_layers
from ..core.templates import TemplateSet
from ..store import StoreConflict, check_product_name, open_store
from .jobs import JobBoard, JobProgress
from .pts_fanout import pts_indices_ray
from .shard import ShardPlacement, TemplateShard, shard_options

__all__ = ["REGISTRY_NAME", "ProductRegistry", "get_registry", "registry_name"]

REGISTRY_NAME = "hetmm-registry"


@ray.remote(num_cpus=TASK_CPUS)
def _calibrated(ts: TemplateSet) -> TemplateSet:
    """Recalibrate on a full CPU: the registry itself runs on a sliver of one."""
    from ..detector import HETMM

    torch.set_num_threads(max(1, round(ray.get_runtime_context().get_assigned_resources().get("CPU", 1))))
    return HETMM(ts.config).calibrated(ts)


@ray.remote(num_cpus=TASK_CPUS)
def _auto_selected(ts: TemplateSet) -> TemplateSet:
    """``templates.sheets: auto`` (core/auto_sheets.py) in one task: the ladder's selections and
    out-of-fold scorings; the result's config holds the chosen K (hot updates keep it)."""
    from ..detector import HETMM

    torch.set_num_threads(max(1, round(ray.get_runtime_context().get_assigned_resources().get("CPU", 1))))
    return HETMM(ts.config)._selected(ts)


def _weights_identity(config: Any) -> str:
    from ..core.backbone import weights_identity  # torchvision only where a backbone is involved

    return weights_identity(config)


def _features_to_bank(features: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.array(v)) for k, v in features.items()}


@ray.remote
class ProductRegistry:
    def __init__(self, store_uri: str, placement: dict[str, Any] | None = None) -> None:
        self.store_uri = store_uri
        self.store = open_store(store_uri)
        self.placement = ShardPlacement(**(placement or {}))
        self.versions: dict[str, int] = {}
        self.shards: dict[str, dict[str, Any]] = {}
        self.published: dict[str, dict[str, Any]] = {}  # product -> what replicas score with
        self.locks: dict[str, asyncio.Lock] = {}
        self.changed: dict[str, asyncio.Condition] = {}
        self.jobs = JobBoard()

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

    async def describe(self) -> list[dict[str, Any]]:
        """Every product's head version, selection, backbone and threshold (for ``GET /v1/products``)."""
        out = []
        for product, version in (await self.products()).items():
            m = await asyncio.to_thread(self.store.manifest, product, version)
            config = stored_config(m["config"])
            sheets = next(iter(m["layers"].values())).get("sheets") if m.get("selection") else None
            cal = m.get("calibration")
            threshold = None
            if cal:
                from ..core.scoring import Calibration

                threshold = Calibration(tuple(cal)).threshold(config.threshold.sigmas)
            out.append(
                {
                    "product": product,
                    "version": version,
                    "images": m["images"],
                    "templates": config.templates.kind,
                    "sheets": sheets or (m["images"] if config.templates.kind == "all" else config.templates.sheets),
                    "backbone": config.backbone.name,
                    "image_size": config.backbone.image_size,
                    "geometry": config.backbone.geometry,
                    # How K was set: the sheets: auto record (chosen K, why, ladder) or None for a fixed K.
                    "sheets_auto": m.get("meta", {}).get("sheets_auto") if m.get("selection") else None,
                    "threshold": threshold,
                    "created": m.get("created"),
                }
            )
        return out

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
        await self._publish(product, int(ts.meta["version"]), ts)
        return ts

    async def _publish(self, product: str, version: int, ts: TemplateSet) -> None:
        """Make ``version`` what replicas see: its tiny set (from the shards) and scoring metadata."""
        shards = self.shards[product]
        tiny = {layer: shards[layer].tiny.remote() for layer in ts.layers}
        await asyncio.wait([asyncio.wrap_future(r.future()) for r in tiny.values()])
        self.published[product] = {
            "product": product,
            "version": version,
            "config": ts.config.to_dict(),
            "weights_id": ts.weights_id,
            "calibration": None if ts.calibration is None else list(ts.calibration.scores),
            "tiny": tiny,  # ObjectRefs owned by this actor: replicas read them from shared memory
        }
        self.versions[product] = version
        async with self._condition(product):
            self._condition(product).notify_all()

    async def shard_handles(self, product: str) -> dict[str, Any]:
        async with self._lock(product):
            if product not in self.shards:
                await self._load_shards(product)
            return dict(self.shards[product])

    async def snapshot(self, product: str) -> dict[str, Any]:
        """The published version of ``product`` for replicas: metadata plus per-layer tiny-set refs."""
        if product not in self.published:
            async with self._lock(product):
                if product not in self.published:
                    await self._load_shards(product)
        return self.published[product]

    async def create(
        self,
        product: str,
        config: dict[str, Any],
        features: dict[str, np.ndarray],
        digests: list[str],
        progress: JobProgress | None = None,
    ) -> int:
        """A new product from good images' features: select its tiny set, calibrate, publish v1."""
        check_product_name(product)
        cfg = DetectorConfig.from_dict(config)
        async with self._lock(product):
            if product in await asyncio.to_thread(self.store.products):
                raise StoreConflict(f"product {product!r} already exists; add images with .../normals")
            ts = TemplateSet(
                bank=_features_to_bank(features),
                config=cfg,
                weights_id=await asyncio.to_thread(_weights_identity, cfg.backbone),
                image_digests=tuple(digests),
                meta={"created": time.time()},
            )
            ts = await self._selected(ts, progress)
            if progress is not None:
                progress.stage("calibrate")
            ts = await _calibrated.remote(ts)
            if progress is not None:
                progress.stage("publish")
            version = await asyncio.to_thread(self.store.put, product, ts, expect_head=0)
            await self._load_shards(product)
        return version

    async def _selected(self, ts: TemplateSet, progress: JobProgress | None) -> TemplateSet:
        tc = ts.config.templates
        if tc.kind == "all":
            return ts
        if tc.sheets == "auto":
            if progress is not None:
                progress.stage(f"select {tc.kind}: sheets auto")
            return await _auto_selected.remote(ts)
        if progress is not None:
            progress.stage(f"select {tc.kind}", sum(v.shape[2] * v.shape[3] for v in ts.bank.values()))
        fanned = partial(pts_indices_ray, num_cpus=TASK_CPUS)
        indices, centres = await asyncio.to_thread(
            partial(select_layers, progress=progress, pts=fanned), ts.bank, tc.kind, tc.sheets, tc.seed
        )
        return replace(ts, indices=indices, centres=centres)

    async def update(self, product: str, features: dict[str, np.ndarray], digests: list[str]) -> int:
        """Hot update with new good images' features (layer -> (n, C, H, W)); returns the new version."""
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
                grown = base.appended(_features_to_bank(features), tuple(digests))
                selections = await asyncio.gather(*(shards[k].selection.remote() for k in grown.layers))
                chosen = dict(zip(grown.layers, selections, strict=True))
                # appended() reset the selection; take the shards' new one (indices or centres).
                grown = replace(
                    grown,
                    **{
                        part: {k: torch.from_numpy(np.array(c[part])) for k, c in chosen.items() if c[part] is not None}
                        or None
                        for part in ("indices", "centres")
                    },
                )
                calibrated = await _calibrated.remote(grown)
                version = await asyncio.to_thread(
                    self.store.put, product, calibrated, expect_head=self.versions[product]
                )
            except BaseException:
                await self._load_shards(product)  # back to the old head everywhere
                raise
            await asyncio.gather(*(s.mark_published.remote(version) for s in shards.values()))
            await self._publish(product, version, calibrated)
        return version

    async def rollback(self, product: str, version: int) -> int:
        """Make a kept older version head again, in the store, the shards and the replicas."""
        async with self._lock(product):
            await asyncio.to_thread(self.store.rollback, product, version)
            await self._load_shards(product)
        return version

    async def wait_for_version(self, product: str, after: int, timeout: float = 30.0) -> int:
        """Long-poll: return as soon as the head differs from ``after`` (or at ``timeout``)."""
        cond = self._condition(product)
        async with cond:
            try:
                await asyncio.wait_for(cond.wait_for(lambda: self.versions.get(product, after) != after), timeout)
            except TimeoutError:
                pass
        return await self.head(product)

    # --- jobs (the HTTP service's admin routes) -------------------------------------------
    async def _extract(self, config: DetectorConfig, images: list[bytes], progress: JobProgress) -> Any:
        from .extract import extract_features_ray

        progress.stage("features", len(images))
        return await asyncio.to_thread(extract_features_ray, config, images, num_cpus=TASK_CPUS, progress=progress)

    async def start_create(self, product: str, config: dict[str, Any], images: list[bytes]) -> dict[str, Any]:
        """Create ``product`` from encoded good images, as a job; returns the job record."""
        check_product_name(product)
        cfg = DetectorConfig.from_dict(config)
        if product in await asyncio.to_thread(self.store.products):
            raise StoreConflict(f"product {product!r} already exists; add images with .../normals")

        async def work(progress: JobProgress) -> int:
            features, digests = await self._extract(cfg, images, progress)
            return await self.create(product, cfg.to_dict(), features, digests, progress)

        return self.jobs.start("create", product, work)

    async def start_normals(self, product: str, images: list[bytes]) -> dict[str, Any]:
        """Hot-update ``product`` with encoded good images, as a job; returns the job record."""
        version = await self.head(product)  # ProductNotFound before any work starts
        m = await asyncio.to_thread(self.store.manifest, product, version)
        cfg = stored_config(m["config"])

        async def work(progress: JobProgress) -> int:
            features, digests = await self._extract(cfg, images, progress)
            progress.stage("select and publish")
            return await self.update(product, features, digests)

        return self.jobs.start("normals", product, work)

    async def job(self, job_id: str, wait: float = 0.0) -> dict[str, Any] | None:
        """A job's record; ``wait`` seconds to let it finish first."""
        return await self.jobs.wait(job_id, wait) if wait > 0 else self.jobs.get(job_id)


def registry_name(store_uri: str) -> str:
    """One registry per store: services on different stores in one cluster stay apart."""
    return f"{REGISTRY_NAME}:{hashlib.sha256(store_uri.encode()).hexdigest()[:12]}"


def get_registry(
    store_uri: str, *, detached: bool = False, namespace: str = "hetmm", placement: dict[str, Any] | None = None
) -> Any:
    """The store's registry actor in the cluster, created on first use.

    ``placement``: :class:`~hetmm_ray.distributed.shard.ShardPlacement` fields for its shards
    (used when this call creates the actor).
    """
    return ProductRegistry.options(
        name=registry_name(store_uri),
        namespace=namespace,
        get_if_exists=True,
        lifetime="detached" if detached else None,
        num_cpus=0.05,  # it waits on others' work: keep the CPUs for the tasks it starts
        max_restarts=-1,
        max_concurrency=64,
    ).remote(store_uri, placement)

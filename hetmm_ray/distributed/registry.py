"""ProductRegistry: product -> head version and shards, one writer per product.

Shards are data on a bounded number of template hosts (hosts.py): the
registry places each (product, layer) on a host by a stable rule (placement.py),
pings the hosts as it follows the store, and loads a lost host's shards again on
the others from the store.

A named actor (detached where it should outlive its creator) in front of the
template store. The store stays the truth: the registry keeps no state that it
cannot rebuild from it, so a restarted registry recovers by reading heads.
Writers (:meth:`ProductRegistry.create`, :meth:`~ProductRegistry.update`,
:meth:`~ProductRegistry.rollback`, and the jobs that wrap them for the HTTP
service) are serialised per product by an asyncio lock. Replicas take the
published tiny set of a product by object reference (:meth:`snapshot`: shared
memory, never the full bank), check :meth:`head` between batches and may
long-poll :meth:`wait_for_version`.

Create and hot update run the fit pipeline of one process (``fitting.FitPipeline``: the same
dedupe, selection dispatch, provenance and calibration as ``hetmm fit`` / ``update``) with
its steps placed here: PTS as pixel-chunk tasks, a hot update's selection on the product's
template shards, ``sheets: auto`` and the out-of-fold calibration each in a task on a full CPU
(reporting its progress to the job).

Three modules: this one (the actor: hosts, shards, publishing, following the store, candidates),
``registry_jobs.py`` (the admin routes' job starters, mixed into the actor) and
``registry_tasks.py`` (the jobs' long work as tasks, over one detector; a tiled product's create and
hot update spread position by position, ``position_fit.py``).

A tiled product (``geometry.tiles``, hetmm_ray/detection/tiled.py) has one shard per (tile position,
layer), named by its bank key ``tile<p>/<layer>``; its create and hot update extract the frames'
tile features as frame-batch tasks over the cluster (``extract.extract_tiles_ray``), fit or grow
each position from them in a task of its own, and publish like any other version (the shards reload from
the store; after a hot update they append the new frames' rows in place and take the task's
selection instead, :meth:`ProductRegistry._adopted_in_place`); the far rule at a new rate is
accepted and moves the frame threshold only (the stored tile scales stay:
:meth:`ProductRegistry.start_far_rule`). A region job, of any product, is ``Detector.with_region``
in a task; labelled calibration scores the head in a task.

Hot update, in order (docs/design.md): the shards append the new features and
re-select their tiny sets (PTS fanned out as tasks) -> the template set is
rebuilt from the shards and recalibrated -> published to the store with
``expect_head`` (data, then head) -> the registry bumps the version and wakes
subscribers. If any step fails, the shards are reloaded from the old head and
the error is raised: the old version keeps serving everywhere.

Candidates are loaded on the template hosts beside HEAD's shards (hosts.py: keyed by
(product, version, layer)): by the job that publishes one here, and by the store poll, which
loads the candidates listed in HEAD of each product whose shards are loaded here (or that holds
a candidate) and unloads those no longer listed (discarded or promoted elsewhere). Loading a
HEAD that is a fully loaded candidate (promote here, or a promote by another writer that the
poll notices) moves the candidate's shards under HEAD's keys: nothing is read from the store.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import ray
import torch

from ..config import DetectorConfig, ServiceConfig, publishes_candidate
from ..core.templates import TemplateSet
from ..messages import ProductDescription, ProductSnapshot, UnreadableProduct
from ..store import ProductNotFound, StoreConflict, StoreError, VersionRecord, check_product_name, open_store
from .hosts import HostPool
from .jobs import JobBoard, JobProgress
from .ray_steps import JobReport, service_steps
from .registry_jobs import JobStarters, note_outliers, region_preview
from .shard import ShardPlacement
from .store_watch import follow_store

if TYPE_CHECKING:
    from ..detection.fitting import FitPipeline
    from ..detection.geometry_rule import GeometryChoice

__all__ = ["REGISTRY_NAME", "ProductRegistry", "get_registry", "region_preview", "registry_name"]

logger = logging.getLogger(__name__)

REGISTRY_NAME = "hetmm-registry"


def _weights_identity(config: Any) -> str:
    from ..core.backbone import weights_identity  # torchvision only where a backbone is involved

    return weights_identity(config)


def _features_to_bank(features: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.array(v)) for k, v in features.items()}


def _snapshot(
    product: str,
    version: int,
    source: TemplateSet | VersionRecord,
    tiny: dict[str, Any],
    tiles: dict[str, Any] | None = None,
) -> ProductSnapshot:
    """What replicas score ``version`` with: the tiny-set refs and the scoring metadata of a
    template set or of a stored version's record (so publishing a stored version reads its
    manifest, not every layer's bank); ``tiles``: a tiled product's stored ``meta["tiles"]``."""
    return ProductSnapshot(
        product, int(version), source.config, source.weights_id, source.calibration, dict(tiny), tiles
    )


@ray.remote
class ProductRegistry(JobStarters):
    def __init__(self, store_uri: str, placement: dict[str, Any] | None = None) -> None:
        self.store_uri = store_uri
        self.store = open_store(store_uri)
        self.placement = ShardPlacement(**(placement or {}))
        self.versions: dict[str, int] = {}
        self.shards: dict[str, dict[str, Any]] = {}
        self.published: dict[str, ProductSnapshot] = {}  # product -> what replicas score with
        self.locks: dict[str, asyncio.Lock] = {}
        self.changed: dict[str, asyncio.Condition] = {}
        self.jobs = JobBoard()
        self.poll_s = ServiceConfig().store_poll_s  # the service sets its own with set_poll()
        self.publish_default = ServiceConfig().publish  # the service sets its own with set_publish()
        self._watch: asyncio.Task[None] | None = None
        self._hosts: HostPool | None = None  # started on first use (set_hosts may size it first)
        self.host_count = self.placement.hosts or ServiceConfig().template_hosts

    # --- template hosts ---------------------------------------------------------------------
    @property
    def hosts(self) -> HostPool:
        if self._hosts is None:
            self._hosts = HostPool(self.store_uri, self.host_count, self.placement)
            self._ensure_watch()  # the store poll also pings the hosts (heal_hosts)
        return self._hosts

    async def set_hosts(self, count: int) -> None:
        """How many template hosts (ServiceConfig.template_hosts). Before first use it sizes the
        pool; later it can only add hosts (placed shards stay where they are)."""
        self.host_count = max(self.host_count if self._hosts is not None else 1, int(count))
        if self._hosts is not None:
            self._hosts.grow(self.host_count)

    async def heal_hosts(self) -> list[str]:
        """Ping the hosts; load the shards a lost or restarted host held again, on the hosts that
        are up (from the store). Returns the products reloaded. Runs with every store poll."""
        if self._hosts is None:
            return []
        reloaded = []
        for product in sorted(await self._hosts.check()):
            async with self._lock(product):
                if product in self.shards:
                    await self._load_shards(product)
                    reloaded.append(product)
        return reloaded

    async def hosts_info(self) -> list[dict[str, Any]]:
        """Each template host: slot, pid, node, shards and tensor bytes it holds, whether it is up."""
        return await self.hosts.describe()

    async def placement_of(self, product: str) -> dict[str, int]:
        """layer -> host slot of a loaded product (empty if not loaded)."""
        return self.hosts.where(product)

    # --- following the store (other writers) ----------------------------------------------
    def _ensure_watch(self) -> None:
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(follow_store(self.sync_heads, lambda: self.poll_s))

    async def set_poll(self, seconds: float) -> None:
        """How often to re-read the HEADs of served products (ServiceConfig.store_poll_s)."""
        self.poll_s = float(seconds)
        self._ensure_watch()

    async def set_publish(self, mode: str) -> None:
        """How jobs publish a product whose own ``publish`` is unset (ServiceConfig.publish)."""
        publishes_candidate(mode, None)  # ConfigError for anything but a mode
        self.publish_default = mode

    def _candidate(self, publish: str | None, config: DetectorConfig) -> bool:
        """Whether a job publishes a candidate: the request's ``publish``, else the product's, else
        the service's."""
        return publishes_candidate(publish, config.publish, self.publish_default)

    async def sync_heads(self) -> None:
        """Make what is served here follow each held product's HEAD in the store (store_watch.py);
        first bring back the shards of a lost template host."""
        await self.heal_hosts()
        for product in list(self.versions):
            try:
                head, listed = await asyncio.to_thread(self.store.head_and_candidates, product)
            except ProductNotFound:
                head, listed = None, []
            except StoreError:
                continue  # unreadable now: keep serving what we have
            if head == self.versions.get(product):
                await self._follow_candidates(product, listed)
                continue
            async with self._lock(product):  # a writer here may be mid-publish: look again under its lock
                try:
                    head = await asyncio.to_thread(self.store.head, product)
                except ProductNotFound:
                    self._forget(product)
                    continue
                if head == self.versions.get(product):
                    continue
                if product in self.published:
                    await self._reload_shards(product)
                else:
                    self.versions[product] = head
                    async with self._condition(product):
                        self._condition(product).notify_all()
            await self._follow_candidates(product, listed)

    async def _follow_candidates(self, product: str, listed: list[int]) -> None:
        """The store poll's part for candidates: load the candidates of ``listed`` (HEAD's
        list) not fully held, unload those held and no longer listed. Only for a product whose HEAD
        shards are loaded here, or that holds a candidate; skipped while a writer holds the product's
        lock (a job publishing one loads it itself; the next poll looks again). A candidate that
        cannot be loaded is logged and tried again at the next poll."""
        if self._hosts is None or (product not in self.shards and product not in self._hosts.candidate_products()):
            return
        lock = self._lock(product)
        if lock.locked():
            return
        async with lock:
            held = self._hosts.candidate_versions(product)
            for version in sorted(held - set(listed)):
                self._hosts.drop_candidate(product, version)
            for version in listed:
                if version == self.versions.get(product):
                    continue
                try:
                    await self._load_candidate(product, version, complete_ok=True)
                except (StoreError, ray.exceptions.RayError) as exc:
                    logger.warning("candidate v%s of %s not loaded (%s: %s)", version, product, type(exc).__name__, exc)

    async def _load_candidate(self, product: str, version: int, *, complete_ok: bool = False) -> None:
        """Load candidate ``version``'s layers on the template hosts beside HEAD's; with
        ``complete_ok`` nothing is done (nothing read) when every layer is already held."""
        if complete_ok and self.hosts.candidate_complete(product, version):
            return
        rec = await asyncio.to_thread(self.store.record, product, version)
        await self.hosts.place_candidate(product, version, list(rec.layers))

    async def _publish_candidate(self, product: str, version: int) -> None:
        """A job stored candidate ``version``: load it on the hosts. A failure here is logged, not the
        job's (the candidate is stored; the store poll loads it)."""
        try:
            await self._load_candidate(product, version)
        except (StoreError, ray.exceptions.RayError) as exc:
            logger.warning("candidate v%s of %s not loaded (%s: %s)", version, product, type(exc).__name__, exc)

    async def host_holdings(self) -> list[dict[str, Any]]:
        """Each template host: bytes held per (product, version) shard set (candidates marked),
        its RSS and shard loads (``TemplateHost.holdings``)."""
        return await self.hosts.holdings()

    def _lock(self, product: str) -> asyncio.Lock:
        return self.locks.setdefault(product, asyncio.Lock())

    def _condition(self, product: str) -> asyncio.Condition:
        return self.changed.setdefault(product, asyncio.Condition())

    async def products(self) -> dict[str, int]:
        names = await asyncio.to_thread(self.store.products)
        return {p: await self.head(p) for p in names}

    async def head(self, product: str) -> int:
        self._ensure_watch()
        if product not in self.versions:
            self.versions[product] = await asyncio.to_thread(self.store.head, product)
        return self.versions[product]

    async def describe(self) -> list[ProductDescription | UnreadableProduct]:
        """Every product's head version, selection, backbone and threshold (for ``GET /v1/products``)."""
        out: list[ProductDescription | UnreadableProduct] = []
        for product, version in (await self.products()).items():
            try:
                out.append(await self._describe_one(product, version))
            except Exception as exc:  # noqa: BLE001 - one bad product must not break the list of all
                out.append(UnreadableProduct(product, version, f"{type(exc).__name__}: {exc}"))
        return out

    async def _describe_one(self, product: str, version: int) -> ProductDescription:
        rec = await asyncio.to_thread(self.store.record, product, version)
        config = rec.config
        op = rec.operating_point()
        return ProductDescription(
            product=product,
            version=version,
            images=rec.images,
            templates=rec.templates,
            sheets=rec.sheets,  # what the selection holds, not the configured K
            backbone=config.backbone.name,
            weights_id=rec.weights_id,
            image_size=config.backbone.image_size,
            geometry=config.backbone.geometry,
            # How K was set: the sheets: auto record (chosen K, why, ladder) or None for a fixed K.
            sheets_auto=None if rec.sheets_auto is None else dict(rec.sheets_auto),
            threshold=None if op is None else op.threshold,
            # the rule that set it and the estimated share of good parts flagged (fraction)
            threshold_rule=None if op is None else op.rule,
            rule_target=None if op is None else op.target,
            estimated_false_alarm_rate=None if op is None else op.false_alarm_rate,
            created=rec.created,
            region=config.region is not None,
            tiles=tuple(int(v) for v in config.geometry.tiles),  # type: ignore[arg-type]
            threshold_warning=None if op is None else op.warning(),
            false_alarm_estimate=None if op is None or op.estimate is None else op.estimate.to_json(),
        )

    async def settings(self, product: str) -> dict[str, Any]:
        """``GET /v1/products/{product}``: the head version's stored settings (the configuration a
        manifest keeps, ``geometry`` always shown), and its region, tile grid and tile overlap."""
        version = await self.head(product)  # ProductNotFound -> 404
        config = (await asyncio.to_thread(self.store.record, product, version)).config
        stored = config.stored_dict()
        stored["geometry"] = config.to_dict()["geometry"]
        return {
            "product": product,
            "version": version,
            "config": stored,
            "region": config.region,
            "tiles": list(config.geometry.tiles),
            "tile_overlap": config.geometry.tile_overlap,
        }

    async def _load_shards(self, product: str) -> int:
        """Load the store head's layers on the product's template hosts and publish it; returns
        the version. Each host reads its layer only (store/layout.py); the registry reads the
        manifest. All layers load the same version (the head read here), so a head moving
        meanwhile is caught by the next store poll."""
        version = await asyncio.to_thread(self.store.head, product)
        rec = await asyncio.to_thread(self.store.record, product, version)
        self.shards.pop(product, None)
        # a head that is a loaded candidate (promoted) takes its shards as they are
        adopted = await self.hosts.adopt(product, version, list(rec.layers))
        self.shards[product] = adopted or await self.hosts.place(product, list(rec.layers), version)
        await self._publish(product, version, rec)
        return version

    async def _reload_shards(self, product: str) -> None:
        """Load the store's head into the product's shards (on the hosts it is placed on) and publish it."""
        await self._load_shards(product)

    async def _publish(self, product: str, version: int, source: TemplateSet | VersionRecord) -> None:
        """Make ``version`` what replicas see: its tiny set (from the shards) and scoring metadata
        (``source``: the template set or the version's record)."""
        shards = self.shards[product]
        tiny = {layer: shards[layer].tiny.remote() for layer in source.layers}
        futures = [asyncio.wrap_future(r.future()) for r in tiny.values()]
        await asyncio.wait(futures)
        for f in futures:
            if f.exception() is not None:  # a host lost under the publish: the old version keeps serving
                raise f.exception()  # type: ignore[misc]
        # a tiled product's positions' settings and calibrations ride in the manifest's meta (None: one canvas)
        held = source.meta.get("tiles") if isinstance(source, TemplateSet) else source.tiles
        tiles = dict(held) if held else None
        # The tiny sets are ObjectRefs owned by this actor: replicas read them from shared memory.
        self.published[product] = _snapshot(product, version, source, tiny, tiles)
        self.versions[product] = version
        async with self._condition(product):
            self._condition(product).notify_all()

    async def shard_handles(self, product: str) -> dict[str, Any]:
        async with self._lock(product):
            if product not in self.shards:
                await self._load_shards(product)
            return dict(self.shards[product])

    async def snapshot(self, product: str) -> ProductSnapshot:
        """The published version of ``product`` for replicas: metadata plus per-layer tiny-set refs."""
        self._ensure_watch()
        if product not in self.published:
            async with self._lock(product):
                if product not in self.published:
                    await self._load_shards(product)
        return self.published[product]

    def _pipeline(
        self, config: DetectorConfig, progress: JobProgress | None, shards: dict[str, Any] | None = None
    ) -> FitPipeline:
        """The fit pipeline (``fitting.py``) with its steps placed on the cluster: PTS as pixel-chunk
        tasks, ``sheets: auto`` and the calibration in tasks reporting to the job, and with
        ``shards`` (a hot update) the fixed-K selection on the product's shards. Run it in a
        thread: its steps wait on Ray."""
        from ..detection.fitting import FitPipeline
        from ..detection.scorer import Scorer

        me = ray.get_runtime_context().current_actor
        report = None if progress is None else JobReport(me, progress.job_id)
        return FitPipeline(Scorer(config), steps=service_steps(shards, report), report=progress)

    async def job_report(self, job_id: str, stage: str | None, done: int, total: int) -> None:
        """Progress of a job's work running in a task (``distributed.ray_steps.JobReport``): a new stage, or counts."""
        progress = self.jobs.progress_of(job_id)
        if progress is None:
            return
        if stage is not None:
            progress.stage(stage, total)
        else:
            progress(done, total)

    async def job_note(self, job_id: str, fields: dict[str, Any]) -> None:
        """Facts a job's work running in a task reports besides progress (``JobProgress.note``)."""
        progress = self.jobs.progress_of(job_id)
        if progress is not None:
            progress.note(**fields)

    async def create(
        self,
        product: str,
        config: dict[str, Any],
        features: dict[str, np.ndarray],
        digests: list[str],
        progress: JobProgress | None = None,
        *,
        geometry: GeometryChoice | None = None,
    ) -> int:
        """A new product from good images' features: select its tiny set, calibrate, publish v1 (with what
        the geometry rule chose, ``geometry``: ``GeometryChoice.stored_with``)."""
        check_product_name(product)
        cfg = DetectorConfig.from_dict(config)
        async with self._lock(product):
            if product in await asyncio.to_thread(self.store.products):
                raise StoreConflict(f"product {product!r} already exists; add images with .../normals")
            weights_id = await asyncio.to_thread(_weights_identity, cfg.backbone)
            pipeline = self._pipeline(cfg, progress)
            ts = await asyncio.to_thread(
                partial(pipeline.fit_features, weights_id=weights_id, config=cfg), _features_to_bank(features), digests
            )
            note_outliers(progress, ts)
            if geometry is not None:
                ts = geometry.stored_with(ts)
            if progress is not None:
                progress.stage("publish")
            version = await asyncio.to_thread(self.store.put, product, ts, expect_head=0)
            await self._load_shards(product)
        return version

    async def update(
        self,
        product: str,
        features: dict[str, np.ndarray],
        digests: list[str],
        progress: JobProgress | None = None,
        candidate: bool = False,
        aliases: list[str] | None = None,
    ) -> int:
        """Hot update with new good images' features (layer -> (n, C, H, W)); returns the new version.

        ``candidate``: stored as a candidate beside the head; the shards, which appended
        and re-selected in place, load the head again, so the head keeps serving unchanged.

        Images already in the head's bank (same content digest, or an ``aliases`` entry: the canvas
        digest older ``hetmm fit`` stored) are skipped and counted in the job's ``skipped_duplicates``;
        with nothing new the head stays as it is (idempotent retries).
        """
        async with self._lock(product):
            stored_head = await asyncio.to_thread(self.store.head, product)  # another writer may have moved it
            if product not in self.shards or stored_head != self.versions.get(product):
                await self._load_shards(product)
            base = await asyncio.to_thread(self.store.get, product, self.versions[product])
            shards = self.shards[product]
            if set(features) != set(shards):
                raise ValueError(f"{product}: features have layers {sorted(features)}, shards {sorted(shards)}")
            pipeline = self._pipeline(base.config, progress, shards)
            grown, keep = pipeline.grown(base, _features_to_bank(features), digests, aliases=aliases)
            if progress is not None:
                progress.note(skipped_duplicates=len(digests) - len(keep), added_images=len(keep))
            if grown is None:
                return self.versions[product]  # the head ``base`` was read at
            tc = grown.config.templates
            # sheets: auto is measured in a task, not on the shards: they load its selection from the store.
            auto = tc.kind != "all" and tc.sheets == "auto"
            try:
                await asyncio.gather(*(shards[k].append.remote(np.asarray(v)[keep]) for k, v in features.items()))
                calibrated = await asyncio.to_thread(pipeline.refit, grown)
                note_outliers(progress, calibrated)
                version = await asyncio.to_thread(
                    partial(self.store.put, candidate=candidate),
                    product,
                    calibrated,
                    expect_head=self.versions[product],
                )
            except BaseException:
                await self._load_shards(product)  # back to the old head everywhere
                raise
            if auto or candidate:  # a candidate: the shards go back to the head, which did not move
                await self._load_shards(product)
                if candidate:
                    await self._publish_candidate(product, version)
                return version
            await asyncio.gather(*(s.mark_published.remote(version) for s in shards.values()))
            await self._publish(product, version, calibrated)
        return version

    async def rollback(self, product: str, version: int) -> int:
        """Make a kept older version head again, in the store, the shards and the replicas."""
        async with self._lock(product):
            await asyncio.to_thread(self.store.rollback, product, version)
            await self._load_shards(product)
        return version

    # --- candidates --------------------------------------------------------------------------
    async def candidates(self, product: str) -> list[dict[str, Any]]:
        """The product's candidate versions (oldest first): version, the head it was built over,
        when, its threshold and estimated false-alarm rate. ProductNotFound for an unknown product."""
        out = []
        for v in await asyncio.to_thread(self.store.candidates, product):
            rec = await asyncio.to_thread(self.store.record, product, v)
            op = rec.operating_point()
            out.append(
                {
                    "version": v,
                    "parent": rec.parent,
                    "created": rec.created,
                    "images": rec.images,
                    "threshold": None if op is None else op.threshold,
                    "estimated_false_alarm_rate": None if op is None else op.false_alarm_rate,
                }
            )
        return out

    async def promote(self, product: str, version: int, expect_head: int | None = None) -> int:
        """Make candidate ``version`` head (``VersionedStore.promote``: a CAS, recorded) and publish it to
        the replicas: its shards already loaded on the template hosts become HEAD's (no store read);
        a candidate not fully held (never loaded, a host lost) is loaded from the store, as a rollback."""
        async with self._lock(product):
            await asyncio.to_thread(partial(self.store.promote, expect_head=expect_head), product, version)
            await self._load_shards(product)
        return version

    async def discard(self, product: str, version: int) -> int:
        """Drop candidate ``version`` (``VersionedStore.discard``) and free its shards on the template
        hosts; what is served does not change."""
        async with self._lock(product):
            await asyncio.to_thread(self.store.discard, product, version)
            if self._hosts is not None:
                self._hosts.drop_candidate(product, version)
        return version

    async def delete(self, product: str) -> None:
        """Remove a product from the store (every version) and stop serving it here."""
        check_product_name(product)
        async with self._lock(product):
            await asyncio.to_thread(self.store.delete_product, product)
            self._forget(product)

    def _forget(self, product: str) -> None:
        """Drop everything held for a product that is gone from the store; wake its subscribers."""
        if self.shards.pop(product, None) is not None or (
            self._hosts is not None and product in self._hosts.candidate_products()
        ):
            self.hosts.drop(product)
        self.published.pop(product, None)
        self.versions.pop(product, None)
        cond = self.changed.get(product)
        if cond is not None:

            async def wake() -> None:
                async with cond:
                    cond.notify_all()

            asyncio.get_running_loop().create_task(wake())

    async def wait_for_version(self, product: str, after: int, timeout: float = 30.0) -> int:
        """Long-poll: return as soon as the head differs from ``after`` (or at ``timeout``)."""
        cond = self._condition(product)
        async with cond:
            try:
                await asyncio.wait_for(cond.wait_for(lambda: self.versions.get(product, after) != after), timeout)
            except TimeoutError:
                pass
        return await self.head(product)

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
    return ProductRegistry.options(  # type: ignore[attr-defined]  # an ActorClass: Ray's stubs type @ray.remote(...) as the class
        name=registry_name(store_uri),
        namespace=namespace,
        get_if_exists=True,
        lifetime="detached" if detached else None,
        num_cpus=0.05,  # it waits on others' work: keep the CPUs for the tasks it starts
        max_restarts=-1,
        max_concurrency=64,
    ).remote(store_uri, placement)

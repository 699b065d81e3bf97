"""ProductRegistry: product -> head version and shards, one writer per product.

Shards are data on a bounded number of template hosts (hosts.py; issue 14): the
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

A tiled product (``geometry.tiles``, hetmm_ray/tiled.py) has one shard per (tile position,
layer), named by its bank key ``tile<p>/<layer>``; its create, hot update, region and labelled
calibration jobs run the in-process :class:`~hetmm_ray.tiled.TiledHETMM` in a task each and
publish like any other version (the shards reload from the store; after a hot update they append
the new frames' rows in place and take the task's selection instead, :meth:`ProductRegistry._adopted_in_place`);
the far rule at a new rate is refused (409).

Hot update, in order (docs/design.md): the shards append the new features and
re-select their tiny sets (PTS fanned out as tasks) -> the template set is
rebuilt from the shards and recalibrated -> published to the store with
``expect_head`` (data, then head) -> the registry bumps the version and wakes
subscribers. If any step fails, the shards are reloaded from the old head and
the error is raised: the old version keeps serving everywhere.

Candidates (issue 23) are loaded on the template hosts beside HEAD's shards (hosts.py: keyed by
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
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import ray
import torch

from ..config import TASK_CPUS, DetectorConfig, ServiceConfig, publishes_candidate
from ..core.templates import TemplateSet
from ..records import ProductDescription, ProductSnapshot, UnreadableProduct
from ..steps import FitSteps
from ..store import ProductNotFound, StoreConflict, StoreError, VersionRecord, check_product_name, open_store
from .hosts import HostPool
from .jobs import JobBoard, JobProgress
from .pts_fanout import pts_indices_ray
from .runtime import use_assigned_cpus
from .shard import ShardPlacement
from .steps import JobReport, service_steps
from .store_watch import follow_store

if TYPE_CHECKING:
    from ..fitting import FitPipeline

__all__ = ["REGISTRY_NAME", "ProductRegistry", "get_registry", "region_preview", "registry_name"]

logger = logging.getLogger(__name__)

REGISTRY_NAME = "hetmm-registry"
COMPARE_MAX_MAPS = 50  # flips whose two heat-maps a compare job's record carries (the rest: scores only)
COMPARE_MAP_SIZE = 512  # a tiled product's compare heat-maps: long side at most (a frame's map is large)


@ray.remote(num_cpus=TASK_CPUS)
def _labelled_calibration(
    store_uri: str, product: str, version: int, images: list[bytes], labels: list[int], objective: str, cap: float
) -> tuple[TemplateSet, dict[str, Any]]:
    """Score labelled images with ``version`` and choose its validation threshold (hetmm_ray.validation;
    a tiled product at the frame level, its frames at their own resolution)."""
    from ..data.decode import decode_image
    from ..detectors import load_detector
    from ..validation import calibrate_with_labels

    use_assigned_cpus()
    det = load_detector(open_store(store_uri), product, version)
    decoded = [decode_image(data) for data in images]
    return calibrate_with_labels(det, decoded, labels, objective=objective, max_false_alarm_rate=cap)


@ray.remote(num_cpus=TASK_CPUS)
def _compare_task(
    store_uri: str,
    product: str,
    candidate: int,
    base: int | None,
    images: list[tuple[str, bytes]],
    labels: list[int] | None,
    max_maps: int,
) -> dict[str, Any]:
    """``compare.compare_versions`` of ``candidate`` against ``base`` (None = HEAD) on encoded images,
    as JSON (flips' heat-maps as PNG data URLs, the first ``max_maps`` flips only; each side's map at
    most ``COMPARE_MAP_SIZE`` pixels long for a tiled product)."""
    from ..compare import as_json, compare_versions
    from ..data.decode import decode_image

    use_assigned_cpus()
    decoded = [(name, decode_image(data, source=name)) for name, data in images]
    result = compare_versions(
        open_store(store_uri), product, candidate, decoded, labels, base=base, map_size=COMPARE_MAP_SIZE
    )
    for flip in result["flips"][max_maps:]:
        flip.pop("heatmaps", None)
    return as_json(result)


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


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor for a shard call: bfloat16 (numpy has none) widened to float32, exact."""
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def _whole_frames(config: DetectorConfig) -> bool:
    """Whether a product's create, hot update and region jobs run as one detector in a task (the
    ``*_in_task`` functions), not on the sharded path. The one kind check of this module: a tiled
    product's tiles are cut from whole frames in one process, while a frame on one canvas is
    extracted as image-batch tasks across the cluster and grows its layer shards in place (its
    features never need the whole frame together)."""
    return config.geometry.tiled


def _fanned_out_pts() -> FitSteps:
    """A tiled job's steps: each position's PTS as pixel-chunk tasks of a full CPU each."""
    return FitSteps(pts=partial(pts_indices_ray, num_cpus=TASK_CPUS))


@ray.remote(num_cpus=TASK_CPUS)
def _fit_in_task(config: dict[str, Any], images: list[bytes], registry: Any, job_id: str | None) -> TemplateSet:
    """A product fit as one detector (``detectors.new_detector``) in one task on a full CPU: every
    frame decoded, its canvases (a tiled product's tiles of several frames together) through the
    backbone, each position's selection with PTS fanned out as pixel-chunk tasks. Before the long
    work it reports the layout, the sheets per position and the estimated ms per frame to the job."""
    from ..data.decode import decode_image
    from ..detectors import new_detector

    use_assigned_cpus()
    cfg = DetectorConfig.from_dict(config)
    frames = [decode_image(data) for data in images]
    det = new_detector(cfg, frames, steps=_fanned_out_pts())
    report = None if job_id is None else JobReport(registry, job_id)
    if report is not None:
        det.report_to(report)
        layout = det.layout(max(f.shape[0] for f in frames), max(f.shape[1] for f in frames))
        sheets = cfg.templates.sheets_of(len(frames))
        ms = det.estimate_ms_per_frame(frames[0], len(frames))
        facts = {
            "tiles": [layout.rows, layout.cols],
            "tile_px": [layout.tile_height, layout.tile_width],
            "sheets": sheets,
            "estimated_ms_per_frame": round(ms, 1),
        }
        ray.get(registry.job_note.remote(job_id, facts))
        report.stage(
            f"fit {layout.rows} x {layout.cols} tiles ({layout.tile_height} x {layout.tile_width} px), "
            f"{sheets} sheets{layout.per_tile}, about {ms:.0f} ms per frame",
            len(frames),
        )
    det.fit(frames)
    return det.template_set()


@ray.remote(num_cpus=TASK_CPUS)
def _update_in_task(store_uri: str, product: str, version: int, images: list[bytes]) -> tuple[TemplateSet | None, int]:
    """``Detector.update`` of ``product`` at ``version`` with encoded good frames, in a task (PTS fanned
    out): the new template set (None when every frame was already held) and how many frames it added."""
    from ..data.decode import decode_image
    from ..detectors import load_detector

    use_assigned_cpus()
    det = load_detector(open_store(store_uri), product, version, steps=_fanned_out_pts())
    det.update([decode_image(data) for data in images])
    added = len(images) - det.skipped_duplicates
    return (det.template_set() if added else None), added


@ray.remote(num_cpus=TASK_CPUS)
def _with_region_in_task(store_uri: str, product: str, version: int, region: dict[str, Any] | None) -> TemplateSet:
    """``product`` at ``version`` under another region (``Detector.with_region``: the templates kept,
    every position recalibrated under its part), in a task; unsaved."""
    from ..detectors import load_detector

    use_assigned_cpus()
    return load_detector(open_store(store_uri), product, version).with_region(region).template_set()


@ray.remote
class ProductRegistry:
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
        the service's (issue 23)."""
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
        """The store poll's part for candidates (issue 23): load the candidates of ``listed`` (HEAD's
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
        """Load candidate ``version``'s layers on the template hosts beside HEAD's (issue 23); with
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
        # a head that is a loaded candidate (promoted) takes its shards as they are (issue 23)
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
        from ..fitting import FitPipeline
        from ..scorer import Scorer

        me = ray.get_runtime_context().current_actor
        report = None if progress is None else JobReport(me, progress.job_id)
        return FitPipeline(Scorer(config), steps=service_steps(shards, report), report=progress)

    async def job_report(self, job_id: str, stage: str | None, done: int, total: int) -> None:
        """Progress of a job's work running in a task (``distributed.steps.JobReport``): a new stage, or counts."""
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
    ) -> int:
        """A new product from good images' features: select its tiny set, calibrate, publish v1."""
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

        ``candidate``: stored as a candidate beside the head (issue 23); the shards, which appended
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

    async def _update_via_task(
        self, product: str, images: list[bytes], progress: JobProgress, candidate: bool = False
    ) -> int:
        """Hot update as one detector in a task: ``Detector.update`` on the head
        (:func:`_update_in_task`: every position grown, re-selected and recalibrated), published with
        ``expect_head``; its (tile, layer) shards grow in place (:meth:`_adopted_in_place`), or load
        the new head from the store (a candidate: the shards keep the head). Frames already held
        are skipped (``skipped_duplicates``); with nothing new the head stays. A failure publishes nothing."""
        async with self._lock(product):
            head = await asyncio.to_thread(self.store.head, product)
            progress.stage("tile features, select and calibrate", len(images))
            progress.note(candidate=candidate)
            ts, added = await _update_in_task.remote(self.store_uri, product, head, images)
            progress.note(skipped_duplicates=len(images) - added, added_images=added)
            if ts is None:
                if product not in self.shards or self.versions.get(product) != head:
                    await self._load_shards(product)
                return head
            progress.stage("publish")
            version = await asyncio.to_thread(
                partial(self.store.put, candidate=candidate), product, ts, expect_head=head
            )
            if candidate:
                await self._publish_candidate(product, version)
            elif not await self._adopted_in_place(product, head, version, ts):
                await self._load_shards(product)
        return version

    async def _adopted_in_place(self, product: str, head: int, version: int, ts: TemplateSet) -> bool:
        """A tiled hot update's shards grown in place, as an untiled update's append: each (tile, layer)
        shard still holding ``head`` appends the new frames' rows of ``ts`` and takes its position's
        new selection (``LayerShard.adopt``), then ``version`` is published from them. False when the
        shards do not hold ``head`` (the caller loads the store's head); a failure part way loads it
        too (``version`` is already the store's head)."""
        shards = self.shards.get(product)
        if shards is None or self.versions.get(product) != head or set(shards) != set(ts.bank):
            return False
        try:
            held = dict(zip(ts.bank, await asyncio.gather(*(shards[k].info.remote() for k in ts.bank)), strict=True))
            if any(info["version"] != head or not 0 < info["images"] < ts.bank[k].shape[0] for k, info in held.items()):
                return False  # nothing changed yet
            calls = []
            for key, bank in ts.bank.items():
                selection = [None if part is None else _numpy(part[key]) for part in (ts.indices, ts.centres)]
                calls.append(shards[key].adopt.remote(_numpy(bank[held[key]["images"] :]), *selection))
            rows = await asyncio.gather(*calls)
            if any(int(r) != ts.bank[k].shape[0] for k, r in zip(ts.bank, rows, strict=True)):
                raise RuntimeError(f"{product}: a shard's rows do not match v{version} after the update")
            await asyncio.gather(*(s.mark_published.remote(version) for s in shards.values()))
            await self._publish(product, version, ts)
        except (ray.exceptions.RayError, RuntimeError, ValueError):  # e.g. a host lost under the update
            await self._load_shards(product)  # the store's head (this version): the truth
        return True

    async def rollback(self, product: str, version: int) -> int:
        """Make a kept older version head again, in the store, the shards and the replicas."""
        async with self._lock(product):
            await asyncio.to_thread(self.store.rollback, product, version)
            await self._load_shards(product)
        return version

    # --- candidates (issue 23) ---------------------------------------------------------------
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

    async def start_compare(
        self,
        product: str,
        version: int,
        images: list[tuple[str, bytes]],
        labels: list[int] | None = None,
        base: int | None = None,
    ) -> dict[str, Any]:
        """Score ``images`` with ``base`` (None = HEAD) and ``version`` side by side (compare.py), as a
        job (kind ``compare``) in a task; its record gets ``compare`` (flips, score shift, false-alarm
        rates, labelled recall) and its ``version`` is the candidate's. Nothing is published.
        ProductNotFound before any work for an unknown product or version."""
        await asyncio.to_thread(self.store.record, product, version)
        if base is not None:
            await asyncio.to_thread(self.store.record, product, base)

        async def work(progress: JobProgress) -> int:
            progress.stage("score with both versions", len(images))
            result = await _compare_task.remote(
                self.store_uri, product, version, base, images, labels, COMPARE_MAX_MAPS
            )
            progress.note(compare=result)
            return version

        return self.jobs.start("compare", product, work, done="compared")

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

    # --- jobs (the HTTP service's admin routes) -------------------------------------------
    async def _extract(
        self,
        config: DetectorConfig,
        images: list[bytes],
        progress: JobProgress,
        *,
        estimate: bool = False,
        canvas_digests: list[str] | None = None,
    ) -> Any:
        """Features of ``images`` as tasks; ``estimate``: the first task also measures the estimated ms
        per frame at the sheets the fit will keep (at most), noted in the job's record with them;
        ``canvas_digests``: filled with the images' canvas digests (``extract_features_ray``)."""
        from .extract import extract_features_ray

        progress.stage("features", len(images))
        sheets = config.templates.sheets_of(len(images))

        def note(ms: float) -> None:
            progress.note(sheets=sheets, estimated_ms_per_frame=round(ms, 1))

        return await asyncio.to_thread(
            partial(
                extract_features_ray,
                num_cpus=TASK_CPUS,
                progress=progress,
                estimate_sheets=sheets if estimate else None,
                on_estimate=note if estimate else None,
                canvas_digests=canvas_digests,
            ),
            config,
            images,
        )

    async def start_create(self, product: str, config: dict[str, Any], images: list[bytes]) -> dict[str, Any]:
        """Create ``product`` from encoded good images, as a job; returns the job record."""
        check_product_name(product)
        cfg = DetectorConfig.from_dict(config)
        if product in await asyncio.to_thread(self.store.products):
            raise StoreConflict(f"product {product!r} already exists; add images with .../normals")
        from ..tiled import resolve_tiles

        cfg = await asyncio.to_thread(resolve_tiles, cfg, images)  # tiles: auto -> a grid (1 x 1: untiled)
        if _whole_frames(cfg):
            return self.jobs.start("create", product, partial(self._create_in_task, product, cfg, images))

        async def work(progress: JobProgress) -> int:
            features, digests = await self._extract(cfg, images, progress, estimate=True)  # the cost, as tiled
            return await self.create(product, cfg.to_dict(), features, digests, progress)

        return self.jobs.start("create", product, work)

    async def _create_in_task(
        self, product: str, cfg: DetectorConfig, images: list[bytes], progress: JobProgress
    ) -> int:
        """A product fit as one detector in a task (:func:`_fit_in_task`), published as v1; its shards
        are its bank's objects ((tile position, layer) for a tiled one), placed over the template hosts."""
        progress.stage("tile features and fit", len(images))
        me = ray.get_runtime_context().current_actor
        ts = await _fit_in_task.remote(cfg.to_dict(), images, me, progress.job_id)
        async with self._lock(product):
            progress.stage("publish")
            version = await asyncio.to_thread(self.store.put, product, ts, expect_head=0)
            await self._load_shards(product)
        return version

    async def start_normals(self, product: str, images: list[bytes], publish: str | None = None) -> dict[str, Any]:
        """Hot-update ``product`` with encoded good images, as a job; returns the job record.
        ``publish``: ``live`` / ``candidate`` for this job (None: the product's, else the service's)."""
        version = await self.head(product)  # ProductNotFound before any work starts
        cfg = (await asyncio.to_thread(self.store.record, product, version)).config
        candidate = self._candidate(publish, cfg)
        if _whole_frames(cfg):
            return self.jobs.start(
                "normals", product, partial(self._update_via_task, product, images, candidate=candidate)
            )

        async def work(progress: JobProgress) -> int:
            canvas: list[str] = []  # a bank stored by an older hetmm fit holds these (data.decode.canvas_digest)
            features, digests = await self._extract(cfg, images, progress, canvas_digests=canvas)
            progress.stage("select and publish")
            progress.note(candidate=candidate)
            return await self.update(product, features, digests, progress, candidate=candidate, aliases=canvas)

        return self.jobs.start("normals", product, work)

    async def start_calibrate(
        self,
        product: str,
        images: list[bytes],
        labels: list[int],
        objective: str,
        max_false_alarm_rate: float,
        publish: str | None = None,
    ) -> dict[str, Any]:
        """Labelled validation of ``product``'s head (``hetmm calibrate``), as a job: scores the
        images, stores the chosen threshold as a new version and publishes it (or stores a candidate)."""
        version = await self.head(product)  # ProductNotFound before any work starts
        candidate = self._candidate(publish, (await asyncio.to_thread(self.store.record, product, version)).config)

        async def work(progress: JobProgress) -> int:
            progress.stage("score labelled images", len(images))
            ts, _record = await _labelled_calibration.remote(
                self.store_uri, product, version, images, labels, objective, max_false_alarm_rate
            )
            progress.stage("publish")
            progress.note(candidate=candidate)
            async with self._lock(product):
                new = await asyncio.to_thread(
                    partial(self.store.put, candidate=candidate), product, ts, expect_head=version
                )
                if candidate:
                    await self._publish_candidate(product, new)
                else:
                    await self._load_shards(product)
            return new

        return self.jobs.start("calibrate", product, work)

    async def _region_base(self, product: str, region: dict[str, Any] | None) -> tuple[int, DetectorConfig]:
        """The head version a region job starts from and its settings; ConfigError before any work
        for a region that counts no map pixel, and for a product on the ``validation`` rule (its
        labelled threshold was chosen under the old region)."""
        from ..core.region import check_region_change
        from ..detectors import check_region

        version = await self.head(product)  # ProductNotFound before any work starts
        cfg = (await asyncio.to_thread(self.store.record, product, version)).config
        check_region_change(cfg)
        check_region(replace(cfg, region=region))  # on the canvas's map, or on every tile's
        return version, cfg

    async def _under_region(
        self, product: str, version: int, region: dict[str, Any] | None, progress: JobProgress
    ) -> tuple[TemplateSet, TemplateSet]:
        """``version``'s template set, and the same set under ``region`` recalibrated (its out-of-fold
        scores count the region's pixels only): the one computation of a region job and its preview."""
        base = await asyncio.to_thread(self.store.get, product, version)
        if _whole_frames(base.config):  # every position recalibrated under its part (Detector.with_region)
            return base, await _with_region_in_task.remote(self.store_uri, product, version, region)
        ts = replace(base, config=replace(base.config, region=region))
        return base, await asyncio.to_thread(self._pipeline(ts.config, progress).calibrated, ts)

    async def start_region(
        self, product: str, region: dict[str, Any] | None, publish: str | None = None
    ) -> dict[str, Any]:
        """Give ``product`` another inspection region (``hetmm region``), as a job (kind ``region``):
        the head's bank and templates under the new region, recalibrated (its out-of-fold scores
        count the region's pixels only), stored as a new version and published. Refused before
        any work (ConfigError) for a region that counts no map pixel, and for a product on the
        ``validation`` rule (its labelled threshold was chosen under the old region)."""
        version, cfg = await self._region_base(product, region)
        candidate = self._candidate(publish, cfg)

        async def work(progress: JobProgress) -> int:
            progress.stage("calibrate under the region")
            progress.note(candidate=candidate)
            async with self._lock(product):
                _, calibrated = await self._under_region(product, version, region, progress)
                progress.stage("publish")
                new = await asyncio.to_thread(
                    partial(self.store.put, candidate=candidate), product, calibrated, expect_head=version
                )
                if candidate:
                    await self._publish_candidate(product, new)
                else:
                    await self._load_shards(product)
            return new

        return self.jobs.start("region", product, work)

    async def start_region_preview(self, product: str, region: dict[str, Any] | None) -> dict[str, Any]:
        """What :meth:`start_region` would publish, computed and published nowhere: a job (kind
        ``region_preview``) whose record gets ``preview`` (:func:`region_preview`: the head's
        threshold, estimated false-alarm rate and out-of-fold score quantiles beside those under
        ``region``); its ``version`` is the head it previewed, unchanged. The same refusals."""
        version, _ = await self._region_base(product, region)

        async def work(progress: JobProgress) -> int:
            progress.stage("calibrate under the region")
            base, proposed = await self._under_region(product, version, region, progress)
            progress.note(preview=region_preview(version, base, proposed))
            return version

        return self.jobs.start("region_preview", product, work, done="previewed")

    async def start_far_rule(self, product: str, false_alarm_rate: float, publish: str | None = None) -> dict[str, Any]:
        """Set ``product``'s threshold rule to ``far`` at ``false_alarm_rate`` as a new version (a job,
        kind ``calibrate``): the same bank, templates and out-of-fold scores, only the stored
        ``threshold`` settings change (``VersionedStore.republish``), then published to the replicas.
        A tiled product keeps its stored tile scales: the rate moves its frame threshold only, on the
        frame calibration (hetmm_ray/tiled.py, "One verdict per frame")."""
        version = await self.head(product)  # ProductNotFound before any work starts
        rec = await asyncio.to_thread(self.store.record, product, version)
        config = rec.under_far_rule(false_alarm_rate)  # TemplateError, ConfigError before any work
        candidate = self._candidate(publish, rec.config)

        async def work(progress: JobProgress) -> int:
            progress.stage("publish")
            progress.note(candidate=candidate)
            async with self._lock(product):
                new = await asyncio.to_thread(
                    partial(self.store.republish, candidate=candidate), product, config=config, expect_head=version
                )
                if candidate:
                    await self._publish_candidate(product, new)
                else:
                    await self._load_shards(product)
            return new

        return self.jobs.start("calibrate", product, work)

    async def job(self, job_id: str, wait: float = 0.0) -> dict[str, Any] | None:
        """A job's record; ``wait`` seconds to let it finish first."""
        return await self.jobs.wait(job_id, wait) if wait > 0 else self.jobs.get(job_id)


def _side(ts: TemplateSet) -> dict[str, Any]:
    """One side of a region preview: the region, the threshold in force under the stored rule, its
    estimated false-alarm rate, and the out-of-fold scores with their min / median / p90 / max
    (``numpy.quantile``, linear interpolation)."""
    from ..core.scoring import operating_point

    cal = ts.calibration
    op = operating_point(cal, ts.config)
    scores = [] if cal is None else [float(x) for x in cal.scores]
    q = np.quantile(np.asarray(scores, dtype=np.float64), [0.0, 0.5, 0.9, 1.0]).tolist() if scores else [None] * 4
    return {
        "region": ts.config.region,
        "threshold": None if op is None else op.threshold,
        "threshold_rule": None if op is None else op.rule,
        "estimated_false_alarm_rate": None if op is None else op.false_alarm_rate,
        "oof_scores": scores,
        "quantiles": dict(zip(("min", "median", "p90", "max"), q, strict=True)),
    }


def region_preview(version: int, current: TemplateSet, proposed: TemplateSet) -> dict[str, Any]:
    """A region preview's answer: ``version`` (the head previewed), ``current`` and ``proposed``
    (:func:`_side` of the head as stored, and of it under the proposed region, recalibrated)."""
    return {"version": int(version), "current": _side(current), "proposed": _side(proposed)}


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

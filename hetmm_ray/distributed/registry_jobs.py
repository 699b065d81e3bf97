"""The registry's job starters (``distributed/registry.py``): what the HTTP service's admin routes
start, each checked before any work (ProductNotFound, ConfigError, StoreConflict) and then run as a
job (``jobs.JobBoard``: a record with its stage, counts and notes) whose long work runs in tasks
(``registry_tasks.py``) and whose result the registry publishes (live, or as a candidate).

:class:`JobStarters` is a part of :class:`~hetmm_ray.distributed.registry.ProductRegistry` (the
actor class inherits it): it uses the actor's store, locks, shards and publishing, and adds no
state of its own. :func:`region_preview` is plain data (a region preview's answer).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import ray
import torch

from ..config import TASK_CPUS, DetectorConfig
from ..core.templates import TemplateSet
from ..store import StoreConflict, check_product_name
from .jobs import JobProgress
from .position_fit import fit_tiles_ray, tiles_fitted, tiles_updated, update_tiles_ray
from .registry_tasks import (
    compare_task,
    fit_line,
    labelled_calibration,
    whole_frames,
    with_region_in_task,
)

if TYPE_CHECKING:
    from ..detection.fitting import FitPipeline
    from ..detection.geometry_rule import GeometryChoice
    from ..detection.interface import Layout
    from ..store.manifest import VersionRecord
    from ..store.protocol import Store
    from .extract import TileBatches

__all__ = ["COMPARE_MAX_MAPS", "JobStarters", "region_preview"]

COMPARE_MAX_MAPS = 50  # flips whose two heat-maps a compare job's record carries (the rest: scores only)


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor for a shard call: bfloat16 (numpy has none) widened to float32, exact."""
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


class JobStarters:
    """The admin routes' jobs (module docstring); mixed into the registry actor."""

    store: Store
    store_uri: str
    jobs: Any
    shards: dict[str, Any]
    versions: dict[str, int]

    if TYPE_CHECKING:  # the registry's own members these jobs call (distributed/registry.py)

        def _lock(self, product: str) -> asyncio.Lock: ...

        def _candidate(self, publish: str | None, config: DetectorConfig) -> bool: ...

        def _pipeline(
            self, config: DetectorConfig, progress: JobProgress | None, shards: dict[str, Any] | None = None
        ) -> FitPipeline: ...

        async def head(self, product: str) -> int: ...

        async def _load_shards(self, product: str) -> int: ...

        async def _publish(self, product: str, version: int, source: TemplateSet | VersionRecord) -> None: ...

        async def _publish_candidate(self, product: str, version: int) -> None: ...

        async def create(
            self,
            product: str,
            config: dict[str, Any],
            features: dict[str, np.ndarray],
            digests: list[str],
            progress: JobProgress | None = None,
            *,
            geometry: GeometryChoice | None = None,
        ) -> int: ...

        async def update(
            self,
            product: str,
            features: dict[str, np.ndarray],
            digests: list[str],
            progress: JobProgress | None = None,
            candidate: bool = False,
            aliases: list[str] | None = None,
        ) -> int: ...

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
        from ..detection.geometry_rule import choose_geometry

        # The fit's one rule (tiles auto, min_defect_px -> a grid; 1 x 1: untiled), and why for the job's
        # record and the version's manifest (GeometryChoice.stored_with)
        choice = await asyncio.to_thread(choose_geometry, cfg, images)
        cfg = choice.config
        chosen = choice.to_json()
        note = {} if chosen is None else {"tiles_auto": chosen}
        if whole_frames(cfg):
            return self.jobs.start("create", product, partial(self._create_tiled, product, choice, images, note))

        async def work(progress: JobProgress) -> int:
            progress.note(**note)
            features, digests = await self._extract(cfg, images, progress, estimate=True)  # the cost, as tiled
            return await self.create(product, cfg.to_dict(), features, digests, progress, geometry=choice)

        return self.jobs.start("create", product, work)

    async def _tile_batches(
        self, config: DetectorConfig, images: list[bytes], progress: JobProgress, *, estimate: bool = False
    ) -> tuple[TileBatches, str | None]:
        """A tiled product's tile features of ``images`` as frame-batch tasks over the cluster
        (``extract.extract_tiles_ray``; the job's ``features`` stage counts frames as batches finish),
        left in the object store for the fit task. ``estimate``: the first task also measures the
        estimated ms per frame and the layout of the largest frame (its size from the headers),
        noted in the job's record (``tiles``, ``tile_px``, ``sheets``, ``estimated_ms_per_frame``);
        returns the fit stage's line then (:func:`~.registry_tasks.fit_line`), else None."""
        from ..detection.geometry_rule import frame_shape
        from .extract import extract_tiles_ray

        progress.stage("features", len(images))
        sheets = config.templates.sheets_of(len(images))
        line: list[str] = []

        def note(ms: float, layout: Layout) -> None:
            progress.note(
                tiles=[layout.rows, layout.cols],
                tile_px=[layout.tile_height, layout.tile_width],
                sheets=sheets,
                estimated_ms_per_frame=round(ms, 1),
            )
            line.append(fit_line(layout, sheets, ms))

        largest = None
        if estimate:
            shapes = await asyncio.to_thread(lambda: [frame_shape(x) for x in images])  # headers only
            largest = (max(h for h, _ in shapes), max(w for _, w in shapes))
        batches = await asyncio.to_thread(
            partial(
                extract_tiles_ray,
                num_cpus=TASK_CPUS,
                progress=progress,
                estimate_for=largest,
                on_estimate=note if estimate else None,
            ),
            config,
            images,
        )
        return batches, (line[0] if line else None)

    async def _create_tiled(
        self, product: str, choice: GeometryChoice, images: list[bytes], note: dict[str, Any], progress: JobProgress
    ) -> int:
        """A tiled product's create: its frames' tile features as frame-batch tasks across the cluster
        (:meth:`_tile_batches`), then each position fit from them in a task of its own
        and its calibration's fold ranges in tasks too (:func:`~.position_fit.fit_tiles_ray`), joined and
        published as v1; its shards are
        its (tile position, layer) objects, placed over the template hosts."""
        progress.note(**note)
        cfg = choice.config
        batches, line = await self._tile_batches(cfg, images, progress, estimate=True)
        progress.stage(line or "fit", len(images))
        me = ray.get_runtime_context().current_actor
        fits = fit_tiles_ray(cfg, batches, images[0], me, progress.job_id)
        results = await asyncio.to_thread(fits.results)
        del batches, fits  # the features' and positions' objects are freed here, not after the publish
        ts = choice.stored_with(await asyncio.to_thread(tiles_fitted, cfg, results))
        note_outliers(progress, ts)
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
        if whole_frames(cfg):
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
            ts, _record = await labelled_calibration.remote(
                self.store_uri, product, version, images, labels, objective, max_false_alarm_rate
            )
            progress.stage("publish")
            progress.note(candidate=candidate)
            async with self._lock(product):
                return await self._stored(product, partial(self.store.put, product, ts), version, candidate)

        return self.jobs.start("calibrate", product, work)

    async def _stored(self, product: str, write: Any, head: int, candidate: bool) -> int:
        """The one publish of a job's new version (held under the product's lock): ``write(expect_head=,
        candidate=)`` stores it (StoreConflict if another writer moved the head), then a candidate is
        loaded beside HEAD on the template hosts, or the shards load the new HEAD and replicas get it."""
        new = int(await asyncio.to_thread(write, expect_head=head, candidate=candidate))
        if candidate:
            await self._publish_candidate(product, new)
        else:
            await self._load_shards(product)
        return new

    async def _region_base(self, product: str, region: dict[str, Any] | None) -> tuple[int, DetectorConfig]:
        """The head version a region job starts from and its settings; ConfigError before any work
        for a region that counts no map pixel, and for a product on the ``validation`` rule (its
        labelled threshold was chosen under the old region)."""
        from ..core.region import check_region_change
        from ..detection.detector_choice import check_region

        version = await self.head(product)  # ProductNotFound before any work starts
        cfg = (await asyncio.to_thread(self.store.record, product, version)).config
        check_region_change(cfg)
        check_region(replace(cfg, region=region))  # on the canvas's map, or on every tile's
        return version, cfg

    async def _under_region(
        self, product: str, version: int, region: dict[str, Any] | None
    ) -> tuple[TemplateSet, TemplateSet]:
        """``version``'s template set, and the same set under ``region`` recalibrated (its out-of-fold
        scores count the region's pixels only): the one computation of a region job and its preview,
        ``Detector.with_region`` in a task (what ``hetmm region`` runs), whichever the product's kind."""
        base = await asyncio.to_thread(self.store.get, product, version)
        return base, await with_region_in_task.remote(self.store_uri, product, version, region)

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
                _, calibrated = await self._under_region(product, version, region)
                progress.stage("publish")
                return await self._stored(product, partial(self.store.put, product, calibrated), version, candidate)

        return self.jobs.start("region", product, work)

    async def start_region_preview(self, product: str, region: dict[str, Any] | None) -> dict[str, Any]:
        """What :meth:`start_region` would publish, computed and published nowhere: a job (kind
        ``region_preview``) whose record gets ``preview`` (:func:`region_preview`: the head's
        threshold, estimated false-alarm rate and out-of-fold score quantiles beside those under
        ``region``); its ``version`` is the head it previewed, unchanged. The same refusals."""
        version, _ = await self._region_base(product, region)

        async def work(progress: JobProgress) -> int:
            progress.stage("calibrate under the region")
            base, proposed = await self._under_region(product, version, region)
            progress.note(preview=region_preview(version, base, proposed))
            return version

        return self.jobs.start("region_preview", product, work, done="previewed")

    async def start_far_rule(self, product: str, false_alarm_rate: float, publish: str | None = None) -> dict[str, Any]:
        """Set ``product``'s threshold rule to ``far`` at ``false_alarm_rate`` as a new version (a job,
        kind ``calibrate``): the same bank, templates and out-of-fold scores, only the stored
        ``threshold`` settings change (``VersionedStore.republish``), then published to the replicas.
        A tiled product keeps its stored tile scales: the rate moves its frame threshold only, on the
        frame calibration (hetmm_ray/detection/tiled.py, "One verdict per frame")."""
        version = await self.head(product)  # ProductNotFound before any work starts
        rec = await asyncio.to_thread(self.store.record, product, version)
        config = rec.under_far_rule(false_alarm_rate)  # TemplateError, ConfigError before any work
        candidate = self._candidate(publish, rec.config)

        async def work(progress: JobProgress) -> int:
            progress.stage("publish")
            progress.note(candidate=candidate)
            async with self._lock(product):
                write = partial(self.store.republish, product, config=config)
                return await self._stored(product, write, version, candidate)

        return self.jobs.start("calibrate", product, work)

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
            result = await compare_task.remote(self.store_uri, product, version, base, images, labels, COMPARE_MAX_MAPS)
            progress.note(compare=result)
            return version

        return self.jobs.start("compare", product, work, done="compared")

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

    async def _update_via_task(
        self, product: str, images: list[bytes], progress: JobProgress, candidate: bool = False
    ) -> int:
        """A tiled product's hot update: the new frames' tile features as frame-batch tasks across the
        cluster (:meth:`_tile_batches`, the head's settings), then each position of the head grown,
        re-selected and recalibrated in tasks of its own (:func:`~.position_fit.update_tiles_ray`),
        joined and published with ``expect_head``; its (tile, layer) shards grow
        in place (:meth:`_adopted_in_place`), or load the new head from the store (a candidate: the
        shards keep the head). Frames already held are skipped (``skipped_duplicates``); with nothing
        new the head stays. A failure publishes nothing."""
        async with self._lock(product):
            head = await asyncio.to_thread(self.store.head, product)
            base = await asyncio.to_thread(self.store.get, product, head)
            progress.note(candidate=candidate)
            batches, _ = await self._tile_batches(base.config, images, progress)
            progress.stage("select and calibrate", len(images))
            fits = update_tiles_ray(base, batches, images)
            results = await asyncio.to_thread(fits.results)
            del batches, fits  # the features' and positions' objects are freed here, not after the publish
            ts, added = await asyncio.to_thread(tiles_updated, base, results)
            progress.note(skipped_duplicates=len(images) - added, added_images=added)
            if ts is None:
                if product not in self.shards or self.versions.get(product) != head:
                    await self._load_shards(product)
                return head
            note_outliers(progress, ts)
            progress.stage("publish")
            version = await asyncio.to_thread(
                partial(self.store.put, candidate=candidate), product, ts, expect_head=head
            )
            if candidate:
                await self._publish_candidate(product, version)
            elif not await self._adopted_in_place(product, head, version, ts):
                await self._load_shards(product)
        return version


def note_outliers(progress: JobProgress | None, ts: TemplateSet) -> None:
    """The job record's ``outliers``: the good frames of ``ts``'s bank standing apart (bank index,
    digest, out-of-fold score; ``core/good_outliers.py``) and its threshold with and without them.
    Named only, never dropped: dropping is its own command (``hetmm drop``, ``operations.drop``)."""
    from ..config import OUTLIER_MADS
    from ..core.good_outliers import outlier_report

    if progress is None or ts.calibration is None:
        return
    try:
        report = outlier_report(ts.calibration, ts.config, ts.image_digests, mads=OUTLIER_MADS)
    except ValueError:  # scores not of this bank's fold plan: nothing to name them by
        return
    progress.note(outliers=report.to_json())


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

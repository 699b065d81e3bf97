"""The detector deployment: backbone + ATMM replicas, multiplexed by product.

Each replica keeps the tiny sets of up to ``max_products_per_replica``
products (``@serve.multiplexed``: Serve routes a product's requests to the
replicas that hold it and evicts the least recently used). Requests for one
product are batched greedily (``serve/greedy.py``: an idle replica starts at once, a busy
one takes everything that queued meanwhile; batches never mix products). One batch runs at a
time, split by ``predict`` among single-threaded workers (a batcher worker per core is not used:
replicas then hung inside OpenVINO's infer; docs/performance.md). Before
each batch the replica asks the registry for the product's head version and
swaps to it if it moved, so template versions change only between batches, a
response is scored by exactly one version, and no client sees a version older
than one it has already seen.

A hot product arrives under several model ids (its own and aliases, serve/warm_set.py)
so that Serve spreads it over replicas; a replica keeps one detector per product
whichever of its ids it was loaded under.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch
from PIL import Image
from ray import serve

from ..config import BackboneConfig, ReplicaSettings
from ..core.backbone import Backbone
from ..core.templates import TemplateError
from ..detection.detector_choice import serving_detector
from ..detection.interface import Detector as ProductDetector
from ..distributed.registry import get_registry
from ..distributed.runtime import use_assigned_cpus
from ..messages import ProductSnapshot
from ..result import result_records, review_threshold_of
from ..visualize import draw_overlay, heatmap_range
from .autoscaling import IMAGES_IN_FLIGHT
from .greedy import GreedyBatcher
from .warm_set import product_of

__all__ = ["Detector", "ScoreRequest"]


@dataclass(frozen=True)
class ScoreRequest:
    """One HTTP request's decoded images; scored together by one template version."""

    images: list[np.ndarray]
    want_maps: bool = False
    enqueued: float = 0.0
    map_size: int | None = None  # the heat-map's long side (None: the map's own size)


class ProductModel:
    """A product's current detector on this replica; swapped whole when the head moves."""

    def __init__(self, product: str) -> None:
        self.product = product
        self.detector: ProductDetector | None = None
        self.version = -1
        self.swap_lock = asyncio.Lock()
        self.review: tuple[int, float | None] | None = None  # (version, its review threshold: core/review.py)

    def review_threshold(self) -> float | None:
        """The review band's lower threshold of the current version (None: no band), computed once per version."""
        if self.review is None or self.review[0] != self.version:
            assert self.detector is not None
            self.review = (self.version, review_threshold_of(self.detector))
        return self.review[1]


def _replica_id() -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - outside a replica (direct construction in a test)
        return "local"


def _encode_png(image: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _sized(image: np.ndarray, map_size: int | None) -> np.ndarray:
    """The heat-map's picture with its long side at most ``map_size`` (the aspect kept, bilinear; never
    enlarged); unchanged without one. ``draw_overlay`` then draws the map and region at its size."""
    h, w = image.shape[:2]
    if map_size is None or map_size >= max(h, w):
        return image
    f = map_size / max(h, w)
    size = (max(1, round(w * f)), max(1, round(h * f)))  # PIL: (width, height)
    return image if size == (w, h) else np.asarray(Image.fromarray(image).resize(size, Image.Resampling.BILINEAR))


@serve.deployment(name="Detector", ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=32)
class Detector:
    def __init__(self, store: str, max_products_per_replica: int = 4) -> None:
        self.registry = get_registry(store, detached=True)
        self.settings = ReplicaSettings()
        self._backbones: dict[BackboneConfig, Backbone] = {}
        self._device = "cuda" if torch.cuda.is_available() else "cpu"
        self._fatal: BaseException | None = None
        self._set_threads(0)
        # One detector per product, shared by its model ids (aliases) that Serve's LRU holds here.
        self._by_product: weakref.WeakValueDictionary[str, ProductModel] = weakref.WeakValueDictionary()
        self._replica = _replica_id()
        self._images_in_flight = 0  # images of requests here, queued or scoring (record_autoscaling_stats)
        # The one place batching is set up: its settings come from ReplicaSettings (user_config).
        self._batcher: GreedyBatcher[ScoreRequest] = GreedyBatcher(
            self._score_batch,
            max_batch_size=self.settings.max_batch_size,
            wait_s=self.settings.batch_wait_timeout_s,
        )

        async def load(model_id: str) -> ProductModel:
            product = product_of(model_id)
            model = self._by_product.get(product)
            if model is None:
                model = self._by_product[product] = ProductModel(product)
            await self.swap(model, await self.registry.head.remote(product))
            return model

        # Multiplexing is set up per instance so the LRU size comes from the application's args.
        self.product_model = serve.multiplexed(max_num_models_per_replica=max_products_per_replica)(load)

    # --- live settings and health ---------------------------------------------------------
    def reconfigure(self, user_config: dict[str, Any] | None) -> None:
        settings = ReplicaSettings.from_dict(user_config or {})
        self._batcher.configure(max_batch_size=settings.max_batch_size, wait_s=settings.batch_wait_timeout_s)
        self._set_threads(settings.threads)
        self.settings = settings

    def _set_threads(self, threads: int) -> None:
        use_assigned_cpus(threads)  # Ray sets OMP_NUM_THREADS=1 in workers: the CPUs this replica was given

    def check_health(self) -> None:
        if self._fatal is not None:  # e.g. a CUDA error: let Serve replace this replica
            raise RuntimeError(f"replica unhealthy: {self._fatal}")

    # --- template versions --------------------------------------------------------------------
    def _backbone(self, config: BackboneConfig) -> Backbone:
        if config not in self._backbones:
            self._backbones[config] = Backbone(config).to(self._device)
        return self._backbones[config]

    def _build(self, snapshot: ProductSnapshot) -> ProductDetector:
        """A detector scoring against a published tiny set (never the full bank); a tiled product's
        from its (tile position, layer) tiny sets (``detector_choice.serving_detector``)."""
        config = snapshot.config.replace(device=self._device)
        tiny = {
            k: torch.from_numpy(np.array(v))
            for k, v in zip(snapshot.tiny, ray.get(list(snapshot.tiny.values())), strict=True)
        }
        try:
            return serving_detector(
                config,
                tiny,
                tiles=snapshot.tiles,
                weights_id=snapshot.weights_id,
                calibration=snapshot.calibration,
                version=snapshot.version,
                backbone=self._backbone(config.backbone),
            )
        except TemplateError as exc:
            raise TemplateError(f"product {snapshot.product!r} {exc}") from None

    async def swap(self, model: ProductModel, head: int) -> None:
        """``model`` at version ``head``: the registry's snapshot, its tiny set from the object store, the
        serving detector built (a product's cold load; timed by ``benchmarks/bench_cluster.py replicas``)."""
        async with model.swap_lock:
            if model.version == head:
                return
            snapshot: ProductSnapshot = await self.registry.snapshot.remote(model.product)
            model.detector = await asyncio.to_thread(self._build, snapshot)
            model.version = snapshot.version

    # --- scoring ------------------------------------------------------------------------------
    async def predict(
        self, images: list[np.ndarray], want_maps: bool = False, map_size: int | None = None
    ) -> list[dict[str, Any]]:
        """Score one request's images (all by the same template version); ``map_size``: the heat-maps'
        long side at most, in pixels (None: the canvas view, or a tiled product's frame resolution)."""
        model_id = serve.get_multiplexed_model_id()  # the product, or one of its warm-set aliases
        return await self.score(model_id, ScoreRequest(images, want_maps, time.perf_counter(), map_size))

    async def score(self, model_id: str, request: ScoreRequest) -> list[dict[str, Any]]:
        """``request`` scored in a greedy batch of ``model_id``; its images count as in flight meanwhile."""
        self._images_in_flight += len(request.images)
        try:
            return await self._batcher.submit(model_id, request, len(request.images))
        finally:
            self._images_in_flight -= len(request.images)

    def record_autoscaling_stats(self) -> dict[str, float]:
        """The replica's load for the autoscaling policy (serve/autoscaling.py): images, not requests."""
        return {IMAGES_IN_FLIGHT: float(self._images_in_flight)}

    async def _score_batch(self, model_id: str, requests: list[ScoreRequest]) -> list[list[dict[str, Any]]]:
        """Score one greedy batch of a model id's requests (all by the same template version)."""
        product = product_of(model_id)
        model = await self.product_model(model_id)
        head = await self.registry.head.remote(product)
        if head != model.version:
            await self.swap(model, head)
        detector = model.detector
        assert detector is not None
        images = [im for r in requests for im in r.images]
        started = time.perf_counter()
        try:
            pred = await asyncio.to_thread(
                detector.predict,
                images,
                sigmas=self.settings.sigmas,
                false_alarm_rate=self.settings.false_alarm_rate,
            )
        except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
            if "CUDA" in str(exc):
                self._fatal = exc
            raise
        score_ms = 1000 * (time.perf_counter() - started)
        # the one result record (hetmm_ray/result.py), with the review band of the version
        records = result_records(pred, review_threshold=model.review_threshold())
        out, i = [], 0
        for r in requests:
            results = []
            for image in r.images:
                result: dict[str, Any] = {
                    **records[i],
                    "version": model.version,
                    "timing": {
                        "queue_ms": round(1000 * (started - r.enqueued), 3),
                        "score_ms": round(score_ms, 3),
                        "batch_images": len(images),
                        "batch_requests": len(requests),
                        "replica": self._replica,  # which replica scored it (the warm set's spread)
                    },
                }
                if r.want_maps:
                    # At the backbone's view of the image: squashed square, or the aspect kept; a tiled
                    # product's stitched map is at the frame's own resolution (hetmm_ray/detection/tiled.py).
                    shown = detector.input_view(image)
                    vmin, vmax = heatmap_range(pred.maps[i], pred.threshold)  # the version's fixed scale
                    region = None if pred.regions is None else pred.regions[i]  # outside: greyed
                    shown = _sized(shown, r.map_size)
                    overlay = draw_overlay(shown, pred.maps[i], threshold=pred.threshold, region=region)
                    result["heatmap_png"] = _encode_png(overlay)
                    result["heatmap_scale"] = {"vmin": vmin, "vmax": vmax}
                results.append(result)
                i += 1
            out.append(results)
        return out

"""The HTTP ingress: validation, decoding, auth and errors in front of the detector replicas.

Every client mistake is a 4xx with ``{"error": {"code", "message"}}``; sizes
are checked before bodies are read and images are checked before they are
decoded (``data/decode.py``). Predictions go to the ``Detector`` deployment
with the product as the multiplexed model id; admin work (create, normals,
rollback, jobs) goes to the product registry.

One way to add a route: a method of :class:`Ingress` under ``@app.<method>(path)`` and
``@timed(name)`` (timing, metrics, the JSON error of any exception). The console's routes
(serve/ui.py) are such methods too: each checks the request and calls the
:class:`~hetmm_ray.serve.ui.Console` the ingress holds. A refusal is an
:class:`~hetmm_ray.errors.Refused`; every error is answered through ``errors.describe``,
a failed job's included (:func:`job_answer`).
"""

# No `from __future__ import annotations`: FastAPI must see real types on the routes
# that Serve re-wraps, or it takes `request: Request` for a query parameter.
import asyncio
import hmac
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.responses import Response
from ray import serve
from ray.exceptions import RayActorError

from ..config import (
    SERVE_BY_VALUE_MAX_BYTES,
    ServiceConfig,
    merge_product_config,
)
from ..core.calibration import check_rate
from ..data.raw_frame import RawFrame
from ..data.region_file import region_from_json
from ..detection.pipeline import keep_memory_mapped
from ..distributed.registry import get_registry
from ..errors import Refused
from ..store import StoreError, check_product_name, open_store
from . import bodies
from .answers import answer_errors, classify, error_response, job_answer, timed
from .canvas import CanvasCache, decode_to_canvas
from .grpc.messages import Observed
from .grpc.standin import InspectionStandIn
from .image_sets import ImageSet, ImageSets
from .metrics import CONTENT_TYPE_LATEST, ServiceMetrics
from .security import CrossOriginGuard, JSONResponse, parse_json_object, refuse_open_bind
from .stations import StationBoard
from .ui import Console
from .warm_set import WarmSet, product_of

__all__ = ["Ingress", "app"]

logger = logging.getLogger("ray.serve")


def _serving_origins() -> tuple[str, ...]:
    """The origin policy of the ingress this process serves (its ServiceConfig's ``allowed_origins``)."""
    ingress: Any = serve.get_replica_context().servable_object  # this replica's Ingress
    return ingress.service.allowed_origins


app = FastAPI(title="hetmm-ray", summary="Training-free visual anomaly detection (HETMM) over HTTP")
app.add_middleware(CrossOriginGuard, allowed=_serving_origins)


answer_errors(app)  # every error as the JSON error shape (serve/answers.py)


def _raw_frames_as_png(predictions: list[Observed]) -> list[Observed]:
    """``predictions`` with every raw frame as the lossless PNG the console and the record keep."""
    return [
        (product, [(name, d.to_png(name) if isinstance(d, RawFrame) else d) for name, d in uploads], results)
        for product, uploads, results in predictions
    ]


MAP_SIZE_MAX = 8192  # ?map_size: a heat-map's long side at most (never enlarged, serve/replica.py)


# Serve captures this module's globals when the class below is decorated: every helper
# the routes use must be defined above this line.
# max_ongoing_requests: a request holds its slot while its body arrives, so slow clients must not
# be able to take every slot (bodies time out after ServiceConfig.body_timeout_s).
@serve.deployment(name="Ingress", ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=1024)
@serve.ingress(app)
class Ingress(InspectionStandIn):  # gRPC calls that reach it are refused clearly (serve/grpc/standin.py)
    def __init__(self, detector: Any, service: dict[str, Any]) -> None:
        self.service = ServiceConfig.from_dict(service)
        self.token = os.environ.get(self.service.admin_token_env) or None
        if self.service.http_host is not None:  # the bind, as the application was started with it
            refuse_open_bind(self.service.http_host, self.token, self.service.admin_token_env)
        else:
            logger.warning("ingress: the HTTP bind is not known (args.http_host unset); open-bind check skipped")
        # Images go to the detector by value over gRPC, not by object reference through the object
        # store: a third less CPU per request (benchmarks/bench_serve.py floor). Set on the handle, as
        # the process that built the application may have read Serve's default before
        # config.SERVE_ENVIRONMENT was applied (that setting covers the proxy's hop to this replica).
        self.detector = detector.options(_by_reference=False)
        # ... except a call whose images exceed what a replica's gRPC server takes (a tiled product's
        # whole frames): those go through the object store (config.SERVE_BY_VALUE_MAX_BYTES).
        self.detector_by_reference = detector.options(_by_reference=True)
        self.registry = get_registry(self.service.store, detached=True)
        self.registry.set_poll.remote(self.service.store_poll_s)  # follow other writers of the store
        self.registry.set_hosts.remote(self.service.template_hosts)  # template host processes
        self.registry.set_publish.remote(self.service.publish)  # live | candidate when a product names none
        # A hot product spreads over several replicas (serve/warm_set.py).
        self.warm = WarmSet(
            hot_inflight=self.service.hot_product_inflight,
            spread=self.service.hot_product_spread,
            rotate_s=self.service.hot_product_rotate_s,
        )
        self.metrics = ServiceMetrics()
        self.limit = self.service.max_body_mib * 2**20
        # Bodies, their parts and decoded frames are blocks of megabytes: by default glibc maps each from
        # the kernel and hands it back when freed, a page fault per 4 KiB the next time (every decoded
        # frame and joined body: a large share of the ingress's CPU per image). Freed
        # memory of up to four bodies stays mapped and is reused instead, as the detector does for its
        # batches (pipeline.keep_memory_mapped; process-wide).
        keep_memory_mapped(4 * self.service.max_body_mib)
        self._known: dict[str, float] = {}  # product -> until when its existence is cached
        self._handles: dict[tuple[str, bool], Any] = {}  # (model id, by reference) -> predict (_predict_handle)
        # the canvas each product's replica needs: uploads are resized here (serve/canvas.py)
        self._canvas = CanvasCache(lambda p: self.registry.snapshot.remote(p), self.service.store_poll_s)
        # the console's state and answers (serve/ui.py): the recent-predictions ring, the labelled set
        self.console = Console(
            self.service,
            registry=self.registry,
            detector=self.detector,
            store=open_store(self.service.store),
            detector_by_reference=self.detector_by_reference,
            metrics=self.metrics,  # the drift alarms' gauges (serve/inspections.py)
        )
        self.image_sets = ImageSets(self.service, self.console)  # every route's image set (serve/image_sets.py)
        self.stations = StationBoard()  # what each station of the lines last reported (serve/stations.py)

    # --- plumbing -------------------------------------------------------------------------------
    async def _timed(self, request: Request, route: str, handler: Callable[[], Awaitable[Response]]) -> Response:
        start = time.perf_counter()
        try:
            response = await handler()
        except Exception as exc:  # every failure becomes a JSON error with a status
            err = classify(exc)
            if err.status >= 500 and err.status != 499:
                logger.error("%s %s failed", request.method, request.url.path, exc_info=exc)
            response = error_response(err)
        self.metrics.observe_request(route, response.status_code, time.perf_counter() - start)
        return response

    def _admin(self, request: Request) -> None:
        if self.token is None:
            return  # loopback-only server without a token (checked at start-up)
        header = request.headers.get("authorization", "")
        if not header:
            raise Refused(401, "unauthorized", "admin route: send 'Authorization: Bearer <token>'")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            raise Refused(403, "forbidden", "admin route: the bearer token is wrong")

    # --- bodies (serve/bodies.py), bounded by this service's limits -----------------------------
    async def _bounded_body(self, request: Request) -> bytes:
        return await bodies.read_body(request, limit=self.limit, timeout=self.service.body_timeout_s)

    async def _uploads(self, request: Request, *, max_images: int) -> tuple[list[tuple[str, bytes]], dict[str, str]]:
        """Images of a raw-image or multipart body, and the multipart's text fields."""
        return await bodies.uploads(
            request, max_images=max_images, limit=self.limit, timeout=self.service.body_timeout_s
        )

    def _predict_handle(self, model_id: str, *, by_reference: bool = False) -> Any:
        """The detector's ``predict`` under ``model_id``, made once per model id: ``options()`` and the
        method lookup each copy the handle, so not per request. Model ids are products that
        exist and their warm-set aliases; a deleted product's go with it. ``by_reference``: the images
        go through the object store (a request over ``SERVE_BY_VALUE_MAX_BYTES``)."""
        key = (model_id, by_reference)
        handle = self._handles.get(key)
        if handle is None:
            base = self.detector_by_reference if by_reference else self.detector
            handle = self._handles[key] = base.options(multiplexed_model_id=model_id).predict
        return handle

    # --- what every prediction feeds: HTTP's here, gRPC's forwarded (serve/grpc/service.py) ---------
    def observe(self, product: str, uploads: list[tuple[str, bytes]], results: list[dict[str, Any]]) -> None:
        """One predict request's results into the metrics (``/metrics``), the console's recent ring
        (adds ``recent_id``), the inspection record and the drift monitor (``Console.remember``): the
        one place both surfaces feed them."""
        self.metrics.observe_results(product, results)
        self.console.remember(product, uploads, results)

    async def observe_predictions(
        self,
        predictions: list[Observed],
        calls: Sequence[tuple[str, int, float]] = (),
    ) -> int:
        """gRPC predictions, forwarded by the gRPC replicas in batches (serve/grpc/service.py), each
        ``(product, uploads, results)`` fed as an HTTP one is (:meth:`observe`), and the gRPC calls,
        answered or refused, counted as ``(route, status, seconds)`` in the request metrics. Returns
        how many predictions. A raw frame is kept as a lossless PNG (``RawFrame.to_png``), encoded
        here in a worker thread: off the replicas, which only decode it, and off the request's path."""
        if any(isinstance(data, RawFrame) for _, uploads, _ in predictions for _, data in uploads):
            predictions = await asyncio.to_thread(_raw_frames_as_png, predictions)
        for product, uploads, results in predictions:
            self.observe(product, cast("list[tuple[str, bytes]]", uploads), results)  # raw frames: PNG above
        for route, status, seconds in calls:
            self.metrics.observe_request(route, status, seconds)
        return len(predictions)

    @staticmethod
    def _check_product(product: str) -> str:
        try:
            return check_product_name(product)
        except StoreError as exc:
            raise Refused(400, "bad_product_name", str(exc)) from None

    async def _require_product(self, product: str) -> None:
        self._check_product(product)
        if self._known.get(product, 0.0) > time.monotonic():
            return
        await self.registry.head.remote(product)  # ProductNotFound -> 404
        # Cached no longer than the registry's store poll: a product deleted elsewhere 404s soon.
        self._known[product] = time.monotonic() + self.service.store_poll_s

    async def _json(self, request: Request) -> dict[str, Any]:
        return await bodies.json_object(request, limit=self.limit, timeout=self.service.body_timeout_s)

    async def _job_response(self, record: dict[str, Any], wait: bool) -> JSONResponse:
        if not wait:
            return JSONResponse({"job": record}, status_code=202)
        return job_answer(await self.registry.job.remote(record["id"], self.service.job_wait_s))

    # --- routes ---------------------------------------------------------------------------------
    @app.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics_page(self) -> Response:  # not ``metrics``: that is the ServiceMetrics attribute
        return Response(self.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/products")
    @timed("products")
    async def products(self, request: Request) -> Response:
        described = await self.registry.describe.remote()
        return JSONResponse({"products": [d.to_json() for d in described]})

    @app.get("/v1/products/{product}")
    @timed("settings")
    async def settings(self, product: str, request: Request) -> Response:
        """The head version's stored settings: its configuration (``geometry`` included), region
        (or null), tile grid and tile overlap (``ProductRegistry.settings``)."""
        self._check_product(product)
        return JSONResponse(await self.registry.settings.remote(product))  # ProductNotFound -> 404

    @app.post("/v1/products/{product}/predict")
    @timed("predict")
    async def predict(
        self, product: str, request: Request, map: str | None = None, map_size: int | None = None
    ) -> Response:
        if map not in (None, "png"):
            raise Refused(400, "bad_request", f"map={map!r}: the only heat-map format is png")
        if map_size is not None and not 1 <= map_size <= MAP_SIZE_MAX:
            raise Refused(400, "bad_request", f"map_size={map_size}: the heat-map's long side, 1-{MAP_SIZE_MAX} px")
        await self._require_product(product)
        uploads, _ = await self._uploads(request, max_images=self.service.max_images_per_request)
        decode_start = time.perf_counter()
        canvas = await self._canvas.canvas(product)
        busy = bool(self.warm.inflight)  # other requests queued or scoring at the detector (canvas.decode_threads)
        images = await asyncio.to_thread(decode_to_canvas, uploads, canvas, busy)
        decode_ms = round(1000 * (time.perf_counter() - decode_start), 3)
        started = time.perf_counter()
        with self.warm.request(product) as model_id:  # the product's id, or an alias while it is hot
            large = sum(im.nbytes for im in images) > SERVE_BY_VALUE_MAX_BYTES
            predict = self._predict_handle(model_id, by_reference=large)
            try:
                results = await predict.remote(images, map == "png", map_size)
            except RayActorError:  # the replica died under the request: scoring is idempotent, retry once
                results = await predict.remote(images, map == "png", map_size)
        self.observe(product, uploads, results)  # adds recent_id
        total_ms = round(1000 * (time.perf_counter() - started), 3)
        for (name, _), r in zip(uploads, results, strict=True):
            t = r["timing"]
            t["total_ms"] = total_ms
            # the split: ingress decode + resize, Ray hop both ways (incl. serialisation), queue, score
            t["decode_ms"] = decode_ms
            t["transfer_ms"] = round(max(0.0, total_ms - t["queue_ms"] - t["score_ms"]), 3)
            r["name"] = name
        if len(results) == 1 and uploads[0][0] == "<body>":
            return JSONResponse({"product": product, **{k: v for k, v in results[0].items() if k != "name"}})
        return JSONResponse({"product": product, "version": results[0]["version"], "results": results})

    @app.post("/v1/products/{product}")
    @timed("create")
    async def create(self, product: str, request: Request, wait: bool = False) -> Response:
        self._admin(request)
        self._check_product(product)
        ctype = bodies.content_type(request)
        if ctype == "application/json":
            body = bodies.typed(
                bodies.SourceBody,
                await self._json(request),
                refusal="JSON body: give 'source' (folder or s3:// prefix) and optional 'config'",
            )
            images = await self.image_sets.from_body(product, source=body.source)
            config_data = body.config or {}
            region = body.region
            tiles = bodies.geometry_fields(body.tiles, body.min_defect_px)
        else:
            uploads, fields = await self._uploads(request, max_images=self.service.max_images_per_job)
            images = ImageSet(uploads)
            config_data = parse_json_object(fields.get("config", "{}"), what="the 'config' field")
            region = parse_json_object(fields["region"], what="the 'region' field") if "region" in fields else None
            tiles = bodies.geometry_fields(fields.get("tiles"), fields.get("min_defect_px"))
        if not isinstance(config_data, dict):
            raise Refused(400, "bad_config", "'config' must be a JSON object")
        if tiles:  # the tile grid and the smallest defect: fields, or config's "geometry"
            geometry = config_data.get("geometry")
            config_data = {**config_data, "geometry": {**(geometry if isinstance(geometry, dict) else {}), **tiles}}
        if region is not None:  # the inspection region: a field of its own, or config's "region"
            config_data = {**config_data, "region": region}
        config = merge_product_config(self.service.product_defaults, config_data)  # over the service's defaults
        bodies.check_region_field(config)  # a bad region is a 400 now, not a failed job later
        await self.image_sets.checked(images, minimum=2, too_few="a product needs at least 2 good images")
        record = await self.registry.start_create.remote(product, config, images.data)
        return await self._job_response(record, wait)

    @app.put("/v1/products/{product}/region")
    @timed("region")
    async def region(self, product: str, request: Request, wait: bool = False, publish: str | None = None) -> Response:
        """Another inspection region for ``product`` (``hetmm region``): JSON ``{"region": R}`` (R
        as in ``config/region.py``, or null: every pixel counts), or R itself. A job (202) that
        recalibrates the head's templates under R and publishes a new version (``?publish=``)."""
        self._admin(request)
        publish = bodies.publish_mode(publish)
        region = await self._region_body(product, request)
        record = await self.registry.start_region.remote(product, region, publish)
        return await self._job_response(record, wait)

    @app.post("/v1/products/{product}/region/preview")
    @timed("region")
    async def region_preview(self, product: str, request: Request, wait: bool = False) -> Response:
        """What ``PUT .../region`` with the same body would publish, published nowhere (the console's
        Preview): a job (202, kind ``region_preview``) whose record gets ``preview``, the head's
        threshold, estimated false-alarm rate and out-of-fold score quantiles beside those under
        the region (``distributed/registry.py`` ``region_preview``). Admin: it costs a calibration."""
        self._admin(request)
        region = await self._region_body(product, request)
        record = await self.registry.start_region_preview.remote(product, region)
        return await self._job_response(record, wait)

    async def _region_body(self, product: str, request: Request) -> dict[str, Any] | None:
        """The checked region of a region request's JSON body: ``{"region": R}`` or R (or null)."""
        await self._require_product(product)
        spec = await self._json(request)
        data = spec["region"] if set(spec) == {"region"} else spec
        return None if data is None else region_from_json(data)  # ConfigError -> 400 bad_config

    @app.post("/v1/products/{product}/normals")
    @timed("normals")
    async def normals(self, product: str, request: Request, wait: bool = False, publish: str | None = None) -> Response:
        self._admin(request)
        publish = bodies.publish_mode(publish)
        await self._require_product(product)
        uploads, _ = await self._uploads(request, max_images=self.service.max_images_per_job)
        images = await self.image_sets.checked(ImageSet(uploads), too_few="no images to add")
        record = await self.registry.start_normals.remote(product, images.data, publish)
        return await self._job_response(record, wait)

    @app.post("/v1/products/{product}/calibrate")
    @timed("calibrate")
    async def calibrate(
        self, product: str, request: Request, wait: bool = False, publish: str | None = None
    ) -> Response:
        """Labelled validation (``hetmm calibrate``): multipart files under the field names ``good``
        and ``defective`` (text fields ``objective`` f1|recall, ``max_false_alarm_rate``), or JSON
        ``{"source": server-side folder, "objective", "max_false_alarm_rate"}``. A job (202)."""
        self._admin(request)
        publish = bodies.publish_mode(publish)
        await self._require_product(product)
        if bodies.content_type(request) == "application/json":
            spec = await self._json(request)
            if "rule" in spec or "false_alarm_rate" in spec:  # the far rule at a rate (serve/ui.py)
                far = bodies.typed(bodies.FarRuleBody, spec, refusal="JSON body: give 'false_alarm_rate'")
                return await self._job_response(await self.console.set_far_rule(product, far, publish), wait)
            body = bodies.typed(
                bodies.LabelledSourceBody,
                spec,
                refusal="JSON body: give 'source' (a labelled folder) and optional 'objective', 'max_false_alarm_rate'",
            )
            images = await self.image_sets.from_body(product, source=body.source, labelled=True)
            fields = {"objective": body.objective, "max_false_alarm_rate": body.max_false_alarm_rate}
        else:
            uploads, labels, fields = await self._labelled_uploads(request)
            images = ImageSet(uploads, labels)
        objective = fields.get("objective", "f1")
        if objective not in ("f1", "recall"):
            raise Refused(400, "bad_request", f"objective: choose f1 or recall, got {objective!r}")
        try:
            cap = float(fields.get("max_false_alarm_rate", 0.01))
            check_rate(cap)
        except (TypeError, ValueError) as exc:
            raise Refused(400, "bad_request", f"max_false_alarm_rate: {exc}") from None
        await self.image_sets.checked(images, good_and_defective=True)
        record = await self.registry.start_calibrate.remote(
            product, images.data, images.labels, objective, cap, publish
        )
        return await self._job_response(record, wait)

    async def _labelled_uploads(self, request: Request) -> tuple[list[tuple[str, bytes]], list[int], dict[str, str]]:
        return await bodies.labelled_uploads(
            request,
            max_images=self.service.max_images_per_job,
            limit=self.limit,
            timeout=self.service.body_timeout_s,
        )

    @app.post("/v1/products/{product}/rollback")
    @timed("rollback")
    async def rollback(self, product: str, request: Request) -> Response:
        self._admin(request)
        await self._require_product(product)
        body = bodies.typed(
            bodies.RollbackBody,
            await self._json(request),
            refusal="JSON body: give the integer 'version' to roll back to",
        )
        done = await self.registry.rollback.remote(product, body.version)
        return JSONResponse({"product": product, "version": done})

    @app.delete("/v1/products/{product}")
    @timed("delete")
    async def delete(self, product: str, request: Request) -> Response:
        self._admin(request)
        self._check_product(product)
        await self.registry.delete.remote(product)  # ProductNotFound -> 404
        self._known.pop(product, None)
        for key in [k for k in self._handles if product_of(k[0]) == product]:
            del self._handles[key]
        self._canvas.forget(product)
        self.console.forget(product)  # the console's recent ring (serve/recent.py)
        return JSONResponse({"product": product, "deleted": True})

    # --- candidates and compare ----------------------------------------------------------------
    @app.get("/v1/products/{product}/candidates")
    @timed("candidates")
    async def candidates(self, product: str, request: Request) -> Response:
        """The product's candidate versions beside its head (``ProductRegistry.candidates``)."""
        await self._require_product(product)
        head = await self.registry.head.remote(product)
        return JSONResponse(
            {"product": product, "head": head, "candidates": await self.registry.candidates.remote(product)}
        )

    @app.post("/v1/products/{product}/versions/{version}/promote")
    @timed("promote")
    async def promote(self, product: str, version: int, request: Request) -> Response:
        """Make candidate ``version`` head (a recorded move); optional JSON ``{"expect_head": n}``:
        409 unless the head is still ``n``. 404 if it is not a candidate."""
        self._admin(request)
        await self._require_product(product)
        raw = await self._bounded_body(request)  # an empty body: no expectation
        spec = parse_json_object(raw, what="JSON body") if raw.strip() else {}
        body = bodies.typed(bodies.PromoteBody, spec, refusal="JSON body: optional integer 'expect_head'")
        old = await self.registry.head.remote(product)
        done = await self.registry.promote.remote(product, version, body.expect_head)
        return JSONResponse({"product": product, "version": done, "previous": old})

    @app.post("/v1/products/{product}/versions/{version}/discard")
    @timed("discard")
    async def discard(self, product: str, version: int, request: Request) -> Response:
        """Drop candidate ``version``; the head does not move. 404 if it is not a candidate."""
        self._admin(request)
        await self._require_product(product)
        await self.registry.discard.remote(product, version)
        return JSONResponse({"product": product, "version": version, "discarded": True})

    @app.post("/v1/products/{product}/versions/{version}/compare")
    @timed("compare")
    async def compare(self, product: str, version: int, request: Request, wait: bool = False) -> Response:
        """Score a set of images with the head (or ``base``) and ``version`` side by side: a job (202,
        kind ``compare``) whose record gets ``compare`` (compare.py: flips with both heat-maps, the
        score shift, each version's false-alarm rates; recall with labelled images). The set: a
        multipart upload of images, or JSON ``bodies.CompareBody`` (a server-side folder or s3://
        prefix, a labelled folder, or ``store:labels``, the console's labelled set)."""
        self._admin(request)
        await self._require_product(product)
        base = None
        if bodies.content_type(request) == "application/json":
            body = bodies.typed(
                bodies.CompareBody,
                await self._json(request),
                refusal="JSON body: give 'source' (folder, s3:// prefix or store:labels), optional 'labelled', 'base'",
            )
            base = body.base
            images = await self.image_sets.from_body(
                product, source=body.source, labelled=body.labelled, since=body.since, until=body.until
            )
        else:
            uploads, _ = await self._uploads(request, max_images=self.service.max_images_per_job)
            images = ImageSet(uploads)
        await self.image_sets.checked(images, too_few="no images to compare on")
        record = await self.registry.start_compare.remote(product, version, images.uploads, images.labels, base)
        return await self._job_response(record, wait)

    @app.get("/v1/jobs/{job_id}")
    @timed("job")
    async def job(self, job_id: str, request: Request) -> Response:
        self._admin(request)
        record = await self.registry.job.remote(job_id)
        if record is None:
            raise Refused(404, "unknown_job", f"no job {job_id!r}")
        return JSONResponse({"job": record})

    # --- the console (serve/ui.py): the page, then the routes it reads and labels through --------
    @app.get("/ui")
    async def ui_redirect(self) -> Response:
        return self.console.ui_redirect()

    @app.get("/ui/")
    async def ui_index(self) -> Response:
        return self.console.ui_index()

    @app.get("/ui/{name}")
    async def ui_file(self, name: str) -> Response:
        return self.console.ui_file(name)

    @app.get("/v1/recent")
    @timed("recent")
    async def recent_counts(self, request: Request) -> Response:
        return self.console.recent_counts()

    @app.get("/v1/products/{product}/recent")
    @timed("recent")
    async def recent_items(self, product: str, request: Request, flagged: bool = False, limit: int = 0) -> Response:
        await self._require_product(product)
        return await self.console.recent_items(product, flagged, limit)

    @app.get("/v1/products/{product}/recent/{item_id}/image")
    @timed("recent")
    async def recent_image(self, product: str, item_id: str, request: Request) -> Response:
        return await self.console.recent_image(product, item_id)

    @app.get("/v1/products/{product}/recent/{item_id}/heatmap.png")
    @timed("recent")
    async def recent_heatmap(self, product: str, item_id: str, request: Request) -> Response:
        return await self.console.recent_heatmap(product, item_id)

    @app.get("/v1/products/{product}/versions")
    @timed("versions")
    async def versions(self, product: str, request: Request) -> Response:
        await self._require_product(product)
        return await self.console.versions(product)

    @app.get("/v1/products/{product}/labels")
    @timed("labels")
    async def labels(self, product: str, request: Request) -> Response:
        self._check_product(product)
        return await self.console.labels(product)

    @app.post("/v1/products/{product}/labels")
    @timed("labels")
    async def add_label(self, product: str, request: Request, label: str = "", name: str = "") -> Response:
        self._admin(request)
        await self._require_product(product)
        self.console.check_label(label)
        uploads, _ = await self._uploads(request, max_images=1)
        return await self.console.add_label(product, label, name, uploads[0])

    @app.get("/v1/products/{product}/labels/{label_id}/image")
    @timed("labels")
    async def label_image(self, product: str, label_id: str, request: Request) -> Response:
        self._check_product(product)
        return await self.console.label_image(product, label_id)

    @app.delete("/v1/products/{product}/labels/{label_id}")
    @timed("labels")
    async def delete_label(self, product: str, label_id: str, request: Request) -> Response:
        self._admin(request)
        self._check_product(product)
        return await self.console.delete_label(product, label_id)

    @app.get("/v1/products/{product}/calibration")
    @timed("calibration")
    async def calibration(self, product: str, request: Request, false_alarm_rate: float | None = None) -> Response:
        await self._require_product(product)
        return await self.console.calibration(product, false_alarm_rate)

    @app.get("/v1/products/{product}/report")
    @timed("report")
    async def report(self, product: str, request: Request) -> Response:
        """The product's latest evaluation report (``hetmm evaluate --store --report``), described:
        ``{"product", "report": {"version", "created", "files", "bytes", "url"}}``, ``"report": null``
        without one. Its page is at ``url``."""
        await self._require_product(product)
        return await self.console.report(product)

    @app.get("/v1/products/{product}/report/")
    @timed("report")
    async def report_page(self, product: str, request: Request) -> Response:
        """The latest evaluation report's page (HTML, read-only: no script runs under its
        Content-Security-Policy). 404 ``not_found`` without a report."""
        await self._require_product(product)
        return await self.console.report_file(product)

    @app.get("/v1/products/{product}/report/{name}")
    @timed("report")
    async def report_file(self, product: str, name: str, request: Request) -> Response:
        """A file of the latest evaluation report (``histogram.png``, ``roc.png``...). 404
        ``not_found`` for a name the report does not hold."""
        await self._require_product(product)
        return await self.console.report_file(product, name)

    @app.get("/v1/products/{product}/report/{folder}/{name}")
    @timed("report")
    async def report_folder_file(self, product: str, folder: str, name: str, request: Request) -> Response:
        """A file in a folder of the latest evaluation report (the gallery's, ``gallery/NNN-frame.png``).
        404 ``not_found`` for a name the report does not hold."""
        await self._require_product(product)
        return await self.console.report_file(product, f"{folder}/{name}")

    @app.put("/v1/stations/{line}/{station}")
    @timed("stations")
    async def station_report(self, line: str, station: str, request: Request) -> Response:
        """A station's report of itself (``station/report.py``; checked by ``serve/stations.py``)."""
        self._admin(request)
        return JSONResponse(self.stations.report(line, station, await self._json(request)))

    @app.get("/v1/stations")
    @timed("stations")
    async def stations_listing(self, request: Request) -> Response:
        return JSONResponse({"stations": self.stations.listing()})

    @app.get("/v1/products/{product}/drift")
    @timed("drift")
    async def drift(self, product: str, request: Request, hours: float = 24.0, buckets: int = 96) -> Response:
        await self._require_product(product)
        return await self.console.drift(product, hours, buckets)

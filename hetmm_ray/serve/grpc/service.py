"""The ``hetmm.v1.Inspection`` gRPC service: detector replicas that Serve's gRPC proxy calls directly.

Exact semantics:

- The gRPC application (``config.GRPC_APP_NAME``, route prefix ``GRPC_ROUTE_PREFIX``: Serve 2.60's
  gRPC proxy routes only to applications with one; HTTP there answers 404) has one deployment, ``Detector``: the HTTP
  service's detector class (serve/replica.py) with the three methods of ``inspection.proto``. Serve's
  gRPC proxy routes a call to it by the ``application`` metadata and, for ``Predict``, by the
  ``multiplexed_model_id`` metadata (the product; the client in ``client.py`` sends both), so a
  product's calls reach the replicas holding it with no ingress hop. Its replicas are a pool of their
  own beside the HTTP application's (Serve deployments belong to one application), autoscaled with
  the same settings (deploy.yaml).
- ``Predict`` applies HTTP's checks in HTTP's order: the product name (400), the count of images
  (none: 400 ``empty_body``; over ``max_images_per_request``: 413 ``too_many_images``), their bytes
  in all over ``max_body_mib`` (413 ``too_large``) before any is decoded, the product's existence
  (404), then each image's own checks while decoding (``data/decode.py``, and for a raw frame
  ``data/raw_frame.py``: 400 ``bad_image``; an image with both ``data`` and ``raw``, or neither,
  is 400 ``bad_image`` too; decoded
  in a worker thread on arrival, so decoding queued requests overlaps scoring, and announced to the
  batcher: ``GreedyBatcher.arriving``). A
  ``threshold`` override needs the admin token when one is configured (``authorization: Bearer
  <token>`` metadata; none 401, a wrong one 403); ``version`` pins the version that must score the
  request (another head: 409 ``version_moved``, nothing stored changes).
- Every error is answered by the one table (``errors.describe``, transport errors as the HTTP
  ingress classifies them) with the gRPC code of its HTTP status (``errors.GRPC_CODES``) and
  details ``"<code>: <message>"``; the reply is then empty. A peer outside loopback is refused
  (PERMISSION_DENIED ``forbidden``) while ``grpc_host`` is a loopback address.
- Every answered ``Predict`` feeds what an HTTP predict feeds: the metrics of ``/metrics``, the console's
  recent ring, the inspection record (``record: true``) and the drift monitor, all held by the HTTP
  application's ingress (``config.HTTP_APP_NAME``). The replica hands each request's uploads and
  results (as scored by the product's own rule, before a ``threshold`` override) to
  ``Ingress.observe_predictions``, batched: one handle call at most every ``OBSERVE_EVERY_S``, so the
  hop costs next to nothing per request. Forwarding never fails a ``Predict``: while the ingress
  cannot be reached (no HTTP application), a failed forward drops its entries (logged once) and the
  next ``OBSERVE_RETRY_S`` of them, at most ``OBSERVE_MAX_HELD`` are held, and a replica that stops
  loses at most the last ``OBSERVE_EVERY_S`` of them. Every call, answered or refused, is counted the
  same way in ``/metrics``' ``hetmm_requests_total`` and ``hetmm_request_seconds`` (routes
  ``grpc_predict``, ``grpc_list_products``, ``grpc_health``; ``status`` the HTTP status of the error
  table, 200 when answered; seconds as the replica saw the call).
- Result fields are the HTTP answer's (``score``, ``threshold``, ``is_anomaly``, the rule fields,
  ``version``, ``timing``; ``heatmap_png`` as PNG bytes, not base64). ``timing.total_ms`` is measured
  in the replica (decode, queue and score; there is no hop to time), ``transfer_ms`` is absent. With
  a ``threshold`` override ``is_anomaly`` is ``score > threshold`` (the detector's rule), the verdict
  follows it (``result.rejudged``) and ``threshold_rule`` is ``"override"``, without ``rule_target`` or
  ``estimated_false_alarm_rate``. The fields are the one result record's (hetmm_ray/result.py,
  docs/result-record.md): ``record_version``, ``verdict`` and ``review_threshold`` as HTTP's.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import math
import os
import time
from typing import Any

from ray import serve

from ...config import HTTP_APP_NAME, ServiceConfig
from ...data.raw_frame import RawFrame
from ...errors import Refused
from ...result import rejudged
from ...store import StoreError, check_product_name
from ..answers import classify
from ..canvas import decode_to_canvas
from ..replica import Detector, ScoreRequest
from ..security import JSONResponse, refuse_open_bind
from ..warm_set import product_of
from . import inspection_pb2 as pb
from .messages import (
    METRIC_ROUTES,
    Observed,
    host_is_loopback,
    metadata_value,
    peer_is_loopback,
    refuse,
    result_message,
    upload_of,
)

__all__ = ["InspectionDetector"]

logger = logging.getLogger("ray.serve")

OBSERVE_EVERY_S = 0.25  # predictions forwarded to the ingress in one call at most this often
OBSERVE_MAX_HELD = 10_000  # requests held while the ingress cannot be reached; later ones are dropped
OBSERVE_TIMEOUT_S = 60.0
OBSERVE_RETRY_S = 10.0  # after a failed forward, held entries are dropped for this long

Call = tuple[str, int, float]  # (route, HTTP status, seconds): one gRPC call for the request metrics


@serve.deployment(name="Detector", ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=32)
class InspectionDetector(Detector.func_or_class):  # type: ignore[name-defined,misc]
    """A detector replica that also answers ``hetmm.v1.Inspection`` (see the module doc)."""

    def __init__(self, store: str, max_products_per_replica: int, service: dict[str, Any]) -> None:
        super().__init__(store, max_products_per_replica)
        self.service = ServiceConfig.from_dict(service)
        self.token = os.environ.get(self.service.admin_token_env) or None
        refuse_open_bind(self.service.grpc_host, self.token, self.service.admin_token_env)
        self.loopback_only = host_is_loopback(self.service.grpc_host)
        self.limit = self.service.max_body_mib * 2**20
        self._observed: list[Observed] = []  # predictions not yet forwarded to the ingress
        self._calls: list[Call] = []  # calls not yet counted by the ingress
        self._forwarder: asyncio.Task | None = None
        self._ingress: Any = None  # Ingress.observe_predictions, looked up on first use
        self._observe_failed = False  # a failure is logged once until forwarding works again
        self._retry_at = 0.0  # after a failure, entries are dropped until then

    # --- metrics, record and drift: fed through the HTTP application's ingress --------------------
    def _observe(
        self, product: str, uploads: list[tuple[str, bytes | RawFrame]], results: list[dict[str, Any]]
    ) -> None:
        """Hold one answered request for the ingress (module doc); the results are copied as they are now."""
        if len(self._observed) >= OBSERVE_MAX_HELD:
            return  # the ingress is unreachable: counted by its absence (logged by _forward)
        self._observed.append((product, uploads, [{**r, "timing": dict(r["timing"])} for r in results]))
        self._start_forwarding()

    def _count(self, route: str, status: int, seconds: float) -> None:
        """Hold one call's outcome for the ingress's request metrics (module doc)."""
        if len(self._calls) < OBSERVE_MAX_HELD:
            self._calls.append((route, status, seconds))
            self._start_forwarding()

    def _start_forwarding(self) -> None:
        if self._forwarder is None or self._forwarder.done():
            self._forwarder = asyncio.get_running_loop().create_task(self._forward(), name="hetmm-grpc-observe")

    async def _forward(self) -> None:
        while self._observed or self._calls:
            await asyncio.sleep(OBSERVE_EVERY_S)  # what arrives meanwhile goes in the same call
            batch, self._observed = self._observed, []
            calls, self._calls = self._calls, []
            if time.monotonic() < self._retry_at:
                continue  # the ingress failed lately: dropped, not asked again at every flush
            try:
                if self._ingress is None:
                    # in a thread: the lookup asks the controller with a blocking ray.get
                    handle = await asyncio.to_thread(serve.get_deployment_handle, "Ingress", HTTP_APP_NAME)
                    # through the object store: a batch of uploads can exceed a replica's gRPC message limit
                    self._ingress = handle.options(_by_reference=True).observe_predictions
                await asyncio.wait_for(self._ingress.remote(batch, calls), OBSERVE_TIMEOUT_S)
                self._observe_failed = False
            except Exception as exc:  # noqa: BLE001 - forwarding never fails a prediction
                self._ingress = None
                self._retry_at = time.monotonic() + OBSERVE_RETRY_S
                if not self._observe_failed:
                    self._observe_failed = True
                    logger.warning(
                        "gRPC predictions not fed to the metrics and the record (%d requests dropped): %s: %s",
                        len(batch),
                        type(exc).__name__,
                        exc,
                    )

    # --- plumbing -------------------------------------------------------------------------------
    async def _answer(self, grpc_context: Any, empty: Any, work: Any, method: str) -> Any:
        """``await work()``, or ``empty`` with the error's gRPC code and ``"<code>: <message>"``; either
        way counted under ``method``'s route (module doc)."""
        started, status = time.perf_counter(), 200
        try:
            if self.loopback_only and not peer_is_loopback(grpc_context.peer()):
                raise Refused(403, "forbidden", "this endpoint answers loopback peers only (service.grpc_host)")
            return await work()
        except Exception as exc:  # noqa: BLE001 - every failure becomes a status with details
            refusal = classify(exc)
            status = refusal.status
            refuse(grpc_context, refusal)
            return empty
        finally:
            self._count(METRIC_ROUTES[method], status, time.perf_counter() - started)

    def _admin(self, grpc_context: Any) -> None:
        if self.token is None:
            return  # loopback-only endpoint without a token (checked at start-up)
        header = metadata_value(grpc_context, "authorization")
        if not header:
            raise Refused(401, "unauthorized", "threshold override: send 'authorization: Bearer <token>' metadata")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            raise Refused(403, "forbidden", "threshold override: the bearer token is wrong")

    # --- HTTP: none (Serve's gRPC proxy routes only to applications with a route prefix) ----------
    async def __call__(self, request: Any) -> JSONResponse:
        return JSONResponse(
            {"error": {"code": "not_found", "message": "the gRPC application has no HTTP routes"}}, status_code=404
        )

    # --- the service ----------------------------------------------------------------------------
    async def Predict(self, request: pb.PredictRequest, grpc_context: Any) -> pb.PredictReply:
        work = functools.partial(self._predict, request, grpc_context)
        return await self._answer(grpc_context, pb.PredictReply(), work, "Predict")

    async def ListProducts(self, request: pb.ListProductsRequest, grpc_context: Any) -> pb.ListProductsReply:
        async def work() -> pb.ListProductsReply:
            described = await self.registry.describe.remote()
            return pb.ListProductsReply(
                products=[
                    pb.Product(product=d.product, version=d.version, json=json.dumps(d.to_json(), allow_nan=False))
                    for d in described
                ]
            )

        return await self._answer(grpc_context, pb.ListProductsReply(), work, "ListProducts")

    async def Health(self, request: pb.HealthRequest, grpc_context: Any) -> pb.HealthReply:
        async def work() -> pb.HealthReply:
            if self._fatal is not None:
                raise Refused(503, "unavailable", f"replica unhealthy: {self._fatal}")
            return pb.HealthReply(status="ok", replica=self._replica)

        return await self._answer(grpc_context, pb.HealthReply(), work, "Health")

    async def _predict(self, request: pb.PredictRequest, grpc_context: Any) -> pb.PredictReply:
        started = time.perf_counter()
        product = request.product
        try:
            check_product_name(product)
        except StoreError as exc:
            raise Refused(400, "bad_product_name", str(exc)) from None
        model_id = serve.get_multiplexed_model_id() or product
        if product_of(model_id) != product:
            raise Refused(400, "bad_request", f"multiplexed_model_id {model_id!r} is not product {product!r}")
        count, most = len(request.images), self.service.max_images_per_request
        if count == 0:
            raise Refused(400, "empty_body", "the request holds no images")
        if count > most:
            raise Refused(413, "too_many_images", f"{count} images in one request; the limit is {most}")
        uploads = [(im.name or f"<image {i}>", upload_of(im)) for i, im in enumerate(request.images)]
        size = sum(len(data) for _, data in uploads)
        if size > self.limit:
            raise Refused(413, "too_large", f"images of {size} bytes in all exceed {self.limit} bytes")
        override = request.threshold if request.HasField("threshold") else None
        if override is not None:
            self._admin(grpc_context)
            if not math.isfinite(override):
                raise Refused(400, "bad_request", "threshold: must be a finite number")
        model = await self.product_model(model_id)  # ProductNotFound -> NOT_FOUND
        detector = model.detector
        assert detector is not None
        canvas = detector.config.decode_canvas  # None: a tiled product's frames travel whole (it cuts them)
        decode_start = time.perf_counter()
        # decoded in a thread as it arrives, announced to the batcher meanwhile (serve/greedy.py: a free
        # batcher waits for the requests this replica is decoding rather than score a lone one)
        # one decode thread while this replica scores or decodes other requests (canvas.decode_threads)
        busy = self._images_in_flight > 0 or self._batcher.announced() > 0
        with self._batcher.arriving(model_id):
            images = await asyncio.to_thread(decode_to_canvas, uploads, canvas, busy)
        decode_ms = round(1000 * (time.perf_counter() - decode_start), 3)
        scored = ScoreRequest(images, request.heatmap, time.perf_counter())
        results = await self.score(model_id, scored)  # no await before it queues: the batcher finds it
        version = results[0]["version"]
        if request.HasField("version") and request.version != version:
            raise Refused(409, "version_moved", f"version {request.version} asked; version {version} is head")
        self._observe(product, uploads, results)  # before the override and the reply's own fields
        total_ms = round(1000 * (time.perf_counter() - started), 3)
        for (name, _), r in zip(uploads, results, strict=True):
            r["name"] = name
            r["timing"]["total_ms"] = total_ms
            r["timing"]["decode_ms"] = decode_ms
        if override is not None:  # the records judged again (result.rejudged); what was observed stays
            results = [rejudged(r, threshold=override) for r in results]
        return pb.PredictReply(product=product, version=version, results=[result_message(r) for r in results])

"""The inspection console (``GET /ui/``) and the few read/label routes it needs.

The page (``static/``: one HTML file, one script, one style sheet; no build step, nothing
fetched from elsewhere) is served by the ingress itself and does everything through the
HTTP API with the API's own checks: predictions through ``/predict``, "good part" through
the ``/normals`` hot-update job and ``/v1/jobs/{id}``, calibration through ``/calibrate``
(``{"rule": "far", "false_alarm_rate": r}``: the previewed far line, handled here by
:meth:`Console.set_far_rule`; or ``{"source": "store:labels"}``: the labelled set
below), the inspection region through ``POST .../region/preview`` and ``PUT .../region``
(ingress routes, registry jobs; the page draws the shapes over a training image the user
picks, in that image's pixels), rollback through ``/rollback`` (the store records the move, ``VersionedStore.moves``).
Routes that change something need the admin token (the page asks once and keeps it in the
tab's ``sessionStorage``); reads need nothing, like ``GET /v1/products``.

The console is an object (:class:`Console`) handed what it needs: the service's settings, the
registry and detector handles, the store. Its routes are ``Ingress`` methods like every other
route (serve/ingress.py: ``@app.get(...)`` over ``@timed(...)``): each checks the request (auth,
product) and calls the console method of the same name, which answers it. The routes:

====== ================================================ ======================================
GET    ``/ui/``, ``/ui/app.js``, ``/ui/app.css``         the console
GET    ``/v1/recent``                                    per product: scored / flagged since start
GET    ``/v1/products/{p}/recent[?flagged=true]``        the recent ring (serve/recent.py), newest first;
                                                         with ``record: true`` topped up from the record
GET    ``/v1/products/{p}/recent/{id}/image``            the uploaded image
GET    ``/v1/products/{p}/recent/{id}/heatmap.png``      its heat-map (drawn on demand if not kept)
GET    ``/v1/products/{p}/versions``                     history: parent, images, what changed, rollbacks
POST   ``/v1/products/{p}/calibrate`` ``{"rule": "far", "false_alarm_rate": r}``: admin, the far rule at r
                                                         as a new version (a job; the ingress route)
GET    ``/v1/products/{p}/labels``                       the labelled set (store/labels.py)
POST   ``/v1/products/{p}/labels?label=good|defective``  admin: label an image (raw image body)
GET    ``/v1/products/{p}/labels/{id}/image``            a labelled image
DELETE ``/v1/products/{p}/labels/{id}``                  admin: forget a label
GET    ``/v1/products/{p}/calibration[?false_alarm_rate]`` out-of-fold good scores, labelled scores
                                                         at the head, and a preview for a rate
GET    ``/v1/products/{p}/drift[?hours&buckets]``        the drift chart (serve/inspections.py)
GET    ``/v1/products/{p}/report``                       the latest evaluation report, described
                                                         (``{"report": null}`` without one)
GET    ``/v1/products/{p}/report/``                      its page (``index.html``), read-only
GET    ``/v1/products/{p}/report/{file}``                one of its PNGs; ``.../report/{folder}/{file}``:
                                                         one in a folder (``gallery/...``)
====== ================================================ ======================================

The evaluation report is the one ``hetmm evaluate --store --report`` stored (store/reports.py):
its files are served as stored, each checked against its sha256, only the names its index lists
(anything else, or no report, is 404 ``not_found``), the page under :data:`_REPORT_HEADERS` (no
script may run, images and styles only from the page itself).
"""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path
from typing import Any

from fastapi.responses import FileResponse, RedirectResponse, Response

from ..config import HEATMAP_VMAX_OVER_THRESHOLD, SERVE_BY_VALUE_MAX_BYTES, ServiceConfig, check_number
from ..core.calibration import check_rate
from ..core.scoring import Calibration
from ..data.decode import decode_image
from ..errors import Refused
from ..store import ProductNotFound, StoreError, VersionedStore, VersionRecord
from ..store.labels import LABELS, LabelSet
from ..store.reports import INDEX, media_type
from .bodies import FarRuleBody
from .inspections import DriftCollector, Inspections
from .recent import RecentItem, RecentPredictions, image_media_type
from .security import JSONResponse

__all__ = ["STATIC", "Console"]

STATIC = Path(__file__).resolve().parent / "static"
_FILES = {"app.js": "text/javascript", "app.css": "text/css"}
# The page runs only its own script and talks only to its own origin.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; "
    "script-src 'self'; connect-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}
# The stored evaluation report: a static page with inline styles and its own PNGs, no script at all.
_REPORT_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
MAX_VERSIONS_SHOWN = 50


def _change(record: VersionRecord, parent: VersionRecord | None) -> str:
    """What a version changed relative to its parent: create, normals, region, calibration or update.

    region: another inspection region (``PUT .../region``, recalibrated); calibration: a new
    labelled validation result, or other threshold settings (the far rule's rate set from the
    console). A rollback is not a version: it is a recorded HEAD move
    (``VersionedStore.moves``), listed beside the versions.
    """
    if parent is None:
        return "create"
    if record.images > parent.images:
        return "normals"
    if record.config.region != parent.config.region:
        return "region"
    cal, old = record.calibration, parent.calibration
    if cal is not None and cal.validation and cal != old:
        return "calibration"
    if record.config.threshold != parent.config.threshold:
        return "calibration"
    return "update"


class Console:
    """The console's state (the recent ring, the labelled set, label scores) and its answers.

    ``registry`` and ``detector``: the ingress's handles (the product registry actor, the
    ``Detector`` deployment); ``store``: the service's template store.
    """

    def __init__(
        self,
        service: ServiceConfig,
        *,
        registry: Any,
        detector: Any,
        store: VersionedStore,
        detector_by_reference: Any = None,
        metrics: Any = None,
    ) -> None:
        self.service = service
        self.registry = registry
        self.detector = detector
        # for calls whose images exceed a replica's gRPC message limit (config.SERVE_BY_VALUE_MAX_BYTES)
        self.detector_by_reference = detector if detector_by_reference is None else detector_by_reference
        self.store = store
        self.recent = RecentPredictions(service.recent_per_product, service.recent_max_mib * 2**20)
        # the inspection record and the drift alarms (serve/inspections.py)
        self.inspections = Inspections(service, store)
        if metrics is not None:
            metrics.register(DriftCollector(self.inspections))
        self.labels_set = LabelSet(store.backend)
        self._label_scores: dict[tuple[str, int, str], float] = {}  # (product, version, label id) -> score

    def remember(self, product: str, uploads: list[tuple[str, bytes]], results: list[dict[str, Any]]) -> None:
        """Record a predict request's results in the recent ring (called by the predict route)."""
        for (name, data), r in zip(uploads, results, strict=True):
            heat = r.get("heatmap_png")
            r["recent_id"] = self.recent.record(product, name, data, r, base64.b64decode(heat) if heat else None)
        self.inspections.submit(product, uploads, results)  # no I/O here: a background thread writes

    def forget(self, product: str) -> None:
        """A deleted product's recent predictions (and its drift windows)."""
        self.recent.forget(product)
        self.inspections.forget(product)

    async def _score(self, product: str, images: list[bytes], want_maps: bool = False) -> list[dict[str, Any]]:
        """Score encoded images with ``product``'s head through the detector replicas (not recorded)."""
        decoded = await asyncio.to_thread(lambda: [decode_image(d) for d in images])
        step = self.service.max_images_per_request
        out: list[dict[str, Any]] = []
        for i in range(0, len(decoded), step):
            part = decoded[i : i + step]
            large = sum(im.nbytes for im in part) > SERVE_BY_VALUE_MAX_BYTES  # e.g. a tiled product's frames
            handle = (self.detector_by_reference if large else self.detector).options(multiplexed_model_id=product)
            out.extend(await handle.predict.remote(part, want_maps))
        return out

    # --- the page -------------------------------------------------------------------------------
    @staticmethod
    def ui_redirect() -> Response:
        return RedirectResponse("/ui/", status_code=308)

    @staticmethod
    def ui_index() -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html", headers=_PAGE_HEADERS)

    @staticmethod
    def ui_file(name: str) -> Response:
        """``app.js`` or ``app.css``; anything else is a 404."""
        if name not in _FILES:
            raise Refused(404, "not_found", f"/ui/{name}: no such file (the console is /ui/)")
        return FileResponse(STATIC / name, media_type=_FILES[name], headers=_PAGE_HEADERS)

    # --- recent predictions ---------------------------------------------------------------------
    def recent_counts(self) -> Response:
        return JSONResponse(
            {"since": self.recent.started, "per_product": self.recent.per_product, "products": self.recent.counts()}
        )

    async def recent_items(self, product: str, flagged: bool, limit: int) -> Response:
        """The ring's predictions, newest first; with the record on, topped up to ``limit`` (or
        ``recent_per_product``) from the record's older rows, so the view survives a restart."""
        if limit < 0:
            raise Refused(400, "bad_request", "limit: must be >= 0 (0: all held)")
        items = self.recent.items(product, flagged_only=flagged, limit=limit or None)
        want = (limit or self.recent.per_product) - len(items)
        if self.inspections.recording and want > 0:
            before = min((i["at"] for i in items), default=None)
            older = await asyncio.to_thread(self._recorded, product, want, flagged, before)
            items += older
        return JSONResponse({"product": product, "items": items, "per_product": self.recent.per_product})

    def _recorded(self, product: str, limit: int, flagged: bool, before: float | None) -> list[dict[str, Any]]:
        """Record rows as the Recent view's items (``recorded``: true; an image only when the record's
        policy kept it)."""
        from ..record.reader import recent_rows

        rows = recent_rows(self.store.backend, product, limit, flagged_only=flagged, before=before)
        return [_recorded_item(product, row) for row in rows]

    async def _recent_item(self, product: str, item_id: str) -> RecentItem:
        item = self.recent.get(product, item_id)
        if item is None and self.inspections.recording:  # before a restart: the record may have it
            item = await asyncio.to_thread(self._recorded_image, product, item_id)
        if item is None:
            raise Refused(
                404, "unknown_prediction", f"no recent prediction {item_id!r} of {product!r} (dropped or restarted)"
            )
        return item

    def _recorded_image(self, product: str, item_id: str) -> RecentItem | None:
        from ..record.reader import row_of

        row = row_of(self.store.backend, product, item_id)
        if row is None or row.get("image_key") is None:
            return None  # not recorded, or its image not kept by the record's policy
        try:
            data = self.store.backend.read(row["image_key"])[0]
        except KeyError:
            return None  # deleted by retention meanwhile
        summary = _recorded_item(product, row)
        result = {k: summary[k] for k in ("score", "threshold", "is_anomaly", "version", "verdict")}
        return RecentItem(id=item_id, product=product, at=row["time"], name=row["name"], result=result, image=data)

    async def recent_image(self, product: str, item_id: str) -> Response:
        item = await self._recent_item(product, item_id)
        return Response(item.image, media_type=image_media_type(item.image), headers={"Cache-Control": "no-cache"})

    async def recent_heatmap(self, product: str, item_id: str) -> Response:
        item = await self._recent_item(product, item_id)
        if item.heatmap_png is None:  # the request did not ask for one: draw it with the head now
            result = (await self._score(product, [item.image], want_maps=True))[0]
            png = base64.b64decode(result["heatmap_png"])
            self.recent.set_heatmap(item, png, result["version"], result.get("heatmap_scale"))
            if item.heatmap_png is None:  # an item of the record, not held by the ring: drawn for this answer
                item.heatmap_png, item.heatmap_version = png, result["version"]
        assert item.heatmap_png is not None
        headers = {"Cache-Control": "no-cache", "X-Heatmap-Version": str(item.heatmap_version)}
        return Response(item.heatmap_png, media_type="image/png", headers=headers)

    # --- drift ---------------------------------------------------------------------------------
    async def drift(self, product: str, hours: float, buckets: int) -> Response:
        """The drift chart: flagged share over time with the expected band, the passed parts' score
        quantiles, and the live windows' state (serve/inspections.py ``Inspections.chart``)."""
        if not (0 < hours <= 24 * 366) or not (1 <= buckets <= 2000):
            raise Refused(400, "bad_request", "hours: in (0, 8784]; buckets: in [1, 2000]")
        return JSONResponse(await asyncio.to_thread(self.inspections.chart, product, hours, buckets))

    # --- the latest evaluation report (store/reports.py) ---------------------------------------
    async def report(self, product: str) -> Response:
        """``{"product", "report": null | {"version", "created", "files", "bytes", "url"}}``."""
        record = await asyncio.to_thread(self.store.latest_report, product)
        body = None if record is None else {**record.to_json(), "url": f"/v1/products/{product}/report/"}
        return JSONResponse({"product": product, "report": body})

    async def report_file(self, product: str, name: str = INDEX) -> Response:
        """A file of the latest report, as stored; 404 ``not_found`` for no report or a name outside it."""
        try:
            data = await asyncio.to_thread(self.store.get_report_file, product, name)
        except ProductNotFound as exc:
            raise Refused(404, "not_found", f"{exc} (hetmm evaluate --store --report stores one)") from None
        return Response(data, media_type=media_type(name), headers=_REPORT_HEADERS)

    # --- versions -------------------------------------------------------------------------------
    async def versions(self, product: str) -> Response:
        return JSONResponse(await asyncio.to_thread(self._history, product))

    def _history(self, product: str) -> dict[str, Any]:
        head = self.store.head(product)
        kept = self.store.versions(product)[-MAX_VERSIONS_SHOWN:]
        records = {v: self.store.record(product, v) for v in kept}
        rows = []
        for v in kept:
            rec = records[v]
            parent_no = rec.parent
            parent = records.get(parent_no) if parent_no else None
            if parent_no and parent is None:
                try:
                    parent = self.store.record(product, parent_no)
                except StoreError:
                    parent = None
            op = rec.operating_point()
            rows.append(
                {
                    "version": v,
                    "parent": parent_no,
                    "created": rec.created,
                    "images": rec.images,
                    "change": _change(rec, parent) if parent is not None or not parent_no else "update",
                    "threshold": None if op is None else op.threshold,
                    "threshold_rule": None if op is None else op.rule,
                    "head": v == head,
                }
            )
        moves = self.store.moves(product, last=MAX_VERSIONS_SHOWN)
        # One time line, newest first: each version as published, each recorded HEAD move.
        changes = [
            {"change": r["change"], "version": r["version"], "from": r["parent"], "at": r["created"]} for r in rows
        ]
        changes += [{"change": m["kind"], "version": m["to"], "from": m["from"], "at": m["time"]} for m in moves]
        changes.sort(key=lambda c: c["at"] or 0.0, reverse=True)
        newest = max(kept) if kept else head
        return {
            "product": product,
            "head": head,
            "rolled_back": head < newest,  # someone rolled back (``changes``: when, from where)
            "versions": rows[::-1],
            "moves": moves[::-1],
            "changes": changes,
        }

    async def set_far_rule(self, product: str, body: FarRuleBody, publish: str | None = None) -> dict[str, Any]:
        """``POST /v1/products/{p}/calibrate`` with JSON ``{"rule": "far", "false_alarm_rate": r}``
        (``rule`` optional; its shape checked by :class:`~hetmm_ray.serve.bodies.FarRuleBody`): the
        far rule at rate ``r`` as a new version, a job like the labelled calibration (the console's
        Apply of the previewed far line); returns the job record. ``r`` is checked against the same
        range as the ``threshold.false_alarm_rate`` setting."""
        check_number("threshold.false_alarm_rate", body.false_alarm_rate)  # ConfigError: 400 bad_config
        return await self.registry.start_far_rule.remote(product, float(body.false_alarm_rate), publish)

    # --- labels ---------------------------------------------------------------------------------
    async def labels(self, product: str) -> Response:
        return JSONResponse({"product": product, "labels": await asyncio.to_thread(self.labels_set.records, product)})

    async def labelled(self, product: str) -> list[tuple[str, bytes, int]]:
        """The labelled set as (name, bytes, label) for a calibration job (``store:labels``)."""
        return await asyncio.to_thread(self.labels_set.labelled, product)

    @staticmethod
    def check_label(label: str) -> None:
        if label not in LABELS:
            raise Refused(400, "bad_request", f"label={label!r}: choose one of {', '.join(LABELS)}")

    async def add_label(self, product: str, label: str, name: str, upload: tuple[str, bytes]) -> Response:
        data = upload[1]
        await asyncio.to_thread(decode_image, data)  # a bad image is a 400 now, not a broken set later
        version = await self.registry.head.remote(product)
        record = await asyncio.to_thread(
            self.labels_set.add, product, data, label, name=name or upload[0], version=version
        )
        return JSONResponse({"product": product, "label": record}, status_code=201)

    async def label_image(self, product: str, label_id: str) -> Response:
        try:
            data = await asyncio.to_thread(self.labels_set.image, product, label_id)
        except (KeyError, StoreError):
            raise Refused(404, "unknown_label", f"no label {label_id!r} of {product!r}") from None
        return Response(data, media_type=image_media_type(data))

    async def delete_label(self, product: str, label_id: str) -> Response:
        try:
            await asyncio.to_thread(self.labels_set.delete, product, label_id)
        except StoreError as exc:
            raise Refused(400, "bad_request", str(exc)) from None
        return JSONResponse({"product": product, "deleted": label_id})

    # --- calibration view -----------------------------------------------------------------------
    async def calibration(self, product: str, false_alarm_rate: float | None) -> Response:
        """Out-of-fold good scores, the labelled set scored by the head, the threshold in force, and
        (``false_alarm_rate``) what the far rule and the labelled recall rule would choose at that rate."""
        if false_alarm_rate is not None:
            try:
                check_rate(false_alarm_rate)
            except ValueError as exc:
                raise Refused(400, "bad_request", f"false_alarm_rate: {exc}") from None
        version = await self.registry.head.remote(product)
        rec = await asyncio.to_thread(self.store.record, product, version)
        cal = rec.calibration
        op = rec.operating_point()
        labelled = await self._scored_labels(product, version)
        body: dict[str, Any] = {
            "product": product,
            "version": version,
            "oof_scores": [] if cal is None else list(cal.scores),
            "threshold": None if op is None else op.threshold,
            "threshold_rule": None if op is None else op.rule,
            "estimated_false_alarm_rate": None if op is None else op.false_alarm_rate,
            # the estimate's interval and how many good scores lie above (core/calibration.py)
            "false_alarm_estimate": None if op is None or op.estimate is None else op.estimate.to_json(),
            "heatmap_vmax": None if op is None else HEATMAP_VMAX_OVER_THRESHOLD * op.threshold,
            "labels": labelled,
        }
        if cal is not None:  # the far rule at a few rates, and the frames standing apart, beside the histogram
            body.update(await asyncio.to_thread(_calibration_facts, rec, list(rec.image_digests), labelled))
        if false_alarm_rate is not None and cal is not None:
            body["preview"] = _preview(cal, labelled, false_alarm_rate)
        return JSONResponse(body)

    async def _scored_labels(self, product: str, version: int) -> list[dict[str, Any]]:
        """Every label of ``product`` with its score at ``version`` (cached per version and label)."""
        records = await asyncio.to_thread(self.labels_set.records, product)
        missing = [r for r in records if (product, version, r["id"]) not in self._label_scores]
        if missing:
            images = await asyncio.to_thread(lambda: [self.labels_set.image(product, r["id"]) for r in missing])
            for r, result in zip(missing, await self._score(product, images), strict=True):
                self._label_scores[(product, version, r["id"])] = float(result["score"])
        return [{**r, "score": self._label_scores[(product, version, r["id"])]} for r in records]


def _recorded_item(product: str, row: dict[str, Any]) -> dict[str, Any]:
    """A record row (record/layout.py) in the shape of a ring item's summary (serve/recent.py)."""
    item = {
        "id": row["recent_id"] or f"{row['request_id']}-{row['image_digest'][:8]}",
        "product": product,
        "at": row["time"],
        "name": row["name"],
        "score": row["score"],
        "threshold": row["threshold"],
        "is_anomaly": row["is_anomaly"],
        "verdict": row["verdict"],
        "version": row["version"],
        "estimated_false_alarm_rate": row["expected_rate"],
        "label": row.get("label"),
        "recorded": True,
        "has_image": row["image_key"] is not None,
        "has_heatmap": False,
        "heatmap_version": None,
        "heatmap_scale": None,
    }
    if row["review_threshold"] is not None:
        item["review_threshold"] = row["review_threshold"]
    return item


def _calibration_facts(rec: Any, digests: list[str] | None, labelled: list[dict[str, Any]]) -> dict[str, Any]:
    """``rates``: the far rule at ``RATE_CHOICES`` on the out-of-fold scores, with the labelled
    defects' recall at each (``core.calibration.rate_choices``); ``outliers``: the good frames of the
    bank (``digests``, the manifest's) standing apart, the frames it holds more than once, and the
    threshold with and without each (``core/good_outliers.py``), None where the stored scores are
    not this bank's fold plan's."""
    from ..config import OUTLIER_MADS, RATE_CHOICES
    from ..core.calibration import rate_choices

    cal = rec.calibration
    bad = [x["score"] for x in labelled if x["label"] == "defective"]
    good = [x["score"] for x in labelled if x["label"] == "good"]
    rates = rate_choices(cal.scores, RATE_CHOICES, defective_scores=bad, good_scores=good)
    return {"rates": [c.to_json() for c in rates], "outliers": _outliers(rec, digests, OUTLIER_MADS)}


def _outliers(rec: Any, digests: list[str] | None, mads: float) -> dict[str, Any] | None:
    from ..core.good_outliers import outlier_report

    if not digests:
        return None
    try:
        return outlier_report(rec.calibration, rec.config, digests, mads=mads).to_json()
    except ValueError:  # a calibration not computed from this bank's fold plan (an older store)
        return None


def _preview(cal: Calibration, labelled: list[dict[str, Any]], rate: float) -> dict[str, Any]:
    """At false-alarm rate ``rate``: the far rule's threshold on the out-of-fold good scores, and the
    labelled recall rule's (what ``/calibrate`` with ``store:labels``, objective recall, would store)."""
    from ..core.calibration import TailModel
    from ..workflows.validation import choose_threshold

    def on_labels(threshold: float) -> dict[str, Any]:
        bad = [x["score"] for x in labelled if x["label"] == "defective"]
        good = [x["score"] for x in labelled if x["label"] == "good"]
        return {
            "threshold": threshold,
            "recall": sum(s > threshold for s in bad) / len(bad) if bad else None,
            "good_flagged": sum(s > threshold for s in good) / len(good) if good else None,
            "defective": len(bad),
            "good": len(good),
        }

    far = cal.operating_point("far", false_alarm_rate=rate)
    out: dict[str, Any] = {
        "false_alarm_rate": rate,
        "far": {
            **on_labels(far.threshold),
            "estimated": far.false_alarm_rate,
            "estimate": None if far.estimate is None else far.estimate.to_json(),
        },
    }
    labels = [int(x["label"] == "defective") for x in labelled]
    if 0 < sum(labels) < len(labels):
        chosen = choose_threshold([x["score"] for x in labelled], labels, objective="recall", max_false_alarm_rate=rate)
        t = float(chosen["threshold"])
        est = TailModel(cal.scores).estimate(t)
        out["labelled"] = {**on_labels(t), "estimated": est.rate, "estimate": est.to_json()}
    out["computed_at"] = time.time()
    return out

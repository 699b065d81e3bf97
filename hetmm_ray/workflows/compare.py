"""Compare two stored versions of a product on the same images (``hetmm compare`` and
``POST /v1/products/{p}/versions/{v}/compare``).

Exact semantics of :func:`compare_versions`:

- ``base`` (default: HEAD) and ``candidate`` are loaded from the store as they would serve
  (``detector_choice.load_detector``: a tiled product as its :class:`~hetmm_ray.detection.tiled.TiledHETMM`), and each
  image is scored by both, each under its own stored threshold rule (the same scores and verdicts
  ``hetmm predict --version`` gives). Images are decoded once and scored in chunks of
  :data:`CHUNK` (memory stays bounded; maps are kept only for flips).
- A *flip* is an image whose ``is_anomaly`` differs between the two versions. Each flip lists the
  image's name, each version's result record of it (hetmm_ray/result.py: score, threshold,
  ``is_anomaly``, the verdict ``ok | review | reject`` with that version's review band, its rule and
  version), the label when given, and
  (``maps=True``) both heat-maps as RGB overlays on the image, each on its version's own fixed
  colour scale (``visualize.heatmap_range``). Flips are listed in input order.
- ``score_shift``: the quantiles :data:`QUANTILES` of each version's scores over the set and of the
  per-image difference (candidate - base), ``numpy.quantile`` (linear interpolation).
- ``false_alarm_rate``: per version, ``estimated`` = the out-of-fold estimate of its threshold rule
  (the rate stored with the version; None without a calibration) and ``flagged_share`` = the share
  of the set it flags (over the good images only when labels are given: there it is the measured
  false-alarm rate).
- With ``labels`` (1 = defective, 0 = good; one per image): per version ``recall`` (defective
  images flagged / defective images; None without any) and ``false_alarm_rate`` (good images
  flagged / good images; None without any).

Nothing is published or changed: this reads the store only. core/ and the detector never see Ray.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from ..result import result_record, review_threshold_of

if TYPE_CHECKING:
    from ..store.protocol import Store

__all__ = [
    "CHUNK",
    "QUANTILES",
    "as_json",
    "compare_versions",
    "overlay_png",
    "parse_time",
    "record_images",
    "scored_sides",
    "summarise",
]

CHUNK = 16  # images scored per predict call on each side: bounds the maps held at once
QUANTILES = (0.0, 0.1, 0.5, 0.9, 0.99, 1.0)


def parse_time(value: Any) -> float | None:
    """A time-range bound: None, unix seconds, or ISO 8601 (a time without a zone is UTC)."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value)
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r}: give unix seconds or an ISO 8601 time (2026-11-27T03:00:00)") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def record_images(
    store: Store, product: str, since: float | None, until: float | None
) -> tuple[list[tuple[str, bytes]], list[int] | None]:
    """The images the product's inspection record kept in ``[since, until)`` (encoded, named
    ``<time>/<name>``) and, when a person labelled every one of them, their labels (1 = defective).
    Reads through ``record/reader.py`` (pyarrow), imported here so that scoring alone never needs it."""
    from ..record.reader import recorded_images

    rows = recorded_images(store.backend, product, since=since, until=until)
    images = [(f"{row['time']:.3f}/{row.get('name') or 'image'}", data) for row, data in rows]
    labels = [row.get("label") for row, _ in rows]
    if rows and all(label in ("good", "defective") for label in labels):
        return images, [int(label == "defective") for label in labels]
    return images, None


def _map(pred: Any, i: int) -> np.ndarray:
    return np.asarray(pred.maps[i])


def _region(pred: Any, i: int) -> np.ndarray | None:
    return None if pred.regions is None else np.asarray(pred.regions[i])


def overlay_png(image: np.ndarray, amap: np.ndarray, threshold: float, region: np.ndarray | None) -> bytes:
    """A heat-map overlay as PNG bytes, on the version's fixed colour scale."""
    from PIL import Image

    from ..visualize import draw_overlay

    out = io.BytesIO()
    Image.fromarray(draw_overlay(image, amap, threshold=threshold, region=region)).save(out, format="PNG")
    return out.getvalue()


def scored_sides(
    base_det: Any, cand_det: Any, images: Sequence[np.ndarray], *, maps: bool
) -> tuple[list[np.ndarray], list[np.ndarray], list[float], list[dict[str, Any]]]:
    """Scores and verdicts of ``images`` under both detectors, their thresholds, and the flips
    (index, both sides' maps and regions when ``maps``); see the module docstring."""
    scores: list[list[float]] = [[], []]
    verdicts: list[list[bool]] = [[], []]
    thresholds = [float("inf"), float("inf")]
    flips: list[dict[str, Any]] = []
    for start in range(0, len(images), CHUNK):
        chunk = images[start : start + CHUNK]
        preds = [det.predict([det.input_view(img) for img in chunk]) for det in (base_det, cand_det)]
        for side, pred in enumerate(preds):
            scores[side].extend(float(s) for s in pred.scores)
            verdicts[side].extend(bool(v) for v in pred.is_anomaly)
            thresholds[side] = float(pred.threshold)
        for i in range(len(chunk)):
            if bool(preds[0].is_anomaly[i]) == bool(preds[1].is_anomaly[i]):
                continue
            flip: dict[str, Any] = {"index": start + i}
            if maps:
                flip["maps"] = [(_map(p, i), _region(p, i)) for p in preds]
            flips.append(flip)
    return [np.asarray(s) for s in scores], [np.asarray(v, dtype=bool) for v in verdicts], thresholds, flips


def _quantiles(values: np.ndarray) -> list[float | None]:
    if values.size == 0:
        return [None] * len(QUANTILES)
    return [round(float(q), 6) for q in np.quantile(values.astype(np.float64), QUANTILES)]


def _share(flags: np.ndarray) -> float | None:
    return None if flags.size == 0 else round(float(flags.mean()), 6)


def compare_versions(
    store: Store,
    product: str,
    candidate: int,
    images: Sequence[tuple[str, np.ndarray]],
    labels: Sequence[int] | None = None,
    *,
    base: int | None = None,
    maps: bool = True,
    map_size: int | None = None,
) -> dict[str, Any]:
    """``base`` (default HEAD) and ``candidate`` of ``product`` side by side on decoded ``images``
    (``(name, RGB uint8 array)``); see the module docstring. With ``maps`` each flip carries
    ``heatmaps``: ``{"base": PNG bytes, "candidate": PNG bytes}``. ``map_size``: a tiled product's
    maps at most this long side (as the service's ``map_size``)."""
    from ..detection.detector_choice import load_detector

    if labels is not None and len(labels) != len(images):
        raise ValueError(f"{len(labels)} labels for {len(images)} images")
    base = store.head(product) if base is None else int(base)
    options: dict[str, Any] = {} if map_size is None else {"map_size": map_size}
    base_det = load_detector(store, product, base, **options)
    cand_det = load_detector(store, product, candidate, **options)
    arrays = [img for _, img in images]
    (s0, s1), (f0, f1), (t0, t1), flips = scored_sides(base_det, cand_det, arrays, maps=maps)
    ops = (base_det.operating_point(), cand_det.operating_point())
    reviews = (review_threshold_of(base_det), review_threshold_of(cand_det))
    names = [name for name, _ in images]
    out = summarise(product, (base, int(candidate)), names, (s0, s1), (f0, f1), (t0, t1), ops, labels, reviews=reviews)
    if maps:
        for row, flip in zip(out["flips"], flips, strict=True):  # both in input order
            i = flip["index"]
            (m0, r0), (m1, r1) = flip["maps"]
            row["heatmaps"] = {
                "base": overlay_png(arrays[i], m0, t0, r0),
                "candidate": overlay_png(arrays[i], m1, t1, r1),
            }
    return out


def summarise(
    product: str,
    versions: tuple[int, int],
    names: Sequence[str],
    scores: tuple[np.ndarray, np.ndarray],
    flags: tuple[np.ndarray, np.ndarray],
    thresholds: tuple[float, float],
    ops: tuple[Any, Any],
    labels: Sequence[int] | None = None,
    *,
    reviews: tuple[float | None, float | None] = (None, None),
) -> dict[str, Any]:
    """The comparison of two versions' scores and verdicts on the same images, in input order
    (module docstring), without heat-maps: what :func:`compare_versions` returns in one process and
    ``archive.compare_archive`` on Ray Data. ``ops``: each version's operating point (None: uncalibrated);
    ``reviews``: each version's review threshold (``result.review_threshold_of``; None: no band). A flip's
    sides are each version's result record of the image (``result.result_record``)."""
    (s0, s1), (f0, f1), (t0, t1) = scores, flags, thresholds
    estimated = [None if op is None else op.false_alarm_rate for op in ops]
    lab = None if labels is None else np.asarray([int(v) for v in labels], dtype=bool)
    good = np.ones(len(names), dtype=bool) if lab is None else ~lab
    out: dict[str, Any] = {
        "product": product,
        "base": versions[0],
        "candidate": versions[1],
        "images": len(names),
        "threshold": {"base": round(t0, 6), "candidate": round(t1, 6)},
        "flagged": {"base": int(f0.sum()), "candidate": int(f1.sum())},
        "false_alarm_rate": {
            side: {"estimated": est, "flagged_share": _share(fl[good])}
            for side, est, fl in (("base", estimated[0], f0), ("candidate", estimated[1], f1))
        },
        "score_shift": {
            "quantiles": list(QUANTILES),
            "base": _quantiles(s0),
            "candidate": _quantiles(s1),
            "difference": _quantiles(s1 - s0),
        },
        "flips": [],
    }
    if lab is not None:
        out["labelled"] = {
            "good": int(good.sum()),
            "defective": int(lab.sum()),
            **{
                side: {"recall": _share(fl[lab]), "false_alarm_rate": _share(fl[good])}
                for side, fl in (("base", f0), ("candidate", f1))
            },
        }
    for i in np.flatnonzero(f0 != f1).tolist():
        row: dict[str, Any] = {"image": names[i]}
        for side, score, threshold, op, review, version in zip(
            ("base", "candidate"), (s0[i], s1[i]), (t0, t1), ops, reviews, versions, strict=True
        ):
            row[side] = result_record(
                score=score, threshold=threshold, review_threshold=review, operating_point=op, version=version
            )
        if lab is not None:
            row["label"] = int(lab[i])
        out["flips"].append(row)
    return out


def as_json(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with each flip's heat-map PNGs as ``data:image/png;base64`` URLs (for JSON)."""
    flips = []
    for flip in result["flips"]:
        row = dict(flip)
        if "heatmaps" in row:
            row["heatmaps"] = {
                k: "data:image/png;base64," + base64.b64encode(v).decode() for k, v in row["heatmaps"].items()
            }
        flips.append(row)
    return {**result, "flips": flips}

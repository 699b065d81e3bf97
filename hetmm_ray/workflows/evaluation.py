"""Evaluate a detector on an MVTec-layout folder (docs/design.md: ``hetmm evaluate``).

The layout is checked before any work (:meth:`MVTecCategory.measurable_samples`): good and
defective test images, and masks for every defect type or for none. A set without masks (image
labels only) is measured on its images: image AUROC, the operating point and the score
summaries; ``pixel_auroc`` and ``pro`` are then ``None`` (JSON ``null``) and the table says
"absent", never an error after the fit.

Every test image is also one row of :attr:`EvaluationResult.images` (JSON ``images``), in the
evaluation's order: ``path``, ``defect_type`` (``good`` or the defect type's folder), ``score``
(the image score as computed, unrounded), ``is_anomaly`` (score above the threshold) and ``verdict``
(the result record's word, ``ok | review | reject``, with the product's review band: result.py); the
image AUROC is exactly ``core.metrics.image_auroc`` of the rows' scores against ``defect_type !=
"good"``. With a :class:`~hetmm_ray.report.collect.ReportCollector` (``evaluate --report``) each
frame is also offered to it as it is scored, and the PRO curve handed to it at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ..config import STREAM_FRAMES, DetectorConfig
from ..core.calibration import best_f1_cut, labelled_cuts, recall_cut
from ..core.metrics import image_auroc, pro_area
from ..core.pixel_metrics import PixelMetrics
from ..data.decode import decode_image, resize_to_geometry
from ..data.mvtec import MVTecCategory, Sample
from ..detection.detector_choice import new_detector
from ..detection.geometry_rule import choose_geometry
from ..detection.interface import Detector, frame_grid, stream_chunk, tiles_per_frame
from ..report.collect import ReportCollector
from ..result import result_records, review_threshold_of

__all__ = ["EvaluationResult", "evaluate", "load_images"]


def load_images(
    paths: Sequence[Path], size: int, *, progress: bool = False, desc: str = "decode", geometry: str = "squash"
) -> list[np.ndarray]:
    """Decode and resize images as ``geometry`` brings them to the backbone (the detector then
    resizes nothing); a bad file raises ImageError naming it."""
    with tqdm(paths, desc=desc, disable=not progress, leave=False) as bar:  # closed before any error prints
        return [resize_to_geometry(decode_image(p), size, geometry) for p in bar]


@dataclass(frozen=True)
class EvaluationResult:
    category: str
    backbone: str
    weights: str
    templates: str
    sheets: int
    n_train: int
    n_test: int
    image_auroc: float  # percent
    pixel_auroc: float | None  # percent; None for a set without pixel masks
    pro: float | None  # percent; None for a set without pixel masks
    images_per_s: float  # test images, decode + backbone + ATMM
    fit_seconds: float
    threshold: float
    true_positives: int
    false_positives: int
    true_negatives: int
    false_negatives: int
    # The operating point at the calibrated threshold (percent of the test images):
    recall: float = 0.0  # defective test images flagged
    false_alarm_rate: float = 0.0  # good test images flagged
    threshold_rule: str = ""  # far / sigmas / validation
    rule_target: float | None = None  # the far rule's rate (fraction) or the sigmas rule's k
    estimated_false_alarm_rate: float | None = None  # percent, from the out-of-fold training scores
    best_f1: float = 0.0  # percent, at the test set's best threshold (an upper bound, not a setting)
    recall_at_1pct_false_alarms: float = 0.0  # percent, best threshold flagging <= 1% of good test images
    recall_at_5pct_false_alarms: float = 0.0
    # Score distributions side by side: out-of-fold training scores and the test scores.
    score_summary: dict[str, dict[str, float]] = field(default_factory=dict)
    # Tiled products (hetmm_ray/detection/tiled.py): the grid and tiles scored per second (images_per_s is
    # then frames/s). None for untiled products, whose JSON and table stay as they were.
    tiles: tuple[int, int] | None = None
    tiles_per_s: float | None = None
    # Why the threshold may flag few defects (core/scoring.OperatingPoint.warning); None (and left
    # out of the JSON, which stays as it was) when it lies among the good images' scores.
    threshold_warning: str | None = None
    # One row per test image (module docstring): path, defect_type, score, is_anomaly, verdict.
    images: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if self.tiles is None:
            del out["tiles"], out["tiles_per_s"]
        if self.threshold_warning is None:
            del out["threshold_warning"]
        return out

    def table(self) -> str:
        rows = [
            ("category", self.category),
            ("backbone", f"{self.backbone} ({self.weights})"),
            ("templates", f"{self.templates}, {self.sheets} sheets"),
            ("images", f"{self.n_train} train / {self.n_test} test"),
            ("image AUROC", f"{self.image_auroc:.1f}"),
            ("pixel AUROC", _percent_or_absent(self.pixel_auroc)),
            ("PRO", _percent_or_absent(self.pro)),
            ("images/s", f"{self.images_per_s:.2f}"),
            *self._tile_rows(),
            ("threshold", f"{self.threshold:.4f} ({self._rule()}, from good images only)"),
            *([("warning", self.threshold_warning)] if self.threshold_warning else []),
            (
                "verdicts",
                f"TP {self.true_positives}  FP {self.false_positives}  "
                f"TN {self.true_negatives}  FN {self.false_negatives}",
            ),
            ("recall", f"{self.recall:.1f}% of defective test images flagged"),
            ("false alarms", f"{self.false_alarm_rate:.1f}% of good test images flagged"),
            ("best F1", f"{self.best_f1:.1f} (at the test set's own best threshold)"),
            ("recall @1% FA", f"{self.recall_at_1pct_false_alarms:.1f}"),
            ("recall @5% FA", f"{self.recall_at_5pct_false_alarms:.1f}"),
            *((f"scores {k}", _summary_line(v)) for k, v in self.score_summary.items()),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def _tile_rows(self) -> list[tuple[str, str]]:
        if self.tiles is None:
            return []
        r, c = self.tiles
        return [("tiles", f"{r} x {c} per frame"), ("tiles/s", f"{self.tiles_per_s:.2f} (images/s above: frames)")]

    def _rule(self) -> str:
        est = self.estimated_false_alarm_rate
        tail = "" if est is None else f", estimated false alarms {est:.2f}%"
        target = ""
        if self.threshold_rule == "far" and self.rule_target is not None:
            target = f" {100 * self.rule_target:g}%"
        elif self.threshold_rule == "sigmas" and self.rule_target is not None:
            target = f" {self.rule_target:g}"
        return f"rule {self.threshold_rule}{target}{tail}"


def _percent_or_absent(value: float | None) -> str:
    return "absent (no ground-truth masks: image labels only)" if value is None else f"{value:.1f}"


def _summary_line(s: dict[str, float]) -> str:
    return f"n {int(s['n'])}  min {s['min']:.4f}  median {s['median']:.4f}  p90 {s['p90']:.4f}  max {s['max']:.4f}"


def score_summary(scores: Sequence[float]) -> dict[str, float]:
    """n, min, median, 90th percentile and max of ``scores`` (numpy's linear quantiles)."""
    a = np.asarray(scores, dtype=np.float64)
    if a.size == 0:
        return {"n": 0, "min": float("nan"), "median": float("nan"), "p90": float("nan"), "max": float("nan")}
    return {
        "n": int(a.size),
        "min": float(a.min()),
        "median": float(np.median(a)),
        "p90": float(np.quantile(a, 0.9)),
        "max": float(a.max()),
    }


def _view(det: Detector, path: Path) -> np.ndarray:
    """The frame at ``path`` as ``det`` saw it (``Detector.input_view``)."""
    return det.input_view(decode_image(path))


def evaluate(
    data: str | Path,
    config: DetectorConfig,
    *,
    progress: bool = False,
    map_size: int | None = None,
    report: ReportCollector | None = None,
    announce: Callable[[str], None] | None = None,
) -> tuple[EvaluationResult, Detector, list[Sample]]:
    """Fit on ``train/good``, score ``test/``, and measure AUROCs, PRO and speed.

    With an inspection region (``config.region``) the image scores and the pixel metrics count
    the region's pixels only (``Prediction.regions``). A tiled configuration (``geometry.tiles``,
    ``"auto"`` resolved from the training frames) is fit and scored by
    :class:`~hetmm_ray.detection.tiled.TiledHETMM` on the frames at their own resolution; its maps (and so
    the pixel metrics) are at the frame's resolution, or ``map_size`` (long side). ``report``: a
    collector offered every frame (its map, mask and region) as it is scored (module docstring).
    ``announce``: called, before the fit, with the line saying what the geometry rule chose for the
    training frames and why (``GeometryChoice.describe``), when it chose anything."""
    category = MVTecCategory(data)
    samples = category.measurable_samples()  # the layout, checked before minutes of fitting
    train = category.train_paths()
    t0 = time.perf_counter()
    # the files: the detector decodes them (frames' digests, as every path stores) and
    # brings them to its canvas or cuts its tiles (the geometry resolved from the frames' headers)
    choice = choose_geometry(config, train)
    if announce is not None and choice.describe():
        announce(choice.describe())
    det = new_detector(choice.config, progress=progress, map_size=map_size)
    det.fit(train)
    config = det.config
    fit_s = time.perf_counter() - t0

    # Streamed: frames scored STREAM_FRAMES at a time (a multiple of what predict batches,
    # so every score is the one a single call gives), each map reduced into the pixel metrics as it
    # comes (core/pixel_metrics.py: exact while small, binned with a stated bound beyond); nothing
    # holds all frames or all maps. Masks at each map's shape, resized like the image.
    labels = np.array([s.label for s in samples])
    pixels = PixelMetrics() if category.has_pixel_masks else None
    chunk = stream_chunk(config, STREAM_FRAMES)
    scores: list[float] = []
    flagged: list[bool] = []
    words: list[str] = []  # the result record's verdict of each row (result.py), the review band included
    review = review_threshold_of(det)
    elapsed = 0.0
    for i in range(0, len(samples), chunk):
        part = samples[i : i + chunk]
        t0 = time.perf_counter()
        pred = det.predict([s.path for s in part])
        elapsed += time.perf_counter() - t0
        scores.extend(pred.scores.tolist())
        flagged.extend(bool(v) for v in pred.is_anomaly)
        words.extend(r["verdict"] for r in result_records(pred, review_threshold=review))
        if pixels is not None or report is not None:
            regions = pred.regions if pred.regions is not None else [None] * len(part)
            for k, (s, m, r) in enumerate(zip(part, pred.maps, regions, strict=True)):
                mask = category.load_mask(s, m.shape) if pixels is not None else None
                if pixels is not None:
                    pixels.add(m, mask, r)  # a region: only its pixels count
                if report is not None:
                    report.offer(
                        path=str(s.path),
                        defect_type=s.defect_type,
                        label=s.label,
                        score=float(pred.scores[k]),
                        is_anomaly=bool(pred.is_anomaly[k]),
                        amap=m,
                        threshold=float(pred.threshold),
                        frame=partial(_view, det, s.path),  # decoded again only if it enters the gallery
                        mask=mask,
                        region=r,
                    )
    pixel_auroc_pct = pro_pct = None
    if pixels is not None:
        pixel_auroc_pct = 100 * pixels.pixel_auroc()
        if report is None:
            pro_pct = 100 * pixels.pro()
        else:  # the curve once: the figure is its area, as pixels.pro() computes it
            fpr, pro = pixels.pro_curve()
            pro_pct = 100 * pro_area(fpr, pro, pixels.fpr_limit)
            report.set_pro_curve(fpr, pro, pixels.fpr_limit)
    verdict = np.array(flagged, dtype=bool)
    op = pred.operating_point
    cuts = labelled_cuts(scores, labels.tolist())
    good_n = max(int((labels == 0).sum()), 1)
    bad_n = max(int((labels == 1).sum()), 1)
    cal, fitted = det.calibration, det.template_set()
    # the keys of a tiled evaluation only: an untiled one's JSON stays as it always was
    tiles = tiles_per_frame(config)
    tiled = {"tiles": frame_grid(config), "tiles_per_s": len(samples) * tiles / elapsed} if tiles > 1 else {}
    result = EvaluationResult(
        category=category.name,
        backbone=config.backbone.name,
        weights=fitted.weights_id,
        templates=config.templates.kind,
        sheets=fitted.sheets,
        n_train=len(train),
        n_test=len(samples),
        image_auroc=100 * image_auroc(np.asarray(scores, dtype=np.float32), labels),
        pixel_auroc=pixel_auroc_pct,
        pro=pro_pct,
        images_per_s=len(samples) / elapsed,
        fit_seconds=fit_s,
        threshold=pred.threshold,
        true_positives=int((verdict & (labels == 1)).sum()),
        false_positives=int((verdict & (labels == 0)).sum()),
        true_negatives=int((~verdict & (labels == 0)).sum()),
        false_negatives=int((~verdict & (labels == 1)).sum()),
        recall=100 * int((verdict & (labels == 1)).sum()) / bad_n,
        false_alarm_rate=100 * int((verdict & (labels == 0)).sum()) / good_n,
        threshold_rule=op.rule if op else "none",
        rule_target=op.target if op else None,
        estimated_false_alarm_rate=None if op is None or op.false_alarm_rate is None else 100 * op.false_alarm_rate,
        best_f1=100 * best_f1_cut(cuts).f1,
        recall_at_1pct_false_alarms=100 * recall_cut(cuts, 0.01).recall,
        recall_at_5pct_false_alarms=100 * recall_cut(cuts, 0.05).recall,
        threshold_warning=None if op is None else op.warning(),
        images=[
            {"path": str(s.path), "defect_type": s.defect_type, "score": score, "is_anomaly": flag, "verdict": word}
            for s, score, flag, word in zip(samples, scores, flagged, words, strict=True)
        ],
        score_summary={
            "out-of-fold train": score_summary(cal.scores if cal else []),
            "test good": score_summary(np.asarray(scores, dtype=np.float32)[labels == 0]),
            "test defective": score_summary(np.asarray(scores, dtype=np.float32)[labels == 1]),
        },
        **tiled,  # type: ignore[arg-type]
    )
    return result, det, samples

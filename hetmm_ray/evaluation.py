"""Evaluate a detector on an MVTec-layout folder (DESIGN.md: ``hetmm evaluate``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from .config import DetectorConfig
from .core.metrics import image_auroc, pixel_auroc, pro_score
from .data.decode import decode_image, resize_rgb
from .data.mvtec import MVTecCategory, Sample
from .detector import HETMM

__all__ = ["EvaluationResult", "evaluate", "load_images"]


def load_images(paths: Sequence[Path], size: int, *, progress: bool = False, desc: str = "decode") -> list[np.ndarray]:
    """Decode and resize images; a bad file raises ImageError naming it."""
    with tqdm(paths, desc=desc, disable=not progress, leave=False) as bar:  # closed before any error prints
        return [resize_rgb(decode_image(p), size) for p in bar]


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
    pixel_auroc: float  # percent
    pro: float  # percent
    images_per_s: float  # test images, decode + backbone + ATMM
    fit_seconds: float
    threshold: float
    true_positives: int
    false_positives: int
    true_negatives: int
    false_negatives: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        rows = [
            ("category", self.category),
            ("backbone", f"{self.backbone} ({self.weights})"),
            ("templates", f"{self.templates}, {self.sheets} sheets"),
            ("images", f"{self.n_train} train / {self.n_test} test"),
            ("image AUROC", f"{self.image_auroc:.1f}"),
            ("pixel AUROC", f"{self.pixel_auroc:.1f}"),
            ("PRO", f"{self.pro:.1f}"),
            ("images/s", f"{self.images_per_s:.2f}"),
            ("threshold", f"{self.threshold:.4f} (from good images only)"),
            (
                "verdicts",
                f"TP {self.true_positives}  FP {self.false_positives}  "
                f"TN {self.true_negatives}  FN {self.false_negatives}",
            ),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def evaluate(
    data: str | Path, config: DetectorConfig, *, progress: bool = False
) -> tuple[EvaluationResult, HETMM, list[Sample]]:
    """Fit on ``train/good``, score ``test/``, and measure AUROCs, PRO and speed."""
    category = MVTecCategory(data)
    size = config.backbone.image_size
    det = HETMM(config, progress=progress)
    t0 = time.perf_counter()
    det.fit(load_images(category.train_paths(), size, progress=progress, desc="decode train"))
    fit_s = time.perf_counter() - t0

    samples = category.test_samples()
    t0 = time.perf_counter()
    pred = det.predict(load_images([s.path for s in samples], size, progress=progress, desc="decode test"))
    elapsed = time.perf_counter() - t0

    out = pred.maps.shape[-1]
    labels = np.array([s.label for s in samples])
    masks = np.stack([category.load_mask(s, out) for s in samples])
    verdict = pred.is_anomaly
    result = EvaluationResult(
        category=category.name,
        backbone=config.backbone.name,
        weights=det.backbone.weights_id,
        templates=config.templates.kind,
        sheets=det.templates.sheets if det.templates else 0,
        n_train=len(category.train_paths()),
        n_test=len(samples),
        image_auroc=100 * image_auroc(pred.scores, labels),
        pixel_auroc=100 * pixel_auroc(pred.maps, masks),
        pro=100 * pro_score(pred.maps, masks),
        images_per_s=len(samples) / elapsed,
        fit_seconds=fit_s,
        threshold=pred.threshold,
        true_positives=int((verdict & (labels == 1)).sum()),
        false_positives=int((verdict & (labels == 0)).sum()),
        true_negatives=int((~verdict & (labels == 0)).sum()),
        false_negatives=int((~verdict & (labels == 1)).sum()),
    )
    return result, det, samples

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
from .data.decode import decode_image, resize_to_geometry
from .data.mvtec import MVTecCategory, Sample
from .detector import HETMM

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
    size, geometry = config.backbone.image_size, config.backbone.geometry
    det = HETMM(config, progress=progress)
    t0 = time.perf_counter()
    det.fit(load_images(category.train_paths(), size, progress=progress, desc="decode train", geometry=geometry))
    fit_s = time.perf_counter() - t0

    samples = category.test_samples()
    t0 = time.perf_counter()
    test_images = load_images([s.path for s in samples], size, progress=progress, desc="decode test", geometry=geometry)
    pred = det.predict(test_images)
    elapsed = time.perf_counter() - t0

    # Masks at each map's shape (the image's own aspect for letterbox), resized like the image.
    labels = np.array([s.label for s in samples])
    masks = [category.load_mask(s, m.shape) for s, m in zip(samples, pred.maps, strict=True)]
    if isinstance(pred.maps, np.ndarray):
        masks = np.stack(masks)
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

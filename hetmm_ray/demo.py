"""The main job on embedded defaults: a generated product, end to end, in one process.

Generate a synthetic product (MVTec layout) -> fit -> publish to a local
directory store -> reload the head version -> predict the test images ->
write heat-map overlays -> print a summary with image/pixel AUROC.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from .config import DetectorConfig
from .core.backbone import WeightsError, weights_identity
from .core.metrics import image_auroc, pixel_auroc
from .data.mvtec import MVTecCategory
from .data.synthetic import write_mvtec_layout
from .detector import HETMM
from .evaluation import load_images
from .store import open_store
from .visualize import heatmap_overlay, save_png

__all__ = ["run_demo"]

PRODUCT = "synthetic-part"


def _usable_weights(config: DetectorConfig) -> tuple[DetectorConfig, str]:
    """The config to run with, and a label saying which weights it uses."""
    if config.backbone.is_random:
        return config, "RANDOM weights (seeded; scores show the pipeline, not real accuracy)"
    try:
        from .core.backbone import Backbone

        Backbone(config.backbone)
        return config, f"pretrained {config.backbone.name} ({weights_identity(config.backbone)})"
    except WeightsError as exc:
        print(f"NOTE: pretrained weights unavailable: {exc}", file=sys.stderr)
        print(
            "NOTE: continuing with SEEDED RANDOM weights: the demo shows the pipeline; its scores are not "
            "those of a pretrained backbone.",
            file=sys.stderr,
        )
        random_cfg = replace(config, backbone=replace(config.backbone, weights="random"))
        return random_cfg, "RANDOM weights (seeded; pretrained weights could not be had)"


def run_demo(out: Path, *, config: DetectorConfig | None = None, n_train: int = 30) -> dict[str, float]:
    t_start = time.perf_counter()
    config, weights_label = _usable_weights(config or DetectorConfig())
    size = config.backbone.image_size
    data = write_mvtec_layout(out / "data", n_train=n_train, n_test_good=6, n_test_per_defect=3, seed=0, size=size)
    category = MVTecCategory(data)
    print(
        f"[1/4] generated product in {data}: {n_train} good training images, {len(category.test_samples())} test images"
    )

    det = HETMM(config, progress=True)
    t0 = time.perf_counter()
    det.fit(load_images(category.train_paths(), size))
    store = open_store(out / "store")
    version = det.save(store, PRODUCT)
    fit_s = time.perf_counter() - t0
    print(f"[2/4] fitted and stored {PRODUCT} v{version} in {out / 'store'} ({fit_s:.1f}s, {weights_label})")

    served = HETMM.load(store, PRODUCT, progress=True)
    samples = category.test_samples()
    pred = served.predict(load_images([s.path for s in samples], size))
    maps_dir = out / "heatmaps"
    vmax = float(np.quantile(pred.maps, 0.999))
    for s, m in zip(samples, pred.maps, strict=True):
        image = load_images([s.path], size)[0]
        save_png(heatmap_overlay(image, m, vmin=0.0, vmax=vmax), maps_dir / f"{s.defect_type}_{s.path.stem}.png")
    print(f"[3/4] scored {len(samples)} images with v{pred.version}; heat-maps in {maps_dir}")

    labels = np.array([s.label for s in samples])
    masks = np.stack([category.load_mask(s, pred.maps.shape[-1]) for s in samples])
    summary = {
        "image_auroc": 100 * image_auroc(pred.scores, labels),
        "pixel_auroc": 100 * pixel_auroc(pred.maps, masks),
        "images_per_s": len(samples) / pred.seconds,
        "threshold": pred.threshold,
        "version": float(pred.version or 0),
    }
    print("[4/4] summary")
    print(f"  weights      {weights_label}")
    print(f"  {'image':<22} {'type':<8} {'score':>8}  verdict")
    for s, score, flag in zip(samples, pred.scores, pred.is_anomaly, strict=True):
        print(f"  {s.path.name:<22} {s.defect_type:<8} {score:8.4f}  {'ANOMALY' if flag else 'ok'}")
    correct = int((pred.is_anomaly == (labels == 1)).sum())
    print(f"  threshold    {pred.threshold:.4f} (calibrated on good training images only)")
    print(f"  verdicts     {correct}/{len(samples)} correct")
    print(f"  image AUROC  {summary['image_auroc']:.1f}   pixel AUROC {summary['pixel_auroc']:.1f}")
    print(f"  speed        {summary['images_per_s']:.2f} images/s (backbone + ATMM, {served.device})")
    print(f"  total        {time.perf_counter() - t_start:.1f}s")
    return summary

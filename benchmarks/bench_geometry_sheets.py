"""Image geometry (squash vs letterbox) and ``templates.sheets: auto`` on real and synthetic products.

    python benchmarks/bench_geometry_sheets.py geometry   # image/pixel AUROC, PRO per geometry
    python benchmarks/bench_geometry_sheets.py sheets     # the auto ladder, chosen K, metrics vs ALL

Real mobilenet_v2 ImageNet weights from ../shared/weights; bottle and battery_weld from
../shared/data; the synthetic product of varied aspect (data/synthetic.py, ``aspect="varied"``:
centred bands of 40-100 % height) is written to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import BOTTLE, MOBILENET_WEIGHTS, SHARED, table

from hetmm_ray.config import DetectorConfig
from hetmm_ray.core.metrics import image_auroc, pixel_auroc, pro_score
from hetmm_ray.data.mvtec import MVTecCategory
from hetmm_ray.data.synthetic import write_mvtec_layout
from hetmm_ray.detector import HETMM
from hetmm_ray.evaluation import load_images

BATTERY = SHARED / "data" / "battery_weld"


def synthetic(n_train: int, n_good: int, per_defect: int, size: int) -> Path:
    root = Path(tempfile.gettempdir()) / f"hetmm-synthetic-varied-{n_train}-{n_good}-{per_defect}-{size}"
    if not (root / "ground_truth").exists():
        write_mvtec_layout(
            root, n_train=n_train, n_test_good=n_good, n_test_per_defect=per_defect, seed=11, size=size, aspect="varied"
        )
    return root


def dataset(name: str, args: argparse.Namespace) -> Path:
    return {"bottle": BOTTLE, "battery_weld": BATTERY}.get(name) or synthetic(
        args.synthetic_train, args.synthetic_good, args.synthetic_per_defect, args.synthetic_size
    )


def config(geometry: str, name: str, args: argparse.Namespace) -> DetectorConfig:
    """Defaults with real mobilenet_v2 weights; the synthetic product at its own (smaller) size."""
    size = args.synthetic_size if name == "synthetic" else 256
    return DetectorConfig.from_dict(
        {
            "backbone": {
                "name": "mobilenet_v2",
                "weights": str(MOBILENET_WEIGHTS),
                "geometry": geometry,
                "image_size": size,
            }
        }
    )


def scored(det: HETMM, category: MVTecCategory, images: list[np.ndarray]) -> dict[str, float]:
    samples = category.test_samples()
    t0 = time.perf_counter()
    pred = det.predict(images)
    seconds = time.perf_counter() - t0
    labels = np.array([s.label for s in samples])
    masks = [category.load_mask(s, m.shape) for s, m in zip(samples, pred.maps, strict=True)]
    if isinstance(pred.maps, np.ndarray):
        masks = np.stack(masks)
    return {
        "image_auroc": 100 * image_auroc(pred.scores, labels),
        "pixel_auroc": 100 * pixel_auroc(pred.maps, masks),
        "pro": 100 * pro_score(pred.maps, masks),
        "ms_per_image": 1000 * seconds / len(images),
    }


def fitted(path: Path, cfg: DetectorConfig) -> tuple[HETMM, MVTecCategory, list[np.ndarray]]:
    category = MVTecCategory(path)
    bb = cfg.backbone
    det = HETMM(cfg).fit(load_images(category.train_paths(), bb.image_size, geometry=bb.geometry))
    test = load_images([s.path for s in category.test_samples()], bb.image_size, geometry=bb.geometry)
    return det, category, test


def run_geometry(args: argparse.Namespace) -> list[dict[str, object]]:
    rows = []
    for name in args.datasets:
        for geometry in ("squash", "letterbox"):
            det, category, test = fitted(dataset(name, args), config(geometry, name, args))
            m = scored(det, category, test)
            rows.append({"dataset": name, "geometry": geometry, "train": det.templates.n_images, **m})
            print(json.dumps(rows[-1]), flush=True)
    print(
        table(
            ["dataset", "geometry", "train", "image AUROC", "pixel AUROC", "PRO", "ms/img"],
            [
                [
                    r["dataset"],
                    r["geometry"],
                    r["train"],
                    f"{r['image_auroc']:.1f}",
                    f"{r['pixel_auroc']:.2f}",
                    f"{r['pro']:.2f}",
                    f"{r['ms_per_image']:.0f}",
                ]
                for r in rows
            ],
        )
    )
    return rows


def run_sheets(args: argparse.Namespace) -> list[dict[str, object]]:
    out = []
    for name in args.datasets:
        det, category, test = fitted(dataset(name, args), config(args.geometry, name, args))
        reference = scored(det, category, test)
        t0 = time.perf_counter()
        det.progress = True  # prints each rung as it is measured
        det.compress("pts_o", "auto")
        det.progress = False
        compress_s = time.perf_counter() - t0
        auto = det.templates.meta["sheets_auto"]
        chosen = scored(det, category, test)
        rec = {"dataset": name, "train": det.templates.n_images, "all": reference, "auto": chosen,
               "compress_s": compress_s, "sheets_auto": auto}  # fmt: skip
        out.append(rec)
        print(json.dumps(rec), flush=True)
        print(f"\n{name} ({det.templates.n_images} good images, {args.geometry}): the ladder")
        print(
            table(
                ["K", "rank corr", "norm diff", "verdicts %", "OOF ms/img", "agrees"],
                [
                    [
                        r["sheets"],
                        f"{r['rank_corr']:.4f}",
                        f"{r['norm_diff']:.4f}",
                        f"{100 * r['verdict_agreement']:.1f}",
                        f"{r['ms_per_image']:.1f}",
                        "yes" if r["agrees"] else "no",
                    ]
                    for r in auto["ladder"]
                ]
                + [["ALL", "", "", "", f"{auto['all_ms_per_image']:.1f}", ""]],
            )
        )
        print(f"chosen K = {auto['chosen']} ({auto['why']}); ladder + selection {compress_s:.0f} s")
        print(
            table(
                ["templates", "sheets", "image AUROC", "pixel AUROC", "PRO", "predict ms/img"],
                [
                    [
                        "all",
                        det.templates.n_images,
                        *(f"{reference[k]:.2f}" for k in ("image_auroc", "pixel_auroc", "pro")),
                        f"{reference['ms_per_image']:.0f}",
                    ],
                    [
                        "pts_o auto",
                        auto["chosen"],
                        *(f"{chosen[k]:.2f}" for k in ("image_auroc", "pixel_auroc", "pro")),
                        f"{chosen['ms_per_image']:.0f}",
                    ],
                ],
            )
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("geometry", "sheets"))
    p.add_argument("--datasets", nargs="+", default=None, help="bottle, battery_weld, synthetic")
    p.add_argument("--geometry", default="letterbox", help="sheets: the geometry to run with")
    p.add_argument("--synthetic-train", type=int, default=None, help="good training images (geometry 150, sheets 600)")
    p.add_argument("--synthetic-good", type=int, default=40)
    p.add_argument("--synthetic-size", type=int, default=128, help="synthetic side and backbone image_size")
    p.add_argument("--synthetic-per-defect", type=int, default=20)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--json", help="write the records here")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.datasets is None:
        args.datasets = ["bottle", "battery_weld", "synthetic"] if args.what == "geometry" else ["bottle", "synthetic"]
    if args.synthetic_train is None:
        args.synthetic_train = 150 if args.what == "geometry" else 600
    rows = run_geometry(args) if args.what == "geometry" else run_sheets(args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

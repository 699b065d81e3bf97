"""Template selection on MVTec bottle: the paper's ablation (Table RTMM) and template-size sweep.

Features of the 209 training and 83 test images are extracted once (real
mobilenet_v2 weights from ../shared); then, for each selection, the tiny set is
selected, every test image is scored by ATMM, and image AUROC, pixel AUROC and
PRO are measured. images/s = decode + backbone (measured once) + ATMM (per
selection), on this machine.

    python benchmarks/bench_templates.py [--sheets 60] [--sweep 10 20 30 40 50 60] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BOTTLE, MOBILENET_WEIGHTS, describe, table

from hetmm_ray.config import BackboneConfig, DetectorConfig
from hetmm_ray.core.atmm import anomaly_maps, pixel_major
from hetmm_ray.core.metrics import image_auroc, pixel_auroc, pro_score
from hetmm_ray.core.pts import select_layer, select_templates
from hetmm_ray.core.scoring import gaussian_blur, image_scores
from hetmm_ray.data.mvtec import MVTecCategory
from hetmm_ray.detector import HETMM
from hetmm_ray.evaluation import load_images

KINDS = ("all", "ir", "pr", "pc_k", "pts_k", "pts_o")


def _templates(bank: torch.Tensor, kind: str, k: int) -> torch.Tensor:
    """The templates of selection ``kind`` (K sheets, seed 0) of one layer's bank."""
    chosen = select_layer(bank, kind, k, 0)
    if chosen.centres is not None:
        return chosen.centres
    return bank if chosen.indices is None else select_templates(bank, chosen.indices)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sheets", type=int, default=60)
    ap.add_argument("--sweep", type=int, nargs="*", default=[10, 20, 30, 40, 50, 60])
    ap.add_argument("--kinds", nargs="+", default=list(KINDS))
    ap.add_argument("--bank-dtype", default="float16", choices=("float16", "float32"))
    ap.add_argument("--json")
    args = ap.parse_args()
    if not (BOTTLE.is_dir() and MOBILENET_WEIGHTS.is_file()):
        raise SystemExit(f"needs {BOTTLE} and {MOBILENET_WEIGHTS}")

    config = DetectorConfig(backbone=BackboneConfig(name="mobilenet_v2", weights=str(MOBILENET_WEIGHTS)))
    det = HETMM(config)
    cat = MVTecCategory(BOTTLE)
    bank, _ = det.extract(load_images(cat.train_paths(), 256))
    bank = {k: v.to(getattr(torch, args.bank_dtype)) for k, v in bank.items()}
    samples = cat.test_samples()
    paths = [s.path for s in samples]
    t0 = time.perf_counter()
    test, _ = det.extract(load_images(paths, 256))
    front_s = (time.perf_counter() - t0) / len(paths)  # decode + resize + backbone, per image
    labels = np.array([s.label for s in samples])
    masks = np.stack([cat.load_mask(s, 256) for s in samples])
    sc = config.scoring

    def run(kind: str, k: int) -> list[object]:
        t0 = time.perf_counter()
        chosen = {layer: _templates(b.float(), kind, k) for layer, b in bank.items()}
        select_s = time.perf_counter() - t0
        pm = {layer: pixel_major(t.float()) for layer, t in chosen.items()}
        t0 = time.perf_counter()
        maps = torch.cat(
            [
                anomaly_maps(
                    {layer: v[i : i + 8] for layer, v in test.items()},
                    pm,
                    sc.forward_windows,
                    sc.backward_windows,
                    sc.alphas,
                    sc.layer_weights,
                    256,
                )
                for i in range(0, len(paths), 8)
            ]
        )
        atmm_s = (time.perf_counter() - t0) / len(paths)
        scores = image_scores(maps, sc.score_sigma).numpy()
        m = gaussian_blur(maps, sc.map_sigma).numpy()
        sheets = next(iter(chosen.values())).shape[0]
        return [
            kind,
            sheets,
            100 * image_auroc(scores, labels),
            100 * pixel_auroc(m, masks),
            100 * pro_score(m, masks),
            select_s,
            1000 * atmm_s,
            1 / (front_s + atmm_s),
        ]

    headers = ["templates", "sheets", "image AUROC", "pixel AUROC", "PRO", "select s", "ATMM ms/img", "images/s"]
    ablation = [run(kind, args.sheets) for kind in args.kinds]
    sweep = [run("pts_o", k) for k in args.sweep]
    print(
        f"device: {describe(torch.device('cpu'))}; bank {args.bank_dtype}; decode+backbone {1000 * front_s:.0f} ms/img"
    )
    print(f"\nselections at {args.sheets} sheets (paper Table RTMM):")
    print(table(headers, ablation))
    print("\npts_o template-size sweep:")
    print(table(headers, sweep))
    if args.json:
        Path(args.json).write_text(json.dumps({"headers": headers, "ablation": ablation, "sweep": sweep}, indent=1))


if __name__ == "__main__":
    main()

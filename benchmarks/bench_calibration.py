"""Cost of out-of-fold calibration (``HETMM.out_of_fold``) against the formula in ThresholdConfig.

Random unit features with mobilenet_v2's layer shapes at 256 px (24x64x64,
32x32x32, 96x16x16; fp16 bank), so no backbone runs: what is timed is the
calibration itself. For ALL the cost is one ATMM scoring per scored image against
~(1 - 1/folds) N templates, so seconds / (n_scored * K_fold) should be flat; for a
compressed selection it adds one selection per fold.

    python benchmarks/bench_calibration.py --sizes 50 100 200 --pts 100
"""

from __future__ import annotations

import argparse
import time

import torch

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig
from hetmm_ray.core.templates import TemplateSet
from hetmm_ray.detector import HETMM

SHAPES = {"features.3": (24, 64, 64), "features.6": (32, 32, 32), "features.13": (96, 16, 16)}


def bank(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for layer, (c, h, w) in SHAPES.items():
        x = torch.randn((n, c, h, w), generator=g)
        out[layer] = (x / x.norm(dim=1, keepdim=True)).to(torch.float16)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200])
    ap.add_argument("--pts", type=int, nargs="*", default=[100], help="sizes to also time with pts_o")
    ap.add_argument("--sheets", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print("| templates | N | folds | scored | K per fold | seconds | ms per scored image | us per (image x sheet) |")
    print("|---|---|---|---|---|---|---|---|")
    runs = [("all", n) for n in args.sizes] + [("pts_o", n) for n in args.pts]
    for kind, n in runs:
        config = DetectorConfig(
            backbone=BackboneConfig(name="mobilenet_v2", weights="random"),
            templates=TemplateConfig(kind=kind, sheets=args.sheets),
            device="cpu",
        )
        det = HETMM(config)
        ts = TemplateSet(bank=bank(n), config=config, weights_id="random", image_digests=tuple(map(str, range(n))))
        start = time.perf_counter()
        oof = det.out_of_fold(ts)
        seconds = time.perf_counter() - start
        scored = len(oof.scores)
        k = round(n * (1 - 1 / oof.folds)) if kind == "all" else args.sheets
        per = 1000 * seconds / scored
        pair = 1e6 * seconds / (scored * k)
        print(f"| {kind} | {n} | {oof.folds} | {scored} | {k} | {seconds:.1f} | {per:.1f} | {pair:.0f} |")


if __name__ == "__main__":
    main()

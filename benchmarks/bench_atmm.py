"""ATMM speed: one 256x256 query against the 209 bottle templates (mobilenet_v2 features).

Compares hetmm_ray's ATMM (one shared batched matmul per pixel group, both
directions) with a plain per-offset einsum over all templates, measured in the
same run, and reports achieved FLOP/s against the machine's measured matmul rate.

    python benchmarks/bench_atmm.py [--device cpu|cuda] [--runs 5] [--batch 1]

Uses the real bottle templates when ../shared is present, else random unit
features of the same shapes (speed does not depend on the values).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BOTTLE, MOBILENET_WEIGHTS, describe, matmul_rate, median_time, table

from hetmm_ray.core.atmm import anomaly_maps, pixel_major

WINDOWS = (9, 7, 5)
SHAPES = {"features.3": (24, 64, 64), "features.6": (32, 32, 32), "features.13": (96, 16, 16)}


def bottle_features(device: torch.device, n_templates: int) -> tuple[dict, dict, str]:
    if not (BOTTLE.is_dir() and MOBILENET_WEIGHTS.is_file()):
        g = torch.Generator().manual_seed(0)
        q = {k: F.normalize(torch.randn(1, *s, generator=g), dim=1) for k, s in SHAPES.items()}
        t = {k: F.normalize(torch.randn(n_templates, *s, generator=g), dim=1) for k, s in SHAPES.items()}
        return q, t, "random unit features (../shared absent)"
    from hetmm_ray.config import BackboneConfig, DetectorConfig
    from hetmm_ray.data.mvtec import MVTecCategory
    from hetmm_ray.detector import HETMM
    from hetmm_ray.evaluation import load_images

    cat = MVTecCategory(BOTTLE)
    det = HETMM(DetectorConfig(backbone=BackboneConfig(name="mobilenet_v2", weights=str(MOBILENET_WEIGHTS))))
    t, _ = det.extract(load_images(cat.train_paths()[:n_templates], 256))
    q, _ = det.extract(load_images([cat.test_samples()[-1].path], 256))
    return q, t, f"real bottle features ({n_templates} train images, mobilenet_v2)"


def einsum_baseline(query: dict, templates: dict) -> torch.Tensor:
    """Per-offset einsum over all templates: the obvious vectorisation of docs/algorithm.md §3."""
    maps = []
    for j, name in enumerate(query):
        q, t = query[name], templates[name]
        b, _, h, w = q.shape
        r = WINDOWS[j] // 2
        fwd = torch.full((b, h, w), -torch.inf)
        bwd = torch.full((b, h, w), -torch.inf)
        for dy in range(-r, r + 1):
            for dx in range(-r, r + 1):
                # query pixel x against template pixel x + d, where both are on the map
                qy, ty = slice(max(0, -dy), h - max(0, dy)), slice(max(0, dy), h - max(0, -dy))
                qx, tx = slice(max(0, -dx), w - max(0, dx)), slice(max(0, dx), w - max(0, -dx))
                if qy.start >= qy.stop or qx.start >= qx.stop:
                    continue
                s = torch.einsum("bchw,kchw->bkhw", q[:, :, qy, qx], t[:, :, ty, tx]).amax(1)
                fwd[:, qy, qx] = torch.maximum(fwd[:, qy, qx], s)
                bwd[:, ty, tx] = torch.maximum(bwd[:, ty, tx], s)
        layer = 0.5 * (1 - fwd) + 0.5 * (1 - bwd)
        maps.append(F.interpolate(layer[:, None], size=256, mode="bilinear", align_corners=True)[:, 0])
    return sum(maps)


def atmm_flops(query: dict, templates: dict) -> float:
    total = 0.0
    for j, name in enumerate(query):
        b, c, h, w = query[name].shape
        total += 2.0 * b * templates[name].shape[0] * c * h * w * WINDOWS[j] ** 2
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1, help="query images per call")
    ap.add_argument("--templates", type=int, default=209)
    ap.add_argument("--skip-baseline", action="store_true")
    args = ap.parse_args()
    device = torch.device(args.device)

    q, t, source = bottle_features(torch.device("cpu"), args.templates)
    q = {k: v.repeat(args.batch, 1, 1, 1) for k, v in q.items()}
    flops = atmm_flops(q, t)
    rows = []
    for dtype in (torch.float32,) + ((torch.float16, torch.bfloat16) if device.type == "cuda" else ()):
        qd = {k: v.to(device, dtype) for k, v in q.items()}
        pm = {k: pixel_major(v.to(device, dtype)) for k, v in t.items()}
        ours = median_time(
            lambda qd=qd, pm=pm: anomaly_maps(qd, pm, WINDOWS, WINDOWS, (0.5,) * 3, (1.0,) * 3, 256),
            runs=args.runs,
            device=device,
        )
        peak = matmul_rate(device, dtype)
        rows.append(
            [
                f"hetmm_ray ATMM ({str(dtype).removeprefix('torch.')})",
                ours / args.batch,
                flops / ours / 1e9,
                f"{100 * flops / ours / peak:.0f}%",
                peak / 1e9,
            ]
        )
    base = None
    if not args.skip_baseline:
        qc = {k: v.to(device) for k, v in q.items()}
        tc = {k: v.to(device) for k, v in t.items()}
        base = median_time(lambda: einsum_baseline(qc, tc), runs=max(1, args.runs // 2), device=device)
        pm32 = {k: pixel_major(v) for k, v in tc.items()}
        diff = (einsum_baseline(qc, tc) - anomaly_maps(qc, pm32, WINDOWS, WINDOWS, (0.5,) * 3, (1.0,) * 3, 256)).abs()
        print(f"check: max |baseline - ours| = {diff.max().item():.2e}")
        rows.append(["per-offset einsum baseline (float32)", base / args.batch, flops / base / 1e9, "", ""])
    print(f"device: {describe(device)}; inputs: {source}; batch {args.batch}; median of {args.runs} runs")
    print(f"ATMM work: {flops / 1e9:.2f} GFLOP per call (both directions share one product)")
    headers = ["method", "s / image", "GFLOP/s", "of matmul peak", "matmul GFLOP/s"]
    print(table(headers, rows))
    if base is not None:
        print(f"speed-up over the einsum baseline: {base / (rows[0][1] * args.batch):.1f}x")


if __name__ == "__main__":
    main()

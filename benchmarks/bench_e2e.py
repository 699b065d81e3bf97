"""End-to-end images/s: decode (PNG bytes) + resize + backbone + ATMM + score.

For each backbone and template count, a detector is given a bank of random
unit features of the right shapes (speed does not depend on the values, nor on
the weights: random weights are used), then predicts encoded images.

    python benchmarks/bench_e2e.py [--device cpu|cuda] [--runs 3] [--images 8]
        [--backbones mobilenet_v2 wide_resnet101_2] [--templates 60 209]
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BOTTLE, describe, matmul_rate, median_time, table

from hetmm_ray.config import BackboneConfig, DetectorConfig
from hetmm_ray.core.templates import TemplateSet
from hetmm_ray.detector import HETMM


def encoded_images(n: int) -> tuple[list[bytes], str]:
    if BOTTLE.is_dir():
        paths = sorted((BOTTLE / "test").rglob("*.png"))[:n]
        return [p.read_bytes() for p in paths], "bottle test PNGs (900x900)"
    from hetmm_ray.data.synthetic import SyntheticProduct

    product = SyntheticProduct(seed=0, size=900)
    out = []
    for i in range(n):
        buf = io.BytesIO()
        Image.fromarray(product.good(i)).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out, "synthetic PNGs (900x900)"


def detector_with_random_bank(backbone: str, n_templates: int, device: str, dtype: str, batch: int) -> HETMM:
    config = DetectorConfig(
        backbone=BackboneConfig(name=backbone, weights="random"), device=device, dtype=dtype, batch_size=batch
    )
    det = HETMM(config)
    g = torch.Generator().manual_seed(0)
    bank = {
        k: F.normalize(torch.randn(n_templates, *shape, generator=g), dim=1)
        for k, shape in det.backbone.feature_shapes().items()
    }
    det.scorer.install(
        TemplateSet(bank=bank, config=config, weights_id="random", image_digests=tuple(map(str, range(n_templates)))),
        0,
        config=det.config,
    )
    return det


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--images", type=int, default=8, help="images per timed call")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--backbones", nargs="+", default=["mobilenet_v2", "wide_resnet101_2"])
    ap.add_argument("--templates", nargs="+", type=int, default=[60, 209])
    args = ap.parse_args()
    device = torch.device(args.device)

    images, source = encoded_images(args.images)
    rows = []
    for name in args.backbones:
        for k in args.templates:
            det = detector_with_random_bank(name, k, args.device, args.dtype, args.batch)
            t = median_time(lambda det=det: det.predict(images), runs=args.runs, device=device)
            rows.append([name, k, len(images) / t, 1000 * t / len(images)])
    print(
        f"device: {describe(device)}; dtype {args.dtype}; inputs: {source}; batch {args.batch}; "
        f"median of {args.runs} runs of {len(images)} images"
    )
    print(f"measured matmul rate: {matmul_rate(device) / 1e9:.0f} GFLOP/s (float32)")
    print(table(["backbone", "templates", "images/s", "ms / image"], rows))


if __name__ == "__main__":
    main()

"""One prepared device check: correctness against the CPU reference, then one images/s table.

Runs where DESIGN.md's GPU machine runs it (its own torch, no Ray, no network, ``PYTHONPATH=.``),
through ``benchmarks/device_check.sh``, in well under 8 minutes on one H100/H200:

1. correctness, device vs the CPU float32 reference (random weights and banks, fixed seeds):
   ATMM (``atm_pair``) in float32 (max |diff| <= 1e-4) and bfloat16 (<= 3e-2); PTS indices
   (share of equal entries >= 0.99: float64 sums on two devices may break ties differently);
   backbone features (cosine >= 0.9999 in float32, >= 0.98 in bfloat16) for every benchmarked
   backbone; end-to-end ``predict`` scores (relative diff <= 1e-3 in float32);
2. speed, one table: ATMM ms/image, PTS ms per bank pixel chunk, and end-to-end images/s
   (decoded images in memory -> backbone -> ATMM -> scores; PNG decoding is CPU work and is
   reported separately as the decode ceiling) for wide_resnet101_2 and the default backbone,
   60 sheets and ALL (209), float32 and bfloat16 backbones, several batch sizes.

``--device cpu --quick`` runs the same code paths at toy sizes on a CPU (the check's CPU half,
tested where no GPU is lent). Exit status 1 if any correctness check fails.

    PYTHONPATH=. python benchmarks/device_check.py                      # on the GPU machine
    PYTHONPATH=. python benchmarks/device_check.py --device cpu --quick # anywhere, ~1 minute
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import median_time  # noqa: E402 - benchmarks/common.py: no Ray, no network, as this machine has

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig  # noqa: E402
from hetmm_ray.core.atmm import atm_pair, pixel_major  # noqa: E402
from hetmm_ray.core.backbone import Backbone  # noqa: E402
from hetmm_ray.core.pts import pts_indices  # noqa: E402
from hetmm_ray.core.templates import TemplateSet  # noqa: E402
from hetmm_ray.detection.detector import HETMM  # noqa: E402

FAILURES: list[str] = []


def check(name: str, ok: bool, detail: str) -> None:
    print(f"  [{'ok' if ok else 'FAIL'}] {name}: {detail}", flush=True)
    if not ok:
        FAILURES.append(name)


def unit(*shape: int, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=g), dim=1).to(device)


# --- 1. correctness ----------------------------------------------------------------------------------
def check_atmm(device: torch.device, quick: bool) -> None:
    b, c, h, w, k = (2, 16, 12, 12, 6) if quick else (8, 256, 64, 64, 60)
    q, t = unit(b, c, h, w, seed=1), unit(k, c, h, w, seed=2)
    ref = atm_pair(q, pixel_major(t), 9, 9)
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
        got = atm_pair(q.to(device, dtype), pixel_major(t.to(device, dtype)), 9, 9)
        diff = max((g.float().cpu() - r).abs().max().item() for g, r in zip(got, ref, strict=True))
        check(f"ATMM {str(dtype)[6:]}", diff <= tol, f"max |device - cpu| = {diff:.2e} (<= {tol:g})")


def check_pts(device: torch.device, quick: bool) -> None:
    n, c, h, w, k = (12, 8, 4, 4, 4) if quick else (60, 64, 16, 16, 10)
    bank = unit(n, c, h, w, seed=3)
    ref = pts_indices(bank, k)
    got = pts_indices(bank.to(device), k).cpu()
    same = (got == ref).double().mean().item()
    check("PTS indices", same >= 0.99, f"{100 * same:.2f}% of (slot, pixel) entries equal (>= 99%)")


def check_backbones(device: torch.device, names: list[str], size: int) -> None:
    x = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(4))
    for name in names:
        cpu = Backbone(BackboneConfig(name=name, weights="random", precision="float32"))
        ref = cpu(x)
        for precision, bound in (("float32", 0.9999), ("bfloat16", 0.98)):
            dev = Backbone(BackboneConfig(name=name, weights="random", precision=precision)).to(device)
            got = dev(x.to(device))
            cos = min((got[k].cpu() * ref[k]).sum(dim=1).min().item() for k in ref)
            check(f"backbone {name} {precision}", cos >= bound, f"min cosine to cpu fp32 {cos:.5f} (>= {bound})")


def check_predict(device: torch.device, size: int) -> None:
    from hetmm_ray.data.synthetic import SyntheticProduct

    gear = SyntheticProduct(seed=0, size=max(size, 64))
    train, test = [gear.good(i) for i in range(6)], [gear.good(i) for i in range(40, 44)]
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=size, precision="float32"),
        templates=TemplateConfig(kind="all"),
        threshold=ThresholdConfig(max_images=6, folds=2),
        device="cpu",
    )
    cpu = HETMM(config).fit(train)
    dev = HETMM(config.replace(device=str(device)))
    dev.scorer.install(cpu.templates, None, config=dev.config)  # type: ignore[arg-type]
    a, b = cpu.predict(test).scores, dev.predict(test).scores
    rel = float(np.max(np.abs(a - b) / np.maximum(np.abs(a), 1e-6)))
    check("predict scores", rel <= 1e-3, f"max relative |device - cpu| = {rel:.2e} (<= 1e-3)")


# --- 2. speed -----------------------------------------------------------------------------------------
def detector(name: str, sheets: int, precision: str, batch: int, size: int, device: torch.device) -> HETMM:
    config = DetectorConfig(
        backbone=BackboneConfig(name=name, weights="random", precision=precision, image_size=size, geometry="squash"),
        templates=TemplateConfig(kind="all"),
        batch_size=batch,
        device=str(device),
    )
    det = HETMM(config)
    shapes = det.backbone.feature_shapes()
    bank = {layer: unit(sheets, *shape, seed=5) for layer, shape in shapes.items()}
    ts = TemplateSet(bank=bank, config=config, weights_id="random", image_digests=tuple(map(str, range(sheets))))
    det.scorer.install(ts, 0, config=det.config)
    return det


def speed(args: argparse.Namespace, device: torch.device) -> list[list[object]]:
    rows: list[list[object]] = []
    size = args.size
    for name in args.backbones:
        for sheets in args.sheets:
            for precision in args.precisions:
                for batch in args.batches:
                    det = detector(name, sheets, precision, batch, size, device)
                    n = batch * args.batches_per_run
                    images = [
                        np.random.default_rng(i).integers(0, 256, (size, size, 3), dtype=np.uint8) for i in range(n)
                    ]
                    t = median_time(lambda det=det, images=images: det.predict(images), runs=args.runs, device=device)
                    # ATMM alone, on this batch's features
                    x = torch.rand(batch, 3, size, size, device=device)
                    feats = det.features(x, None)
                    ta = median_time(
                        lambda det=det, f=feats: det.scorer.score_maps(f, det.scorer.prepared),
                        runs=args.runs,
                        device=device,
                    )
                    rows.append(
                        [
                            name,
                            "ALL (209)" if sheets == 209 else sheets,
                            precision,
                            batch,
                            f"{n / t:.1f}",
                            f"{1000 * ta / batch:.2f}",
                        ]
                    )
                    print(" | ".join(map(str, rows[-1])), flush=True)
                    del det, feats
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
    return rows


def pts_speed(device: torch.device, quick: bool, runs: int) -> str:
    n, c, h, w, k = (12, 8, 4, 4, 4) if quick else (209, 256, 64, 64, 60)
    bank = unit(n, c, h, w, seed=6).to(device)
    t = median_time(lambda: pts_indices(bank, k), runs=max(1, runs // 2), device=device)
    return f"PTS (OPTICS) {n} images -> {k} sheets on a {c}x{h}x{w} layer: {t:.2f} s ({1e6 * t / (h * w):.0f} us/pixel)"


def decode_ceiling(quick: bool) -> str:
    """PNG decode + resize images/s of this machine's CPUs (the input pipeline's bound)."""
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    from hetmm_ray.data.decode import decode_image, resize_to_geometry

    side = 128 if quick else 900
    arr = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    body = buf.getvalue()
    threads = os.cpu_count() or 1
    n = 4 * threads

    def one(_: int) -> None:
        resize_to_geometry(decode_image(body), 256, "squash")

    with ThreadPoolExecutor(threads) as pool:
        t0 = time.perf_counter()
        list(pool.map(one, range(n)))
        t = time.perf_counter() - t0
    return f"PNG {side}x{side} (noise: a worst case) decode + resize on {threads} CPU threads: {n / t:.0f} images/s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="toy sizes (the CPU half of the check)")
    ap.add_argument("--json", help="write the table here")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("device_check: no CUDA device here (use --device cpu --quick for the CPU half)")
    if args.quick:
        args.backbones, args.sheets, args.precisions = (
            ["mobilenet_v2", "efficientnet_lite0"],
            [8],
            ["float32", "bfloat16"],
        )
        args.batches, args.batches_per_run, args.runs, args.size = [2], 1, 1, 64
        # wide_resnet101_2 is checked on the GPU run; on a CPU without native bf16 its bf16 pass alone
        # takes minutes (emulated), too long for a smoke test.
        check_backbone_names = ["mobilenet_v2", "efficientnet_lite0"]
    else:
        args.backbones, args.sheets, args.precisions = (
            ["wide_resnet101_2", "efficientnet_lite0"],
            [60, 209],
            ["float32", "bfloat16"],
        )
        args.batches, args.batches_per_run, args.runs, args.size = [8, 32, 128], 4, 3, 256
        check_backbone_names = args.backbones + ["mobilenet_v2"]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {name}; torch {torch.__version__}; {os.cpu_count()} CPU cores", flush=True)

    t0 = time.perf_counter()
    print("1. correctness (device vs CPU float32 reference)", flush=True)
    check_atmm(device, args.quick)
    check_pts(device, args.quick)
    check_backbones(device, check_backbone_names, args.size)
    check_predict(device, args.size)
    print(f"   ({time.perf_counter() - t0:.0f} s)", flush=True)

    print("2. speed", flush=True)
    rows = speed(args, device)
    from common import table

    print()
    print(f"{name}: end-to-end images/s from decoded {args.size}x{args.size} images (backbone + ATMM + scores),")
    print(f"batches of the given size, {args.batches_per_run} batches per timed call, median of {args.runs}")
    print(table(["backbone", "sheets", "backbone precision", "batch", "images/s", "ATMM ms/image"], rows))
    print(pts_speed(device, args.quick, args.runs))
    print(decode_ceiling(args.quick))
    print(f"total {time.perf_counter() - t0:.0f} s; correctness failures: {FAILURES or 'none'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": name, "rows": rows, "failures": FAILURES}, indent=2))
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()

"""End-to-end CPU images/s: the current predict path vs a plain sequential baseline, one run.

For mobilenet_v2 and the default backbone (efficientnet_lite0), at 60 template sheets and
ALL (209, bottle's training set), ``HETMM.predict`` on encoded PNGs (bottle test images,
900x900, or synthetic ones where ../shared is absent), batch 8, in three modes:

- ``baseline``: the plain sequential path: Pillow decode -> resize -> fp32 torch backbone with its
  batch norms as separate ops -> ATMM, one batch after another, one decode thread, the allocator
  untouched;
- ``current``: the defaults (libpng decoding of 8-bit RGB PNGs, BN folded, ``precision: auto``,
  ``backbone_runtime: auto`` = OpenVINO on a CPU, next batch decoded while the current one is
  scored, 2 decode threads, memory kept mapped);
- ``current+torch``: the same with the backbone run by torch (what OpenVINO adds);
- ``current+1worker``: the same with ``score_workers: 1`` (one thread running multi-threaded ops
  with the prefetch pipeline, instead of one single-threaded worker per thread);
- ``current+bf16``: the same with the backbone forced to bfloat16 + channels_last (what
  ``precision: auto`` picks only where the CPU has native bf16: this row shows what it would
  give here, to choose ``backbone.precision`` by measurement).

Each mode runs in its own fresh process (the allocator setting is process-wide), the modes
interleaved round-robin ``--rounds`` times so that load from other jobs falls on all alike;
a cell is the median over rounds of the median of ``--runs`` timed calls. Random weights and a
random unit-feature bank (speed does not depend on the values).

    python benchmarks/bench_throughput.py                 # the table (a few minutes, quiet 2-core box)
    python benchmarks/bench_throughput.py --quick         # 1 round, 1 backbone, 60 sheets (smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = ("baseline", "current", "current+torch", "current+1worker", "current+bf16")


def measure(mode: str, backbones: list[str], sheets: list[int], n_images: int, runs: int, batch: int) -> dict:
    """In this process: ms per image for every (backbone, sheets) in ``mode``."""
    import hetmm_ray  # noqa: F401, I001 - first, as in the service: it sets the OpenMP wait policy before torch loads
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(HERE))
    from bench_e2e import encoded_images

    import hetmm_ray.data.decode as decode
    from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig
    from hetmm_ray.core.backbone import Backbone
    from hetmm_ray.core.templates import TemplateSet
    from hetmm_ray.detector import HETMM

    images, source = encoded_images(n_images)
    if mode == "baseline":
        decode._png_decode = None  # Pillow decodes every PNG
    out = {"source": source, "threads": torch.get_num_threads(), "cells": {}, "precision": {}}
    for name in backbones:
        precision = {"baseline": "float32", "current+bf16": "bfloat16"}.get(mode, "auto")
        runtime = "torch" if mode in ("baseline", "current+torch") else "auto"
        plain: dict = {"prefetch": 0, "decode_threads": 1, "malloc_keep_mib": 0} if mode == "baseline" else {}
        if mode in ("baseline", "current+1worker"):
            plain["score_workers"] = 1
        config = DetectorConfig(
            backbone=BackboneConfig(name=name, weights="random", precision=precision),
            templates=TemplateConfig(kind="all"),
            batch_size=batch,
            backbone_runtime=runtime,
            **plain,
        )
        backbone = Backbone(config.backbone, fold_bn=mode != "baseline", runtime=runtime)
        out["precision"][name] = f"{backbone.precision} {backbone.runtime}"
        g = torch.Generator().manual_seed(0)
        shapes = backbone.feature_shapes()
        for k in sheets:
            det = HETMM(config)
            det.scorer.backbone = backbone
            bank = {layer: F.normalize(torch.randn(k, *shape, generator=g), dim=1) for layer, shape in shapes.items()}
            ts = TemplateSet(bank=bank, config=config, weights_id="random", image_digests=tuple(map(str, range(k))))
            det.scorer.install(ts, 0, config=det.config)
            det.predict(images[:batch])  # warm-up
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                det.predict(images)
                times.append(time.perf_counter() - t0)
            out["cells"][f"{name}|{k}"] = 1000 * statistics.median(times) / len(images)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backbones", nargs="+", default=["mobilenet_v2", "efficientnet_lite0"])
    ap.add_argument("--sheets", nargs="+", type=int, default=[60, 209], help="209 = ALL of bottle's training set")
    ap.add_argument("--images", type=int, default=24, help="images per timed predict call (3 batches of 8)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3, help="timed calls per cell and round")
    ap.add_argument("--rounds", type=int, default=3, help="fresh processes per mode, interleaved")
    ap.add_argument("--modes", nargs="+", default=[m for m in MODES if m != "current+bf16"], choices=MODES)
    ap.add_argument("--quick", action="store_true", help="1 round, 1 run, mobilenet_v2 at 60 sheets")
    ap.add_argument("--json", help="write the cells here")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.backbones, args.sheets, args.rounds, args.runs, args.images = ["mobilenet_v2"], [60], 1, 1, 16
    if args._child:
        print(json.dumps(measure(args._child, args.backbones, args.sheets, args.images, args.runs, args.batch)))
        return

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))}
    results: dict[str, list[dict]] = {m: [] for m in args.modes}
    for r in range(args.rounds):
        for mode in args.modes:
            cmd = [sys.executable, __file__, "--_child", mode, "--backbones", *args.backbones, "--sheets"]
            cmd += [*map(str, args.sheets), "--images", str(args.images), "--runs", str(args.runs)]
            cmd += ["--batch", str(args.batch)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                sys.exit(f"{mode} failed:\n{done.stderr[-3000:]}")
            results[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{args.rounds} {mode}: done", file=sys.stderr, flush=True)

    sys.path.insert(0, str(HERE))
    from common import table

    first = results[args.modes[0]][0]
    rows, cells = [], {}
    for name in args.backbones:
        for k in args.sheets:
            key = f"{name}|{k}"
            ms = {m: statistics.median(res["cells"][key] for res in results[m]) for m in args.modes}
            cells[key] = ms
            base = ms.get("baseline")
            row: list[object] = [name, "ALL (209)" if k == 209 else k]
            for m in args.modes:
                row += [f"{1000 / ms[m]:.1f}"]
            for m in args.modes:
                if m != "baseline" and base:
                    row += [f"{base / ms[m]:.2f}x"]
            rows.append(row)
    headers = ["backbone", "sheets", *(f"{m} img/s" for m in args.modes)]
    headers += [f"{m} vs baseline" for m in args.modes if m != "baseline" and "baseline" in args.modes]
    precision = {m: results[m][0]["precision"] for m in args.modes}  # per backbone: precision and runtime
    print(
        f"CPU, {first['threads']} torch threads, {os.cpu_count()} cores; inputs: {first['source']}; "
        f"batch {args.batch}, {args.images} images per call; median of {args.rounds} rounds x {args.runs} runs; "
        f"load average at the end {os.getloadavg()[0]:.1f}"
    )
    print(f"backbone precision and runtime per mode: {precision}")
    print(table(headers, rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"cells_ms_per_image": cells, "precision": precision}, indent=2))


if __name__ == "__main__":
    main()

"""Tiles (issue 22): frames/s at 1, 4 and 16 tiles per frame, in process and over HTTP, in one run.

Synthetic line frames (``hetmm_ray/data/surface.py``) of each ``--sizes`` (square, pixels). Per size
and grid (1 = the untiled product, the frame squeezed onto one canvas; 4 = 2 x 2; 16 = 4 x 4; tile
overlap ``--overlap`` px), one product is fit in process from ``--train`` good frames and saved to a
temporary store; then:

- **in process**: ``predict`` on ``--frames`` frames at once (decoded arrays, each cut into its tiles
  there), after one warm-up call; frames/s is the median of ``--runs`` calls;
- **HTTP**: the real service (Ray Serve on 127.0.0.1, one detector replica with this process's torch
  threads, the store above) answering PNG bodies of one frame per request from ``--concurrency``
  clients, ``--requests`` requests after a warm-up; frames/s over the run's wall time (PNG encoding
  excluded, the ingress's decode included: a real client sends PNGs);
- the ratio HTTP / in process per row, and each row against the 1-tile row of its size.

Then the time budget check (``templates.auto_max_ms_per_image``: the whole frame's estimated scoring
cost, ``fitting.FrameCost``: backbone of all tiles + the stitching of their maps + ATMM of every tile)
on a product where ATMM matters: ``--budget-train`` good frames (default 240, so ALL holds hundreds of
sheets per tile) of ``--budget-size`` px (default 1024: 240 frames of 2048 px would hold 3 GiB of
pixels) at 2 x 2 tiles. The frame cost of one training frame is estimated first: the fixed part (no
template count changes it) and ALL's; the budget (``--budget-ms``; default halfway between the two)
lies between them, so some selection meets it and ALL does not. The product is fit with
``templates.kind pts_o, sheets: auto`` under it; reported: the sheets chosen per tile position, the
fit's estimate for them, the measured in-process ms per frame (``predict`` of ``--frames`` frames at
once, and of one frame per call: the estimate's case, a frame on its own; medians of ``--runs``) and
whether each meets the budget; then the same product compressed to ALL and
measured the same way (the cost the budget avoided). ``--budget-only`` runs only this check.

Default backbone (efficientnet_lite0, packaged weights, 256-px canvas), ALL templates.

    python benchmarks/bench_tiles_speed.py                  # 1024 and 2048 px frames, 1 / 4 / 16 tiles
    python benchmarks/bench_tiles_speed.py --quick          # tiny: 128 and 256 px frames, 64-px canvas
    python benchmarks/bench_tiles_speed.py --json out.json  # the rows as JSON too
    python benchmarks/bench_tiles_speed.py --budget-only    # only the time budget check
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hetmm_ray  # noqa: F401, I001 - first, as in the service: it sets the OpenMP wait policy before torch loads
from common import free_port, post_images, table

from hetmm_ray.config import DetectorConfig
from hetmm_ray.data.surface import SyntheticSurface
from hetmm_ray.detector import HETMM
from hetmm_ray.store import open_store
from hetmm_ray.tiled import TiledHETMM

GRIDS = {1: (1, 1), 4: (2, 2), 16: (4, 4)}


def config_of(tiles: int, overlap: int, canvas: int | None, **templates: object) -> DetectorConfig:
    changes: dict[str, object] = {"device": "cpu"}
    if tiles > 1:
        changes |= {"geometry.tiles": list(GRIDS[tiles]), "geometry.tile_overlap": overlap}
    if canvas:
        changes["backbone.image_size"] = canvas
    changes |= {f"templates.{k}": v for k, v in templates.items()}
    return DetectorConfig().replace(**changes)


def fit(config: DetectorConfig, train: list[np.ndarray]) -> HETMM | TiledHETMM:
    return TiledHETMM(config).fit(train) if config.geometry.tiled else HETMM(config).fit(train)


def in_process_fps(det: HETMM | TiledHETMM, frames: list[np.ndarray], runs: int) -> float:
    det.predict(frames)  # warm-up: the backbone's runtime is built on first use
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        det.predict(frames)
        times.append(time.perf_counter() - t0)
    return len(frames) / statistics.median(times)


def one_frame_ms(det: HETMM | TiledHETMM, frames: list[np.ndarray], runs: int) -> float:
    """ms per frame with one frame per ``predict`` call (a line scoring frames as they come): the
    median over ``runs`` rounds of each round's mean over ``frames``, after one warm-up call."""
    det.predict(frames[:1])
    rounds = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for f in frames:
            det.predict([f])
        rounds.append((time.perf_counter() - t0) / len(frames))
    return 1000 * statistics.median(rounds)


def png_bytes(frame: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG")
    return buf.getvalue()


def http_fps(url: str, product: str, body: bytes, concurrency: int, requests: int) -> tuple[float, int]:
    post_images(url, product, body, concurrency, concurrency)  # warm-up: the replica loads the product
    answered, failures, wall = post_images(url, product, body, concurrency, requests)
    return len(answered) / wall, failures


def budget_check(args: argparse.Namespace) -> dict[str, object]:
    """The time budget check (module docstring): a 2 x 2 product of ``--budget-train`` frames, fit with
    ``pts_o, sheets: auto`` under a budget between its fixed cost and ALL's; returns the row."""
    size, tiles = args.budget_size, 4
    surface = SyntheticSurface(height=size, width=size, seed=0)
    train = [surface.good(i) for i in range(args.budget_train)]
    frames = [surface.good(1000 + i) for i in range(args.frames)]
    n = len(train)
    cost = TiledHETMM(config_of(tiles, args.overlap, args.canvas)).frame_cost(train[0])
    fixed, all_ms = cost.fixed_ms, cost.ms_per_frame(n)
    budget = args.budget_ms or (fixed + all_ms) / 2
    print(
        f"\nbudget check ({size} px, 2 x 2 tiles, {n} good frames): estimated {fixed:.1f} ms per frame without "
        f"templates (backbone {cost.backbone_ms:.1f} + stitching {cost.post_ms:.1f}), {all_ms:.1f} with ALL "
        f"({n} sheets per tile); budget {budget:.1f} ms",
        flush=True,
    )
    cfg = config_of(tiles, args.overlap, args.canvas, kind="pts_o", sheets="auto", auto_max_ms_per_image=budget)
    t0 = time.perf_counter()
    det = TiledHETMM(cfg).fit(train)
    fit_s = time.perf_counter() - t0
    autos = [d.templates.meta["sheets_auto"] for d in det.dets]
    chosen = [a["chosen"] for a in autos]
    # the fit's own estimate for the frame: its fixed part + each position's ATMM at its K (each
    # position's record holds fixed + scored x its ATMM)
    fit_fixed = autos[0]["tolerance"]["fixed_ms_per_frame"]
    scored = sum(det.live)
    estimate = fit_fixed + sum((a["tolerance"]["estimated_ms_per_frame"] - fit_fixed) / scored for a in autos)
    ms = 1000 / in_process_fps(det, frames, args.runs)
    single = one_frame_ms(det, frames, args.runs)
    det.compress(kind="all")
    all_measured = 1000 / in_process_fps(det, frames, args.runs)
    row: dict[str, object] = {
        "size": size,
        "tiles": tiles,
        "train": n,
        "fixed_ms_estimate": fixed,
        "all_ms_estimate": all_ms,
        "budget_ms": budget,
        "sheets": chosen,
        "why": autos[0]["why"],
        "fit_estimate_ms": estimate,
        "ms_per_frame": ms,
        "meets": ms <= budget,
        "one_frame_ms": single,
        "one_frame_meets": single <= budget,
        "all_ms_per_frame": all_measured,
        "fit_s": fit_s,
    }
    print(
        table(
            [
                "budget ms",
                "sheets per tile",
                "fit's estimate ms",
                "measured ms",
                "meets",
                "one frame per call ms",
                "meets",
                "ALL measured ms",
            ],
            [
                [
                    f"{budget:.1f}",
                    " / ".join(str(k) for k in chosen),
                    f"{estimate:.1f}",
                    f"{ms:.1f}",
                    "yes" if ms <= budget else "NO",
                    f"{single:.1f}",
                    "yes" if single <= budget else "NO",
                    f"{all_measured:.1f}",
                ]
            ],
        )
    )
    print(
        f"measured: in-process predict of {args.frames} frames per call and of one frame per call (the estimate's "
        f"case: one frame on its own), median of {args.runs}; fit {fit_s:.0f} s; "
        f"why (tile 0): {autos[0]['why']}",
        flush=True,
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048], help="frame sides, px")
    ap.add_argument("--tiles", type=int, nargs="+", default=[1, 4, 16], choices=sorted(GRIDS))
    ap.add_argument("--overlap", type=int, default=16, help="tile overlap, px")
    ap.add_argument("--train", type=int, default=24, help="good frames per product (ALL keeps them all)")
    ap.add_argument("--frames", type=int, default=8, help="frames per in-process predict call")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--requests", type=int, default=24, help="HTTP requests per row")
    ap.add_argument("--canvas", type=int, default=None, help="backbone.image_size (default: the product default)")
    ap.add_argument("--budget-ms", type=float, default=None, help="templates.auto_max_ms_per_image (ms per frame)")
    ap.add_argument("--budget-train", type=int, default=240, help="good frames of the budget check's product")
    ap.add_argument("--budget-size", type=int, default=1024, help="frame side of the budget check, px")
    ap.add_argument("--budget-only", action="store_true", help="only the time budget check")
    ap.add_argument("--no-budget", action="store_true", help="the frames/s table only (no time budget check)")
    ap.add_argument("--quick", action="store_true", help="a tiny run that shows the script works")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.canvas, args.train, args.frames = [128, 256], 64, 12, 4
        args.runs, args.concurrency, args.requests, args.overlap = 1, 2, 4, 8
        args.budget_train, args.budget_size = 30, 256
    if args.budget_only:
        budget_row = budget_check(args)
        if args.json:
            args.json.write_text(json.dumps({"budget": budget_row}, indent=2))
        return

    from ray import serve

    from hetmm_ray.serve.run import start_service, stop_service

    threads = torch.get_num_threads()
    store_uri = tempfile.mkdtemp(prefix="bench-tiles-speed-")
    store = open_store(store_uri)
    rows: list[dict[str, object]] = []
    bodies: dict[str, bytes] = {}
    for size in args.sizes:
        surface = SyntheticSurface(height=size, width=size, seed=0)
        train = [surface.good(i) for i in range(args.train)]
        frames = [surface.good(1000 + i) for i in range(args.frames)]
        for tiles in args.tiles:
            det = fit(config_of(tiles, args.overlap, args.canvas), train)
            product = f"f{size}-t{tiles}"
            det.save(store, product)
            fps = in_process_fps(det, frames, args.runs)
            rows.append({"size": size, "tiles": tiles, "product": product, "in_process_fps": fps})
            bodies[product] = png_bytes(frames[0])
            print(f"{product}: in process {fps:.2f} frames/s", flush=True)

    running = start_service(
        store=store_uri,
        port=free_port(),
        deployments={"Detector": {"num_replicas": 1, "user_config": {"threads": threads}}},
    )
    try:
        for row in rows:
            fps, failures = http_fps(
                running.url, str(row["product"]), bodies[str(row["product"])], args.concurrency, args.requests
            )
            row["http_fps"], row["http_failures"] = fps, failures
            print(f"{row['product']}: HTTP {fps:.2f} frames/s ({failures} failed)", flush=True)
    finally:
        stop_service(running)
        serve.shutdown()

    base = {r["size"]: r for r in rows if r["tiles"] == 1}
    lines = []
    for r in rows:
        one = base.get(r["size"])
        lines.append(
            [
                f"{r['size']} x {r['size']}",
                r["tiles"],
                f"{r['in_process_fps']:.2f}",
                f"{r['http_fps']:.2f}",
                f"{100 * r['http_fps'] / r['in_process_fps']:.0f}%",
                "-" if one is None else f"{r['in_process_fps'] / one['in_process_fps']:.2f}",
                "-" if one is None else f"{r['http_fps'] / one['http_fps']:.2f}",
                r["http_failures"],
            ]
        )
    heads = [
        "frame",
        "tiles",
        "in-process f/s",
        "HTTP f/s",
        "HTTP/in-proc",
        "vs 1 tile (in-proc)",
        "vs 1 tile (HTTP)",
        "failed",
    ]
    print()
    print(table(heads, lines))

    budget_row = None if args.no_budget else budget_check(args)
    canvas = args.canvas or DetectorConfig().backbone.image_size
    print(
        f"\n{args.train} good frames per product (ALL templates), canvas {canvas} px, overlap {args.overlap} px; "
        f"in process: {args.frames} frames per call, median of {args.runs}; HTTP: {args.requests} one-frame PNG "
        f"requests from {args.concurrency} clients, 1 replica with {threads} torch threads; "
        f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "budget": budget_row}, indent=2))


if __name__ == "__main__":
    main()

"""Tiles: a product evaluated with one tile and with a tile grid, side by side, and what
tiles cost in frames/s in process and over HTTP.

``surface`` and ``data``: the same product evaluated with one tile and with each of ``--grids``.
Default backbone (efficientnet_lite0, packaged weights), ALL templates, the default threshold rule
(far 1 %). ``surface`` writes the frames of ``hetmm_ray/data/surface.py`` (hairline scratches 1-2 px,
pits 5-8 px) to a temporary folder (``--keep DIR`` to keep them), same seed every run; ``data PATH``
takes an MVTec-layout folder. Pixel metrics are computed on maps of ``--map-size`` (long side; the
untiled run gets ``scoring.output_size`` of the same size, so both are measured on the same pixel
grid); 0 = the frame's own resolution for tiles (memory: PRO sorts every pixel of the test set).
Prints each run's evaluation table and one JSON line per run. ``--set KEY=JSON`` (repeatable) changes
any product setting for every run. ``--windows`` runs every grid with each listed set of ATMM windows
(``scoring.forward_windows`` = ``backward_windows``, one odd size per layer) and prints the ATMM cost
factor of each against the settings' own windows (``--set``, else the default (9, 7, 5)): the matmul's
work, ``sum over layers of C h w p^2`` on the canvas (``core/atmm.py``: one product per window, so the
cost grows with the window's area), counted, not timed. ``--every-train N`` / ``--every-test M``
measure a subset (a data set only): every N-th training frame and every M-th frame of each test folder,
in name order, linked into a temporary layout with the set's ground truth.

``speed``: frames/s at 1, 4 and 16 tiles per frame, in process and over HTTP, in one run.
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
cost, ``frame_cost.FrameCost``: backbone of all tiles + the stitching of their maps + ATMM of every tile)
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

    python benchmarks/bench_tiles.py surface                  # 2048 x 2048 synthetic surface: 1x1 vs auto
    python benchmarks/bench_tiles.py surface --grids auto --contrast 12 18 --keep /tmp/faint   # fainter defects
    python benchmarks/bench_tiles.py data /tmp/faint --grids auto --set geometry.min_defect_px=2
    python benchmarks/bench_tiles.py data ../shared/data/mvtec_ad/bottle --grids 1x1,2x2
    python benchmarks/bench_tiles.py data ../shared/data/bsd_pitting --grids 1x1,auto
    python benchmarks/bench_tiles.py data ../shared/data/mvtec_ad/bottle --grids 2x2 --map-size 0 \
        --windows "9,7,5 13,11,7 17,13,9"        # ATMM windows swept (forward = backward)
    python benchmarks/bench_tiles.py data ../shared/data/bsd_pitting --grids auto --map-size 0 \
        --every-train 3 --every-test 2 --set 'scoring.score_sigma=4.0'   # a subset; any setting
    python benchmarks/bench_tiles.py speed                  # 1024 and 2048 px frames, 1 / 4 / 16 tiles
    python benchmarks/bench_tiles.py speed --quick          # tiny: 128 and 256 px frames, 64-px canvas
    python benchmarks/bench_tiles.py speed --json out.json  # the rows as JSON too
    python benchmarks/bench_tiles.py speed --budget-only    # only the time budget check
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import free_port, png_bytes, post_images, served, table

from hetmm_ray.config import DetectorConfig
from hetmm_ray.core.backbone import Backbone
from hetmm_ray.data.mvtec import MVTecCategory
from hetmm_ray.data.surface import SurfaceDefects, SyntheticSurface, write_surface_layout
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.tiled import TiledHETMM
from hetmm_ray.store import open_store
from hetmm_ray.workflows.evaluation import EvaluationResult, evaluate


# --- surface and data: one tile against a grid ------------------------------------------------------------
def _grid(text: str) -> list[int] | str:
    if text == "auto":
        return "auto"
    r, c = text.lower().split("x")
    return [int(r), int(c)]


def _setting(text: str) -> tuple[str, object]:
    key, _, value = text.partition("=")
    if not value:
        raise argparse.ArgumentTypeError(f"--set wants KEY=JSON, got {text!r}")
    return key, json.loads(value)


def _windows(text: str) -> list[tuple[int, ...] | None]:
    """``"9,7,5 13,11,7"`` -> [(9, 7, 5), (13, 11, 7)]; empty: [None] (the settings' own)."""
    return [tuple(int(v) for v in w.split(",")) for w in text.split()] or [None]


def atmm_work(config: DetectorConfig, windows: tuple[int, ...]) -> float:
    """The ATMM matmul's work per canvas and template, ``sum_l C_l h_l w_l p_l^2`` (a count)."""
    shapes = Backbone(config.backbone).feature_shapes()
    return float(sum(c * h * w * p * p for (c, h, w), p in zip(shapes.values(), windows, strict=True)))


@contextmanager
def subset(data: Path, every_train: int, every_test: int) -> Iterator[Path]:
    """``data`` itself, or a temporary layout of links: every ``every_train``-th training frame and
    every ``every_test``-th frame of each test folder (name order), the ground truth linked whole."""
    if every_train == every_test == 1:
        yield data
        return
    category = MVTecCategory(data)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / data.name
        (root / "train" / "good").mkdir(parents=True)
        for p in category.train_paths()[::every_train]:
            (root / "train" / "good" / p.name).symlink_to(p.resolve())
        for folder in sorted((data / "test").iterdir()):
            if folder.is_dir():
                (root / "test" / folder.name).mkdir(parents=True)
                images = sorted((p for p in folder.iterdir() if p.is_file()), key=lambda p: p.name)
                for p in images[::every_test]:
                    (root / "test" / folder.name / p.name).symlink_to(p.resolve())
        if (data / "ground_truth").is_dir():
            (root / "ground_truth").symlink_to((data / "ground_truth").resolve())
        n_train = len(list((root / "train" / "good").iterdir()))
        print(f"subset of {data}: {n_train} training frames (every {every_train}), every {every_test} test frame")
        yield root


def run(
    data: Path,
    grids: list[str],
    map_size: int,
    overlap: int | float,
    settings: dict | None = None,
    windows: list[tuple[int, ...] | None] | None = None,
) -> list[dict]:
    rows, results = [], []
    base = DetectorConfig().replace(**(settings or {}))
    windows = windows or [None]
    work0 = atmm_work(base, base.scoring.forward_windows)  # the cost factor is against these
    for g in grids:
        for win in windows:
            tiles = _grid(g)
            changes: dict = {"geometry.tiles": tiles, "geometry.tile_overlap": overlap}
            if win is not None:
                changes |= {"scoring.forward_windows": list(win), "scoring.backward_windows": list(win)}
            if tiles == [1, 1]:
                changes["geometry.tile_large_frames"] = False  # 1 x 1 asked: the frame on one canvas, however large
                if map_size:
                    changes["scoring.output_size"] = map_size  # the same pixel grid as the tiled maps
            config = base.replace(**changes)
            win = config.scoring.forward_windows
            cost = atmm_work(config, win) / work0
            t0 = time.perf_counter()
            result, _, _ = evaluate(data, config, progress=False, map_size=map_size or None)
            wall = time.perf_counter() - t0
            print(f"--- {data.name}, tiles {g}, windows {win} ---\n{result.table()}\n", flush=True)
            js = {"data": str(data), "grid_asked": g, "windows": list(win), "atmm_cost": round(cost, 3)}
            js |= {"wall_s": round(wall, 1), **result.to_json()}
            print(json.dumps(js), flush=True)
            results.append(js)
            rows.append(_row(g, ",".join(map(str, win)), f"{cost:.2f}", result))
    headers = ["tiles", "windows", "atmm cost", "grid", "sheets", "image AUROC", "pixel AUROC", "PRO", "recall %"]
    print(table([*headers, "FA %", "frames/s", "tiles/s", "fit s"], rows))
    return results


def _row(g: str, win: str, cost: str, result: EvaluationResult) -> list:
    grid = "x".join(map(str, result.tiles)) if result.tiles else "1x1"
    return [
        g,
        win,
        cost,
        grid,
        result.sheets,
        f"{result.image_auroc:.1f}",
        "-" if result.pixel_auroc is None else f"{result.pixel_auroc:.1f}",
        "-" if result.pro is None else f"{result.pro:.1f}",
        f"{result.recall:.1f}",
        f"{result.false_alarm_rate:.1f}",
        f"{result.images_per_s:.2f}",
        "-" if result.tiles_per_s is None else f"{result.tiles_per_s:.1f}",
        f"{result.fit_seconds:.0f}",
    ]


def evaluation(args: argparse.Namespace) -> None:
    grids = args.grids.split(",")
    settings = dict(args.set)
    if args.command == "data":
        with subset(args.path, args.every_train, args.every_test) as root:
            run(root, grids, args.map_size, args.overlap, settings, args.windows)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp) / "surface"
        if not (root / "train").exists():
            t0 = time.perf_counter()
            write_surface_layout(
                root,
                height=args.size,
                width=args.size,
                n_train=args.train,
                n_test_good=args.test_good,
                n_test_per_defect=args.test_per_defect,
                seed=args.seed,
                defects=SurfaceDefects(contrast=tuple(args.contrast)) if args.contrast else None,
            )
            print(f"wrote {root} in {time.perf_counter() - t0:.0f} s", flush=True)
        run(root, grids, args.map_size, args.overlap, settings, args.windows)


# --- speed: frames/s at 1, 4 and 16 tiles ------------------------------------------------------------------
GRIDS = {1: (1, 1), 4: (2, 2), 16: (4, 4)}


def config_of(tiles: int, overlap: int, canvas: int | None, **templates: object) -> DetectorConfig:
    changes: dict[str, object] = {"device": "cpu", "geometry.tile_large_frames": False}  # the grid as asked
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


def speed(args: argparse.Namespace) -> None:
    if args.quick:
        args.sizes, args.canvas, args.train, args.frames = [128, 256], 64, 12, 4
        args.runs, args.concurrency, args.requests, args.overlap = 1, 2, 4, 8
        args.budget_train, args.budget_size = 30, 256
    if args.budget_only:
        budget_row = budget_check(args)
        if args.json:
            args.json.write_text(json.dumps({"budget": budget_row}, indent=2))
        return

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

    with served(
        leave="serve",
        store=store_uri,
        port=free_port(),
        deployments={"Detector": {"num_replicas": 1, "user_config": {"threads": threads}}},
    ) as running:
        for row in rows:
            fps, failures = http_fps(
                running.url, str(row["product"]), bodies[str(row["product"])], args.concurrency, args.requests
            )
            row["http_fps"], row["http_failures"] = fps, failures
            print(f"{row['product']}: HTTP {fps:.2f} frames/s ({failures} failed)", flush=True)

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


COMMANDS = {"surface": evaluation, "data": evaluation, "speed": speed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("surface", help="a synthetic 2048-px surface: one tile against grids")
    s.add_argument("--size", type=int, default=2048)
    s.add_argument("--train", type=int, default=30)
    s.add_argument("--test-good", type=int, default=20)
    s.add_argument("--test-per-defect", type=int, default=10, help="per kind (scratch, pit)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--keep", type=Path, help="write the frames here and keep them")
    s.add_argument(
        "--contrast", type=float, nargs=2, metavar=("LOW", "HIGH"), help="defect contrast, grey levels (default 22 34)"
    )
    d = sub.add_parser("data", help="an MVTec-layout folder: one tile against grids")
    d.add_argument("path", type=Path)
    for p in (s, d):
        p.add_argument("--grids", default="1x1,auto", help="comma-separated: 1x1, 2x2, auto...")
        p.add_argument("--map-size", type=int, default=1024, help="long side of the maps measured; 0: the frame's")
        p.add_argument("--overlap", type=json.loads, default=32, help="tile overlap: pixels (int) or a fraction")
        p.add_argument("--set", type=_setting, action="append", default=[], help="KEY=JSON, any product setting")
        p.add_argument("--windows", type=_windows, default=[None], help='ATMM windows to sweep: "9,7,5 13,11,7"')
    d.add_argument("--every-train", type=int, default=1, help="measure every N-th training frame only")
    d.add_argument("--every-test", type=int, default=1, help="measure every M-th frame of each test folder only")
    p = sub.add_parser("speed", help="frames/s at 1, 4 and 16 tiles, in process and over HTTP; the time budget")
    p.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048], help="frame sides, px")
    p.add_argument("--tiles", type=int, nargs="+", default=[1, 4, 16], choices=sorted(GRIDS))
    p.add_argument("--overlap", type=int, default=16, help="tile overlap, px")
    p.add_argument("--train", type=int, default=24, help="good frames per product (ALL keeps them all)")
    p.add_argument("--frames", type=int, default=8, help="frames per in-process predict call")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--requests", type=int, default=24, help="HTTP requests per row")
    p.add_argument("--canvas", type=int, default=None, help="backbone.image_size (default: the product default)")
    p.add_argument("--budget-ms", type=float, default=None, help="templates.auto_max_ms_per_image (ms per frame)")
    p.add_argument("--budget-train", type=int, default=240, help="good frames of the budget check's product")
    p.add_argument("--budget-size", type=int, default=1024, help="frame side of the budget check, px")
    p.add_argument("--budget-only", action="store_true", help="only the time budget check")
    p.add_argument("--no-budget", action="store_true", help="the frames/s table only (no time budget check)")
    p.add_argument("--quick", action="store_true", help="a tiny run that shows the benchmark works")
    p.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    COMMANDS[args.command](args)


if __name__ == "__main__":
    main()

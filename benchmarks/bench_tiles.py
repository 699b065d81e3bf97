"""Tiles (issue 22): the same product evaluated with one tile and with a tile grid, side by side.

    python benchmarks/bench_tiles.py surface                  # 2048 x 2048 synthetic surface: 1x1 vs auto
    python benchmarks/bench_tiles.py data ../shared/data/mvtec_ad/bottle --grids 1x1,2x2
    python benchmarks/bench_tiles.py data ../shared/data/bsd_pitting --grids 1x1,auto
    python benchmarks/bench_tiles.py data ../shared/data/mvtec_ad/bottle --grids 2x2 --map-size 0 \
        --windows "9,7,5 13,11,7 17,13,9"        # ATMM windows swept (forward = backward)
    python benchmarks/bench_tiles.py data ../shared/data/bsd_pitting --grids auto --map-size 0 \
        --every-train 3 --every-test 2 --set 'scoring.score_sigma=4.0'   # a subset; any setting

Default backbone (efficientnet_lite0, packaged weights), ALL templates, the default threshold
rule (far 1 %). ``surface`` writes the frames of ``hetmm_ray/data/surface.py`` (hairline scratches
1-2 px, pits 5-8 px) to a temporary folder (``--keep DIR`` to keep them), same seed every run.
Pixel metrics are computed on maps of ``--map-size`` (long side; the untiled run gets
``scoring.output_size`` of the same size, so both are measured on the same pixel grid); 0 = the
frame's own resolution for tiles (memory: PRO sorts every pixel of the test set). Prints each
run's evaluation table and one JSON line per run.

``--set KEY=JSON`` (repeatable) changes any product setting for every run. ``--windows`` runs every
grid with each listed set of ATMM windows (``scoring.forward_windows`` = ``backward_windows``, one
odd size per layer) and prints the ATMM cost factor of each against the settings' own windows
(``--set``, else the default (9, 7, 5)): the matmul's work, ``sum over layers of C h w p^2`` on the
canvas (``core/atmm.py``: one product per window, so the cost grows with the window's area),
counted, not timed. ``--every-train N`` / ``--every-test M``
measure a subset (a data set only): every N-th training frame and every M-th frame of each test
folder, in name order, linked into a temporary layout with the set's ground truth.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import table

from hetmm_ray.config import DetectorConfig
from hetmm_ray.core.backbone import Backbone
from hetmm_ray.data.mvtec import MVTecCategory
from hetmm_ray.data.surface import write_surface_layout
from hetmm_ray.evaluation import EvaluationResult, evaluate


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
            if tiles == [1, 1] and map_size:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("surface")
    s.add_argument("--size", type=int, default=2048)
    s.add_argument("--train", type=int, default=30)
    s.add_argument("--test-good", type=int, default=20)
    s.add_argument("--test-per-defect", type=int, default=10, help="per kind (scratch, pit)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--keep", type=Path, help="write the frames here and keep them")
    d = sub.add_parser("data")
    d.add_argument("path", type=Path)
    for p in (s, d):
        p.add_argument("--grids", default="1x1,auto", help="comma-separated: 1x1, 2x2, auto...")
        p.add_argument("--map-size", type=int, default=1024, help="long side of the maps measured; 0: the frame's")
        p.add_argument("--overlap", type=json.loads, default=32, help="tile overlap: pixels (int) or a fraction")
        p.add_argument("--set", type=_setting, action="append", default=[], help="KEY=JSON, any product setting")
        p.add_argument("--windows", type=_windows, default=[None], help='ATMM windows to sweep: "9,7,5 13,11,7"')
    d.add_argument("--every-train", type=int, default=1, help="measure every N-th training frame only")
    d.add_argument("--every-test", type=int, default=1, help="measure every M-th frame of each test folder only")
    args = ap.parse_args()
    grids = args.grids.split(",")
    settings = dict(args.set)
    if args.what == "data":
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
            )
            print(f"wrote {root} in {time.perf_counter() - t0:.0f} s", flush=True)
        run(root, grids, args.map_size, args.overlap, settings, args.windows)


if __name__ == "__main__":
    main()

"""Tiles (issue 22): the same product evaluated with one tile and with a tile grid, side by side.

    python benchmarks/bench_tiles.py surface                  # 2048 x 2048 synthetic surface: 1x1 vs auto
    python benchmarks/bench_tiles.py data ../shared/data/mvtec_ad/bottle --grids 1x1,2x2
    python benchmarks/bench_tiles.py data ../shared/data/bsd_pitting --grids 1x1,auto

Default backbone (efficientnet_lite0, packaged weights), ALL templates, the default threshold
rule (far 1 %). ``surface`` writes the frames of ``hetmm_ray/data/surface.py`` (hairline scratches
1-2 px, pits 5-8 px) to a temporary folder (``--keep DIR`` to keep them), same seed every run.
Pixel metrics are computed on maps of ``--map-size`` (long side; the untiled run gets
``scoring.output_size`` of the same size, so both are measured on the same pixel grid); 0 = the
frame's own resolution for tiles (memory: PRO sorts every pixel of the test set). Prints each
run's evaluation table and one JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import table

from hetmm_ray.config import DetectorConfig
from hetmm_ray.data.surface import write_surface_layout
from hetmm_ray.evaluation import evaluate


def _grid(text: str) -> list[int] | str:
    if text == "auto":
        return "auto"
    r, c = text.lower().split("x")
    return [int(r), int(c)]


def run(data: Path, grids: list[str], map_size: int, overlap: int | float) -> list[dict]:
    rows, results = [], []
    for g in grids:
        tiles = _grid(g)
        changes: dict = {"geometry.tiles": tiles, "geometry.tile_overlap": overlap}
        if tiles == [1, 1] and map_size:
            changes["scoring.output_size"] = map_size  # the same pixel grid as the tiled maps
        config = DetectorConfig().replace(**changes)
        t0 = time.perf_counter()
        result, _, _ = evaluate(data, config, progress=False, map_size=map_size or None)
        wall = time.perf_counter() - t0
        print(f"--- {data.name}, tiles {g} ---\n{result.table()}\n", flush=True)
        js = {"data": str(data), "grid_asked": g, "wall_s": round(wall, 1), **result.to_json()}
        print(json.dumps(js), flush=True)
        results.append(js)
        grid = "x".join(map(str, result.tiles)) if result.tiles else "1x1"
        rows.append(
            [
                g,
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
        )
    headers = ["tiles", "grid", "sheets", "image AUROC", "pixel AUROC", "PRO", "recall %", "FA %"]
    print(table([*headers, "frames/s", "tiles/s", "fit s"], rows))
    return results


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
    args = ap.parse_args()
    grids = args.grids.split(",")
    if args.what == "data":
        run(args.path, grids, args.map_size, args.overlap)
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
        run(root, grids, args.map_size, args.overlap)


if __name__ == "__main__":
    main()

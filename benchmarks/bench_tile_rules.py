"""Tiles (issue 22, item 6 of the routes' work): how a tiled product's frame score is formed, measured.

    python benchmarks/bench_tile_rules.py ../shared/data/mvtec_ad/bottle --grid 2x2
    python benchmarks/bench_tile_rules.py ../shared/data/bsd_pitting --grid auto
    python benchmarks/bench_tile_rules.py surface                     # 2048 x 2048, tiles auto

One fit and one predict of the tiled product (default backbone, ALL templates, 32 px overlap,
``hetmm_ray/tiled.py``); then, from each position's raw out-of-fold scores and each test frame's raw
tile scores, the frame score under other per-position normalisations (``s / scale`` or
``(s - loc) / scale``) and other ways of combining the tiles, each with its frame threshold
calibrated the way the product's is (far 1 % on the per-frame combination of the normalised
out-of-fold scores). Prints image AUROC, recall and false alarms at that threshold per rule. The
first row of each table is what the product does today (far 1 % scale, maximum over tiles).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import table

from hetmm_ray.config import DetectorConfig
from hetmm_ray.core.calibration import TailModel
from hetmm_ray.core.metrics import image_auroc
from hetmm_ray.data.mvtec import MVTecCategory
from hetmm_ray.data.surface import write_surface_layout
from hetmm_ray.tiled import TiledHETMM, resolve_tiles


def raw_scores(data: Path, grid: list[int] | str) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]:
    """(T, n) raw out-of-fold scores per position, (N, T) raw test tile scores, labels, the grid."""
    category = MVTecCategory(data)
    samples = category.measurable_samples()
    # the tiles alone (what these rules were measured on; the whole view: bench_tile_pyramid.py)
    config = DetectorConfig().replace(
        **{"geometry.tiles": grid, "geometry.tile_overlap": 32, "geometry.tile_whole_view": False}
    )
    config = resolve_tiles(config, category.train_paths())
    det = TiledHETMM(config, map_size=64).fit(category.train_paths())  # small maps: scores are what count
    pred = det.predict([s.path for s in samples])
    oof = np.array([d.templates.calibration.scores for d in det.dets])
    return oof, pred.tile_scores * np.array(det.scales), np.array([s.label for s in samples]), (det.rows, det.cols)


def normalisations(o: np.ndarray) -> dict[str, tuple[float, float]]:
    """(loc, scale) of one position's out-of-fold scores ``o`` under each normalisation."""
    med = float(np.median(o))
    far = float(TailModel(o).threshold(0.01))
    return {
        "far 1 % scale (today)": (0.0, far),
        "median scale": (0.0, med),
        "q0.9 scale": (0.0, float(np.quantile(o, 0.9))),
        "max scale": (0.0, float(o.max())),
        "(s - mean) / std": (float(o.mean()), float(o.std())),
        "(s - median) / MAD": (med, 1.4826 * float(np.median(np.abs(o - med)))),
    }


def _power_mean(p: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: np.mean(np.maximum(x, 0) ** p, axis=-1) ** (1 / p)


COMBINE: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "max (today)": lambda x: x.max(axis=-1),
    "mean": lambda x: x.mean(axis=-1),
    **{f"power mean p={p}": _power_mean(p) for p in (2, 4, 8, 16)},
}


def frame_metrics(frame_oof: np.ndarray, frame_test: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """A frame rule's image AUROC, and recall and false alarms (%) at its far-1 % frame threshold
    calibrated on its out-of-fold frame scores (as the product calibrates its own)."""
    threshold = float(TailModel(frame_oof).threshold(0.01))
    flag = frame_test > threshold
    return {
        "image_auroc": 100 * image_auroc(frame_test, labels),
        "recall": 100 * float(flag[labels == 1].mean()),
        "false_alarms": 100 * float(flag[labels == 0].mean()),
        "threshold": threshold,
    }


def measure(frame_oof: np.ndarray, frame_test: np.ndarray, labels: np.ndarray) -> list[str]:
    """:func:`frame_metrics` as table cells: image AUROC, recall %, false alarms %."""
    m = frame_metrics(frame_oof, frame_test, labels)
    return [f"{m['image_auroc']:.2f}", f"{m['recall']:.1f}", f"{m['false_alarms']:.1f}"]


def report(name: str, oof: np.ndarray, tile: np.ndarray, labels: np.ndarray, grid: tuple[int, int]) -> dict:
    t = oof.shape[0]
    per = [normalisations(oof[p]) for p in range(t)]
    rows, out = [], {"data": name, "grid": list(grid), "rules": {}}
    for rule in per[0]:
        loc = np.array([per[p][rule][0] for p in range(t)])
        scale = np.array([per[p][rule][1] for p in range(t)])
        fo = ((oof - loc[:, None]) / scale[:, None]).max(axis=0)
        ft = ((tile - loc[None, :]) / scale[None, :]).max(axis=1)
        rows.append([f"{rule}, max", *measure(fo, ft, labels)])
    far = np.array([per[p]["far 1 % scale (today)"][1] for p in range(t)])
    for rule, combine in list(COMBINE.items())[1:]:
        rows.append([f"far 1 % scale, {rule}", *measure(combine((oof / far[:, None]).T), combine(tile / far), labels)])
    for r in rows:
        out["rules"][r[0]] = {"image_auroc": float(r[1]), "recall": float(r[2]), "false_alarms": float(r[3])}
    print(f"--- {name}: {grid[0]} x {grid[1]} tiles, {len(labels)} test frames ({int(labels.sum())} defective)")
    print(table(["rule (normalisation, combination)", "image AUROC", "recall %", "false alarms %"], rows))
    print(json.dumps(out), flush=True)
    return out


def add_data_arguments(ap: argparse.ArgumentParser) -> None:
    """The data arguments of the tile-rule benchmarks (this one and bench_tile_seams.py)."""
    ap.add_argument("data", help="an MVTec-layout folder, or 'surface' (hetmm_ray/data/surface.py frames)")
    ap.add_argument("--grid", default="auto", help="rows x cols (e.g. 2x2) or auto")
    ap.add_argument("--size", type=int, default=2048, help="surface: frame side")
    ap.add_argument("--train", type=int, default=30, help="surface: good training frames")
    ap.add_argument("--test-good", type=int, default=20, help="surface")
    ap.add_argument("--test-per-defect", type=int, default=10, help="surface: per kind (scratch, pit)")


def grid_of(args: argparse.Namespace) -> list[int] | str:
    return "auto" if args.grid == "auto" else [int(v) for v in args.grid.lower().split("x")]


@contextmanager
def data_root(args: argparse.Namespace) -> Iterator[tuple[str, Path]]:
    """(name, MVTec-layout root) of ``args.data``: the folder itself, or a seeded synthetic surface
    written to a temporary folder for the block's duration."""
    if args.data != "surface":
        yield Path(args.data).name, Path(args.data)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = write_surface_layout(
            Path(tmp) / "surface",
            height=args.size,
            width=args.size,
            n_train=args.train,
            n_test_good=args.test_good,
            n_test_per_defect=args.test_per_defect,
            seed=0,
        )
        yield f"surface {args.size}", root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(ap)
    args = ap.parse_args()
    with data_root(args) as (name, root):
        report(name, *raw_scores(root, grid_of(args)))


if __name__ == "__main__":
    main()

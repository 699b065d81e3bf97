"""Tiles (issue 22): a PYRAMID frame rule, measured: the whole frame as one extra position beside the tiles.

    python benchmarks/bench_tile_pyramid.py ../shared/data/mvtec_ad/bottle --grid 2x2
    python benchmarks/bench_tile_pyramid.py ../shared/data/bsd_pitting --grid auto   # 1 x 3
    python benchmarks/bench_tile_pyramid.py ../shared/data/bsd_pitting --grid auto --every-train 3 --every-test 2
    python benchmarks/bench_tile_pyramid.py surface                                  # 2048 x 2048, auto = 5 x 5

Two fits on the same good training frames, default backbone, ALL templates: the untiled product
(``geometry.tiles`` [1, 1]: the whole frame letterboxed to one canvas) and the tiled product of the
tiles alone (``--grid``, 32 px overlap, ``geometry.tile_whole_view`` false, ``hetmm_ray/tiled.py``).
Both deal the frames into folds by the frames' content digests, so the ``i``-th out-of-fold score is
the same frame in both (checked: the digests and the fold plans are asserted equal). From each
product's raw out-of-fold scores and raw test scores (per tile position for the tiled one), three
frame rules, each with its frame threshold calibrated as the tiled product calibrates its own
(far 1 % on the per-frame rule applied to the out-of-fold scores):

- ``tiles alone``: the maximum over tile positions of ``s_p / t_p`` (``t_p``: position ``p``'s
  far-1 % threshold of its own out-of-fold scores), what ``tiled.py`` does with
  ``geometry.tile_whole_view`` false (every tiled product before the setting);
- ``pyramid``: the same maximum over the tile positions AND the whole view, the whole view
  normalised the same way by its own far-1 % threshold ``t_w`` (what ``tiled.py`` does with
  ``geometry.tile_whole_view``, the default; tests/unit/test_tile_whole_view.py checks that the
  product's whole view is this untiled product);
- ``1 x 1 alone``: the untiled product's raw score (its threshold: far 1 % of its out-of-fold scores,
  as an untiled product's is).

Prints image AUROC, recall and false alarms at that threshold for each, the frames that decide the
AUROC (good frames above the lowest defective ones), and one JSON line. ``--save FILE.npz`` keeps the
raw scores (``NAME --load FILE.npz`` recomputes the rules from them without fitting). ``--every-train N`` /
``--every-test M`` measure a subset of a data set (``bench_tiles.py``'s ``subset``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_tile_rules import add_data_arguments, data_root, frame_metrics, grid_of
from bench_tiles import subset
from common import table

from hetmm_ray.config import DetectorConfig
from hetmm_ray.core.calibration import TailModel, fold_plan
from hetmm_ray.data.mvtec import MVTecCategory
from hetmm_ray.detector import HETMM
from hetmm_ray.tiled import TiledHETMM, resolve_tiles

FAR = 0.01


def _plan(config: DetectorConfig, digests: tuple[str, ...]) -> list[list[int]]:
    th = config.threshold
    return fold_plan(len(digests), folds=th.folds, max_images=th.max_images, seed=th.seed, keys=digests)


def raw_scores(root: Path, grid: list[int] | str) -> dict[str, np.ndarray]:
    """Raw out-of-fold and test scores of both products on ``root`` (an MVTec layout):
    ``tile_oof`` (T, n), ``tile_test`` (N, T), ``whole_oof`` (n,), ``whole_test`` (N,), ``labels``,
    ``names`` (test frames), ``grid``."""
    category = MVTecCategory(root)
    samples = category.measurable_samples()
    train = category.train_paths()
    test = [s.path for s in samples]
    tiles_alone = {"geometry.tiles": grid, "geometry.tile_overlap": 32, "geometry.tile_whole_view": False}
    config = resolve_tiles(DetectorConfig().replace(**tiles_alone), train)
    tiled = TiledHETMM(config, map_size=64).fit(train)  # small maps: scores are what count here
    pred = tiled.predict(test)
    whole = HETMM(DetectorConfig()).fit(train)
    wts = whole.templates
    # The same frames in the same folds: the i-th out-of-fold score is the same frame in both products.
    assert wts.image_digests == tiled.frame_digests, "the two fits hold different frames or orders"
    assert _plan(wts.config, wts.image_digests) == _plan(tiled.dets[0].templates.config, tiled.frame_digests)
    return {
        "tile_oof": np.array([d.templates.calibration.scores for d in tiled.dets]),
        "tile_test": pred.tile_scores * np.array(tiled.scales),
        "whole_oof": np.array(wts.calibration.scores),
        "whole_test": np.asarray(whole.predict(test).scores, dtype=np.float64),
        "labels": np.array([s.label for s in samples]),
        "names": np.array([f"{Path(s.path).parent.name}/{Path(s.path).name}" for s in samples]),
        "grid": np.array([tiled.rows, tiled.cols]),
    }


def far_scale(oof: np.ndarray) -> float:
    """A position's scale ``t_p``: far 1 % of its own out-of-fold scores (tiled.py's ``_scale``)."""
    t = TailModel(oof).threshold(FAR)
    return float(t) if np.isfinite(t) and t > 0 else 1.0


def rules(r: dict[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each rule's (frame out-of-fold scores, frame test scores)."""
    scales = np.array([far_scale(o) for o in r["tile_oof"]])
    t_w = far_scale(r["whole_oof"])
    tile_oof = r["tile_oof"] / scales[:, None]  # (T, n) normalised
    tile_test = r["tile_test"] / scales[None, :]  # (N, T)
    today = (tile_oof.max(axis=0), tile_test.max(axis=1))
    pyramid = (
        np.maximum(today[0], r["whole_oof"] / t_w),
        np.maximum(today[1], r["whole_test"] / t_w),
    )
    return {
        "tiles alone": today,
        "pyramid (tiles + whole view)": pyramid,
        "1 x 1 alone": (r["whole_oof"], r["whole_test"]),
    }


def deciders(scores: np.ndarray, labels: np.ndarray, names: np.ndarray) -> str:
    """Good frames scoring at or above the lowest defective one, and the defective ones they outscore."""
    low = scores[labels == 1].min()
    good = [(n, s) for n, s, y in zip(names, scores, labels, strict=True) if y == 0 and s >= low]
    if not good:
        return "none (every defective frame above every good one)"
    top = max(s for _, s in good)
    bad = [(n, s) for n, s, y in zip(names, scores, labels, strict=True) if y == 1 and s <= top]
    fmt = ", ".join
    return f"good {fmt(f'{n} {s:.3f}' for n, s in good)} over defective {fmt(f'{n} {s:.3f}' for n, s in bad)}"


def report(name: str, r: dict[str, np.ndarray]) -> dict:
    labels, names = r["labels"], r["names"]
    grid = [int(v) for v in r["grid"]]
    out: dict = {"data": name, "grid": grid, "train": int(r["whole_oof"].size), "rules": {}}
    rows = []
    for rule, (fo, ft) in rules(r).items():
        m = frame_metrics(fo, ft, labels)
        out["rules"][rule] = {k: round(v, 4) for k, v in m.items()}
        rows.append(
            [rule, f"{m['image_auroc']:.2f}", f"{m['recall']:.1f}", f"{m['false_alarms']:.1f}", f"{m['threshold']:.4f}"]
        )
        print(f"  {rule}: {deciders(ft, labels, names)}")
    n_bad = int(labels.sum())
    print(f"--- {name}: {grid[0]} x {grid[1]} tiles, {len(labels)} test frames ({n_bad} defective)")
    print(table(["frame rule", "image AUROC", "recall %", "false alarms %", "frame threshold"], rows))
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(ap)
    ap.add_argument("--every-train", type=int, default=1, help="a data set: every N-th training frame only")
    ap.add_argument("--every-test", type=int, default=1, help="a data set: every M-th frame of each test folder only")
    ap.add_argument("--save", type=Path, help="keep the raw scores in this .npz")
    ap.add_argument("--load", type=Path, help="recompute the rules from a --save file (no fit)")
    args = ap.parse_args()
    if args.load:
        with np.load(args.load) as z:
            report(Path(args.data).name, {k: z[k] for k in z.files})  # data: the name only
        return
    with data_root(args) as (name, root):
        if args.data == "surface":
            r = raw_scores(root, grid_of(args))
        else:
            with subset(root, args.every_train, args.every_test) as sub:
                r = raw_scores(sub, grid_of(args))
    if args.save:
        np.savez(args.save, **r)
    report(name, r)


if __name__ == "__main__":
    main()

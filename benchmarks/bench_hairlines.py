"""Hairlines on the synthetic surface: which scratches each tiles setting finds, by their angle to
the brushing (``geometry.min_defect_px``).

Writes a scratch-only layout of ``hetmm_ray/data/surface.py`` frames (``--size`` px square,
defect contrast ``--contrast``, ``--train`` good training frames, ``--test`` good and ``--test``
scratched test frames, ``--seed``), then for each ``--runs`` entry fits a product at the defaults
plus ``geometry.tiles: auto`` and that entry's settings (``auto``: none; else ``KEY=JSON``
pairs separated by ``;``; ``stride2-tap``: the default backbone with its stride-2 block added as
a fourth tap, ``STRIDE2_TAP``) and scores the test frames. Printed per setting: the grid, image AUROC, recall
and false alarms at the calibrated threshold, recall at the highest good test score (no false
alarm on this set), and the scratches missed there, split by their angle to the brushing (the
rows): under 15 degrees, 15-30, 30 and more. The surface's brushing is streaks along the rows,
so a faint scratch that runs along them looks like the grain itself. ``--transposed`` also scores
each scratched frame turned by a transpose (on round grains, ``--brush-px 1 --grain-px G``, the
texture is the same both ways, so only the scratch's orientation changes) and prints, per angle bin, in how many
the scratch scored higher upright (within 45 degrees of the columns) than lying. ``--json``
also keeps each scratch's angle and score (and turned score), and the good frames' maximum.

    python benchmarks/bench_hairlines.py                  # 1024 px, contrast 16-24, auto and min_defect_px 2
    python benchmarks/bench_hairlines.py --size 2048 --contrast 12 18 --runs auto geometry.min_defect_px=2
    python benchmarks/bench_hairlines.py --runs auto geometry.min_defect_px=2 stride2-tap
    python benchmarks/bench_hairlines.py --size 2048 --brush-px 1 --grain-px 8 --seed 1   # round 8-px grains
    python benchmarks/bench_hairlines.py --brush-px 1 --grain-px 16 --seed 3 --transposed
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table

from hetmm_ray.config import DetectorConfig
from hetmm_ray.core.metrics import image_auroc
from hetmm_ray.data.surface import SurfaceDefects, SyntheticSurface, write_surface_layout
from hetmm_ray.detection.detector_choice import new_detector

ANGLE_BINS = ((0.0, 15.0), (15.0, 30.0), (30.0, 90.01))
STRIDE2_TAP = {
    "backbone.layers": ["blocks.0", "blocks.1", "blocks.2", "blocks.4"],  # blocks.0: stride 2, 16 channels
    "scoring.forward_windows": [9, 9, 7, 5],
    "scoring.backward_windows": [9, 9, 7, 5],
    "scoring.alphas": [0.5, 0.5, 0.5, 0.5],
    "scoring.layer_weights": [1, 1, 1, 1],
}


def settings_of(run: str) -> dict[str, object]:
    if run == "auto":
        return {}
    out: dict[str, object] = {}
    for pair in run.split(";"):
        if pair == "stride2-tap":
            out |= STRIDE2_TAP
            continue
        key, _, value = pair.partition("=")
        out[key.strip()] = json.loads(value)
    return out


def transposed(path: Path) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(Image.open(path).convert("RGB")).transpose(1, 0, 2))


def scores_of(det: Any, paths: list[Path], batch: int = 8, *, turn: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Image scores and verdicts, ``batch`` frames at a time (the maps are dropped as they come);
    ``turn``: each frame transposed."""
    scores, flagged = [], []
    for i in range(0, len(paths), batch):
        chunk = paths[i : i + batch]
        p = det.predict([transposed(q) for q in chunk] if turn else chunk)
        scores.append(p.scores)
        flagged.append(p.is_anomaly)
    return np.concatenate(scores), np.concatenate(flagged)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=1024, help="frame side, px (default 1024)")
    ap.add_argument("--contrast", type=float, nargs=2, default=(16.0, 24.0), metavar=("LOW", "HIGH"))
    ap.add_argument("--train", type=int, default=30)
    ap.add_argument("--test", type=int, default=40, help="good test frames, and as many scratched ones")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--brush-px", type=int, default=48, help="brushing along the rows, px (1: none)")
    ap.add_argument("--grain-px", type=int, default=1, help="round grains about this many px across (1: per pixel)")
    ap.add_argument("--runs", nargs="+", default=["auto", "geometry.min_defect_px=2"])
    ap.add_argument("--transposed", action="store_true", help="also score each scratched frame transposed")
    ap.add_argument("--keep", type=Path, help="write the frames here and keep them")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    defects = SurfaceDefects(contrast=tuple(args.contrast))
    rows, out = [], []
    with tempfile.TemporaryDirectory(prefix="bench-hairlines-") as tmp:
        root = args.keep or Path(tmp) / "surface"
        if not (root / "train").exists():
            write_surface_layout(
                root, height=args.size, width=args.size, n_train=args.train, n_test_good=args.test,
                n_test_per_defect=args.test, seed=args.seed, defects=defects, kinds=("scratch",),
                brush_px=args.brush_px, grain_px=args.grain_px,
            )  # fmt: skip
        train = sorted((root / "train" / "good").glob("*.png"))
        good = sorted((root / "test" / "good").glob("*.png"))
        scratched = sorted((root / "test" / "scratch").glob("*.png"))
        surface = SyntheticSurface(
            height=args.size, width=args.size, seed=args.seed, defects=defects, brush_px=args.brush_px,
            grain_px=args.grain_px,
        )  # fmt: skip
        first = len(train) + len(good)  # write_surface_layout counts parts through train, good, scratch
        angles = np.array([surface.defect(first + i, "scratch").degrees_from_brushing for i in range(len(scratched))])
        for run in args.runs:
            config = DetectorConfig().replace(**{"geometry.tiles": "auto", **settings_of(run)})
            t0 = time.perf_counter()
            det = new_detector(config, train)
            det.fit(train)
            fit_s = time.perf_counter() - t0
            good_scores, good_flagged = scores_of(det, good)
            bad_scores, bad_flagged = scores_of(det, scratched)
            labels = np.r_[np.zeros(len(good)), np.ones(len(scratched))]
            auroc = 100 * image_auroc(np.r_[good_scores, bad_scores], labels)
            found = bad_scores > good_scores.max()
            missed = [
                f"{int((~found & (angles >= lo) & (angles < hi)).sum())}/{int(((angles >= lo) & (angles < hi)).sum())}"
                for lo, hi in ANGLE_BINS
            ]
            rec = {
                "run": run, "grid": "x".join(map(str, getattr(det, "grid", (1, 1)))), "image_auroc": round(auroc, 2),
                "recall_calibrated": round(100 * bad_flagged.mean(), 1), "false_alarms": int(good_flagged.sum()),
                "recall_no_false_alarm": round(100 * found.mean(), 1), "missed_by_angle": missed,
                "fit_s": round(fit_s, 1), "good_max": round(float(good_scores.max()), 4),
                "scratches": np.c_[angles.round(1), bad_scores.round(4)].tolist(),
            }  # fmt: skip
            if args.transposed:  # upright: within 45 degrees of the columns
                turned, _ = scores_of(det, scratched, turn=True)
                upright = np.where(angles >= 45, bad_scores, turned)
                lying = np.where(angles >= 45, turned, bad_scores)
                rec["scratches_turned"] = [round(float(b), 4) for b in turned]
                rec["upright_higher_by_angle"] = [
                    f"{int(((upright > lying) & (angles >= lo) & (angles < hi)).sum())}/"
                    f"{int(((angles >= lo) & (angles < hi)).sum())}"
                    for lo, hi in ANGLE_BINS
                ]
            print(json.dumps({k: v for k, v in rec.items() if not k.startswith("scratches")}), flush=True)
            out.append(rec)
            rows.append([run, rec["grid"], f"{auroc:.2f}", f"{rec['recall_calibrated']} % / {rec['false_alarms']}",
                         rec["recall_no_false_alarm"], *missed])  # fmt: skip
    print(
        table(
            ["setting (tiles: auto +)", "grid", "image AUROC", "recall / false alarms (calibrated)",
             "recall at no false alarm", "missed <15 deg", "15-30 deg", ">=30 deg"],
            rows,
        )
    )  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

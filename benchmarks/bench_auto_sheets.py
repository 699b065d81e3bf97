"""``templates.sheets: auto`` against ALL: is a compressed default kind worth it? (issue 22, item 3)

    python benchmarks/bench_auto_sheets.py                       # bottle, battery_weld, bsd_pitting, synthetic
    python benchmarks/bench_auto_sheets.py --budget 40           # + a time budget (ms per frame): is it met?
    python benchmarks/bench_auto_sheets.py --datasets bottle --kind pts_o --json auto.json
    python benchmarks/bench_auto_sheets.py --quick               # tiny synthetic run (random weights): it works
    python benchmarks/bench_auto_sheets.py --datasets bsd_pitting --train-subset 0.5   # half the good frames

For each dataset, ``hetmm evaluate`` twice with the defaults (efficientnet_lite0, packaged weights,
letterbox, far 1 %) except the templates: ``kind: all`` (today's default) and ``--kind`` (default
``pts_o``) with ``sheets: auto`` (and ``templates.auto_max_ms_per_image`` = ``--budget`` when given;
``--tiles`` sets ``geometry.tiles`` for both). Reported per run: K chosen (and why), image AUROC, pixel
AUROC, PRO, the verdicts at the calibrated operating point (false alarms on test/good, recall on the
defective images, the out-of-fold estimate of the false-alarm rate), and the cost per frame:

- ``atmm ms/frame``: ATMM scoring of test frames (all tiles) against the installed templates, features
  computed first and untimed, median of ``--rounds`` rounds with the two runs of a dataset interleaved
  round by round (so load from other jobs falls on both alike): the cost the template count controls;
- ``fit est. ms/frame``: with ``--budget``, the fit's estimate of the whole frame's cost for the chosen
  K (``fitting.FrameCost``: backbone of all tiles + stitching + ATMM of every tile), the quantity
  ``auto_max_ms_per_image`` budgets; without, what sheets auto measured for the chosen K (out-of-fold
  ATMM time scaled to the final sheet count, summed over the tiles; core/auto_sheets.py);
- ``e2e ms/frame``: ``evaluate``'s predict of the whole test set (decode, backbone, ATMM) per frame;
- ``fit s``: the whole fit (features, the sheets-auto ladder, the calibration); K is per tile position.

With ``--budget B`` the last column says whether the chosen selection met B, by the measured
``e2e ms/frame`` (which also counts reading and decoding the file, left out of the budget's estimate:
``benchmarks/bench_tiles_speed.py --budget-only`` measures decoded frames). One JSON line per run; ``--json``
writes them all. Timings mean something only on a quiet machine (BENCHMARKS.md states the load).

``--train-subset F`` (0 < F < 1) fits both runs of every dataset on ``round(F * N)`` of its N training
images, drawn without replacement by ``random.Random(--subset-seed)`` from the sorted file names (the
same draw for both runs; the test set is untouched): a view of the set (symbolic links under the temp
folder), for a machine on which the full ladder does not fit. Each record carries ``train_subset``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import SHARED, table

from hetmm_ray.config import DetectorConfig
from hetmm_ray.data.mvtec import MVTecCategory
from hetmm_ray.data.synthetic import write_mvtec_layout
from hetmm_ray.evaluation import evaluate
from hetmm_ray.tiled import TiledHETMM

DATA = {
    "bottle": SHARED / "data" / "mvtec_ad" / "bottle",
    "battery_weld": SHARED / "data" / "battery_weld",
    "bsd_pitting": SHARED / "data" / "bsd_pitting",
}


def synthetic(n_train: int, n_good: int, per_defect: int, size: int) -> Path:
    root = Path(tempfile.gettempdir()) / f"hetmm-auto-sheets-synthetic-{n_train}-{n_good}-{per_defect}-{size}"
    if not (root / "train" / "good").is_dir():
        write_mvtec_layout(root, n_train=n_train, n_test_good=n_good, n_test_per_defect=per_defect, seed=0, size=size)
    return root


def train_subset(name: str, data: Path, fraction: float, seed: int) -> Path:
    """A view of ``data`` with ``round(fraction * N)`` of its training images (seeded draw, sorted
    names), ``test/`` and ``ground_truth/`` as they are: symbolic links, nothing copied."""
    train = MVTecCategory(data).train_paths()
    keep = sorted(random.Random(seed).sample(train, max(1, round(fraction * len(train)))))
    root = Path(tempfile.gettempdir()) / f"hetmm-auto-sheets-{name}-subset-{len(keep)}-of-{len(train)}-seed{seed}"
    good = root / "train" / "good"
    if not good.is_dir():
        good.mkdir(parents=True)
        for path in keep:
            (good / path.name).symlink_to(path.resolve())
        for sub in ("test", "ground_truth"):
            if (data / sub).is_dir():
                (root / sub).symlink_to((data / sub).resolve(), target_is_directory=True)
    return root


def configs(args: argparse.Namespace) -> dict[str, DetectorConfig]:
    """The two runs of a dataset: ALL and the compressed kind with sheets auto."""
    base: dict[str, Any] = {"geometry.tiles": args.tiles}
    if args.quick:  # tiny and fast: random weights, 64 px, few folds (accuracy means nothing here)
        base |= {
            "backbone.name": "resnet18",
            "backbone.weights": "random",
            "backbone.image_size": 64,
            "threshold.folds": 4,
            "device": "cpu",
        }
    auto = {"templates.kind": args.kind, "templates.sheets": "auto"}
    if args.budget is not None:
        auto["templates.auto_max_ms_per_image"] = args.budget
    return {
        "all": DetectorConfig().replace(**base, **{"templates.kind": "all"}),
        f"{args.kind} auto": DetectorConfig().replace(**base, **auto),
    }


def test_features(det: Any, paths: list[Path]) -> list[tuple[Any, dict[str, torch.Tensor], Any]]:
    """(scorer, features, boxes) per tile position of ``paths``' frames (one entry untiled)."""
    if isinstance(det, TiledHETMM):
        from hetmm_ray.scorer import as_rgb

        feats, boxes, _ = det._tile_features([as_rgb(p) for p in paths], bank=False)
        t = det.n_tiles
        out = []
        for p, d in enumerate(det.dets):
            rows = list(range(p, len(paths) * t, t))
            out.append((d.scorer, {k: v[rows] for k, v in feats.items()}, None if boxes is None else boxes[p::t]))
        return out
    from hetmm_ray.evaluation import load_images

    bb = det.config.backbone
    images = load_images(paths, bb.image_size, geometry=bb.geometry)
    feats, _, boxes = det.pipeline._extract(images)
    return [(det.scorer, feats, boxes)]


def atmm_seconds(parts: list[tuple[Any, dict[str, torch.Tensor], Any]]) -> float:
    """One timed ATMM scoring of every position's features against its installed templates."""
    t0 = time.perf_counter()
    for scorer, feats, boxes in parts:
        scorer.score(feats, scorer.prepared, boxes).cpu()  # .cpu(): waits for a GPU to finish
    return time.perf_counter() - t0


def run_dataset(name: str, data: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    runs: dict[str, tuple[Any, Any]] = {}
    for label, config in configs(args).items():
        result, det, _ = evaluate(data, config, progress=False)
        runs[label] = (result, det)
        print(f"--- {name}, {label} ---\n{result.table()}\n", flush=True)
    paths = [s.path for s in MVTecCategory(data).measurable_samples()][: args.timing_images]
    parts = {label: test_features(det, paths) for label, (_, det) in runs.items()}
    for label in runs:  # untimed warm-up of each (threads, scratch buffers)
        atmm_seconds(parts[label])
    times: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(args.rounds):  # interleaved: load falls on both alike
        for label in runs:
            times[label].append(atmm_seconds(parts[label]))
    out = []
    for label, (result, det) in runs.items():
        autos = _auto_records(det)
        auto = autos[0] if autos else None
        tiles = det.n_tiles if isinstance(det, TiledHETMM) else 1
        fit_est = _fit_estimate(autos) if autos else None
        atmm_ms = 1000 * statistics.median(times[label]) / len(paths)
        rec = {
            "data": name,
            "run": label,
            "train_subset": args.train_subset,
            "tiles": tiles,
            "n_train": result.n_train,
            "sheets": result.sheets,
            "sheets_per_position": [a["chosen"] for a in autos] if autos else None,
            "why": auto["why"] if auto else None,
            "ladder": auto["ladder"] if auto else None,
            "image_auroc": result.image_auroc,
            "pixel_auroc": result.pixel_auroc,
            "pro": result.pro,
            "false_alarms": f"{result.false_positives}/{result.false_positives + result.true_negatives}",
            "false_alarm_rate": result.false_alarm_rate,
            "recall": result.recall,
            "recall_of": f"{result.true_positives}/{result.true_positives + result.false_negatives}",
            "estimated_false_alarm_rate": result.estimated_false_alarm_rate,
            "atmm_ms_per_frame": atmm_ms,
            "fit_estimate_ms_per_frame": fit_est,
            "e2e_ms_per_frame": 1000 / result.images_per_s,
            "fit_s": result.fit_seconds,
            "budget_ms_per_frame": args.budget if auto is not None else None,
            "budget_met": None if args.budget is None or auto is None else 1000 / result.images_per_s <= args.budget,
        }
        print(json.dumps(rec), flush=True)
        out.append(rec)
    return out


def _auto_records(det: Any) -> list[dict[str, Any]]:
    """The sheets-auto record of every tile position (one, untiled); empty for a fixed selection."""
    dets = det.dets if isinstance(det, TiledHETMM) else [det]
    recs = [d.templates.meta.get("sheets_auto") if d.templates is not None else None for d in dets]
    return [dict(r) for r in recs if r]


def _fit_estimate(autos: list[dict[str, Any]]) -> float:
    """The fit's frame estimate for its choice: with a budget, the fixed part + each position's ATMM at
    its K (each record holds fixed + tiles x its ATMM); without, the out-of-fold ATMM figures summed
    over the positions (each chose its own K)."""
    tol = autos[0]["tolerance"]
    if "estimated_ms_per_frame" not in tol:
        return sum(_chosen_ms(a) for a in autos)
    fixed, n = tol["fixed_ms_per_frame"], len(autos)
    return fixed + sum((a["tolerance"]["estimated_ms_per_frame"] - fixed) / n for a in autos)


def _chosen_ms(auto: dict[str, Any]) -> float:
    """The ms per image sheets auto measured for the K it chose (ALL's figure when it kept ALL)."""
    k = auto["chosen"]
    return next((r["ms_per_image"] for r in auto["ladder"] if r["sheets"] == k), auto["all_ms_per_image"])


def _f(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default="bottle,battery_weld,bsd_pitting,synthetic")
    p.add_argument("--kind", default="pts_o", help="the compressed kind run with sheets auto (default pts_o)")
    p.add_argument("--budget", type=float, default=None, help="templates.auto_max_ms_per_image (ms per frame)")
    p.add_argument("--tiles", default=None, help="geometry.tiles for both runs: RxC or auto (default 1x1)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved ATMM timing rounds (median)")
    p.add_argument("--timing-images", type=int, default=16, help="test frames timed per round")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--synthetic-train", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="tiny synthetic run only (random weights, 64 px)")
    p.add_argument("--train-subset", type=float, default=None, help="fit on this share of train/good (seeded)")
    p.add_argument("--subset-seed", type=int, default=0, help="the seed of --train-subset's draw")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    if args.train_subset is not None and not 0 < args.train_subset < 1:
        p.error("--train-subset must lie strictly between 0 and 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tiles is None:
        args.tiles = [1, 1]
    elif args.tiles != "auto":
        args.tiles = [int(v) for v in args.tiles.lower().split("x")]
    if args.quick:
        datasets = {"synthetic": synthetic(24, 4, 2, 64)}
        args.rounds, args.timing_images = min(args.rounds, 2), min(args.timing_images, 4)
    else:
        names = [n.strip() for n in args.datasets.split(",") if n.strip()]
        datasets = {n: DATA[n] if n in DATA else synthetic(args.synthetic_train, 40, 10, 256) for n in names}
    if args.train_subset is not None:
        datasets = {n: train_subset(n, d, args.train_subset, args.subset_seed) for n, d in datasets.items()}
    records = []
    for name, data in datasets.items():
        records.extend(run_dataset(name, data, args))
    print(
        table(
            [
                "data",
                "templates",
                "K",
                "image AUROC",
                "pixel AUROC",
                "PRO",
                "false alarms",
                "recall",
                "est. FA %",
                "atmm ms/frame",
                "fit est. ms/frame",
                "e2e ms/frame",
                "fit s",
                "budget met",
            ],
            [
                [
                    r["data"],
                    r["run"],
                    "/".join(map(str, r["sheets_per_position"] or [r["sheets"]])),
                    _f(r["image_auroc"]),
                    _f(r["pixel_auroc"]),
                    _f(r["pro"]),
                    f"{r['false_alarms']} ({r['false_alarm_rate']:.1f} %)",
                    f"{r['recall_of']} ({r['recall']:.1f} %)",
                    _f(r["estimated_false_alarm_rate"]),
                    _f(r["atmm_ms_per_frame"], 1),
                    _f(r["fit_estimate_ms_per_frame"], 1),
                    _f(r["e2e_ms_per_frame"], 1),
                    _f(r["fit_s"], 1),
                    "-" if r["budget_met"] is None else ("yes" if r["budget_met"] else "NO"),
                ]
                for r in records
            ],
        )
    )
    if args.json:
        args.json.write_text("\n".join(json.dumps(r) for r in records) + "\n")


if __name__ == "__main__":
    main()

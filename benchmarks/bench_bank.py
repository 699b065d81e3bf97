"""Template selection against the size of the bank.

``selections`` (why 60 sheets lose): a synthetic product of varied poses (``data/synthetic.py``,
``pose="varied"``: any turn, shifts of 12 px), ``--train`` good images, or ``--data`` (an MVTec
layout: bsd_pitting's 482 good frames). Features of the training
and test images are extracted once (the default backbone and canvas); then, for every selection
(``--runs``: ``kind:K``), the tiny set is selected from the bank and every test image scored by
ATMM. Reported per selection: image AUROC, the ATMM ms per image, and the *coverage* of the bank
by the sheets: per pixel, the chord distance from each bank vector to its nearest sheet
(``sqrt(2 (1 - cos))``), its largest value (the radius) and mean, averaged over pixels and
layers. A selection that leaves bank vectors far from every sheet loses the matches ALL has.

``scale`` (the default's speed as the bank grows): one varied-pose product; ``hetmm evaluate``'s
engine (``evaluation.evaluate``) with the defaults on the first 200, 500 and 1,000 good images
(``--banks``), and ALL beside each (``--no-all`` leaves it out): image AUROC, recall at the
calibrated threshold, images/s of the test set (decode + backbone + ATMM), the fit's seconds;
``--plot PNG`` draws images/s and the fit's seconds against the bank (``plots.py bank`` of the rows).

``products`` (the defaults against ALL on real sets): bottle, battery_weld, bsd_pitting (../shared)
and the varied-pose product: the same figures, the defaults and ``templates.kind=all``.

``folds`` (a compressed product's out-of-fold calibration): the varied product's bank (``--train``),
then for each ``--runs`` selection the calibration's out-of-fold scores made twice, the fold
selections one after another in this process and as one Ray task per fold
(``distributed.ray_steps.select_folds_ray``, a local Ray of this machine's CPUs): seconds of each, and
whether the scores agree. A machine of C cores runs the tasks C at a time, each on one core, where
the in-process selection uses all C for each fold: the tasks pay only on a cluster.

Timings mean something only on a quiet machine (docs/performance.md states the load).

    python benchmarks/bench_bank.py selections --train 500 --runs all cover:60 pts_o:60 pr:60 cover:200
    python benchmarks/bench_bank.py selections --data ../shared/data/bsd_pitting --runs all cover:60 pts_o:60
    python benchmarks/bench_bank.py scale --banks 200 500 1000 --json bank.json --plot bank.png
    python benchmarks/bench_bank.py products --datasets bottle battery_weld bsd_pitting varied
    python benchmarks/bench_bank.py folds --train 300 --runs pts_o:60 pr:60 cover:60
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
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BATTERY, BOTTLE, BSD, table, with_default_command
from plots import bank_png

from hetmm_ray.config import DetectorConfig
from hetmm_ray.core.cover import nearest_sheet_distances
from hetmm_ray.core.metrics import image_auroc
from hetmm_ray.core.pts import select_layers
from hetmm_ray.core.templates import TemplateSet
from hetmm_ray.data.mvtec import MVTecCategory
from hetmm_ray.data.synthetic import write_mvtec_layout
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.workflows.evaluation import evaluate, load_images


def varied(root: Path, n_train: int, n_good: int, per_defect: int, aspect: str = "square") -> Path:
    """The varied-pose product (``aspect="varied"``: also cut to bands of varied height, so the
    letterboxed canvas pads each image differently)."""
    return write_mvtec_layout(
        root / f"varied{n_train}-{aspect}", n_train=n_train, n_test_good=n_good, n_test_per_defect=per_defect,
        pose="varied", aspect=aspect,
    )  # fmt: skip


def coverage(bank: dict[str, torch.Tensor], indices: dict[str, torch.Tensor] | None) -> tuple[float, float]:
    """(radius, mean): per pixel, the largest and the mean chord distance from a bank vector to its
    nearest sheet (``core.cover.nearest_sheet_distances``; letterbox padding left out, and pixels
    that are padding in every image), averaged over pixels, then over layers. ALL: (0, 0)."""
    if indices is None:
        return 0.0, 0.0
    radii, means = [], []
    for layer, b in bank.items():
        d = nearest_sheet_distances(b, indices[layer]).flatten(1)  # (N, H*W), NaN: padding
        keep = ~d.isnan().all(dim=0)
        radii.append(float(d.nan_to_num(0.0).amax(dim=0)[keep].mean()))
        means.append(float(d.nanmean(dim=0)[keep].mean()))
    return float(np.mean(radii)), float(np.mean(means))


def selections(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-bank-") as tmp:
        data = args.data or varied(Path(tmp), args.train, args.test_good, args.per_defect, args.aspect)
        category = MVTecCategory(data)
        config = DetectorConfig().replace(**{"templates.kind": "all"})
        det = HETMM(config)
        bb = config.backbone
        train = load_images(category.train_paths(), bb.image_size, geometry=bb.geometry)
        samples = category.test_samples()
        test = load_images([s.path for s in samples], bb.image_size, geometry=bb.geometry)
        bank, digests, _ = det.pipeline.extract_with_boxes(train, bank=True)
        bank = {k: v.float() for k, v in bank.items()}
        feats, _, boxes = det.pipeline.extract_with_boxes(test)
    labels = np.array([s.label for s in samples])
    rows = []
    for run in args.runs:
        kind, _, k = run.partition(":")
        t0 = time.perf_counter()
        indices, centres = select_layers(bank, kind, int(k) if k else "auto", 0)
        select_s = time.perf_counter() - t0
        ts = TemplateSet(
            bank=bank, config=config, weights_id="bench", image_digests=digests, indices=indices, centres=centres
        )
        prepared = det.scorer.prepare(ts)
        det.scorer.score(feats, prepared, boxes)  # warm-up
        t0 = time.perf_counter()
        scores = det.scorer.score(feats, prepared, boxes).cpu().numpy()
        ms = 1000 * (time.perf_counter() - t0) / len(samples)
        radius, mean = coverage(bank, indices) if centres is None else (float("nan"), float("nan"))
        rec = {
            "data": data.name, "run": run, "train": len(digests),
            "image_auroc": round(100 * image_auroc(scores, labels), 2),
            "atmm_ms_per_image": round(ms, 1), "select_s": round(select_s, 1),
            "cover_radius": round(radius, 4), "cover_mean": round(mean, 4),
        }  # fmt: skip
        print(json.dumps(rec), flush=True)
        rows.append(rec)
    print(table(list(rows[0]), [list(r.values()) for r in rows]))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


def folds(args: argparse.Namespace) -> None:
    import ray

    from hetmm_ray.config import TemplateConfig
    from hetmm_ray.detection.fit_steps import FitSteps
    from hetmm_ray.distributed.ray_steps import select_folds_ray

    with tempfile.TemporaryDirectory(prefix="bench-bank-") as tmp:
        data = varied(Path(tmp), args.train, 1, 1)
        config = DetectorConfig().replace(**{"templates.kind": "all"})
        det = HETMM(config).fit(MVTecCategory(data).train_paths())
    ts = det.templates
    on_tasks = HETMM(config, steps=FitSteps(select_folds=select_folds_ray))
    ray.init(include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        for run in args.runs:
            kind, _, k = run.partition(":")
            tc = TemplateConfig(kind=kind, sheets=int(k))
            t0 = time.perf_counter()
            here = det.pipeline.out_of_fold(ts, templates=tc)
            here_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            tasks = on_tasks.pipeline.out_of_fold(ts, templates=tc)
            tasks_s = time.perf_counter() - t0
            rec = {
                "run": run, "train": ts.n_images, "folds": here.folds, "in_process_s": round(here_s, 1),
                "fold_tasks_s": round(tasks_s, 1), "ratio": round(here_s / tasks_s, 2),
                "same_scores": here.by_image() == tasks.by_image(), "cpus": int(ray.cluster_resources()["CPU"]),
            }  # fmt: skip
            print(json.dumps(rec), flush=True)
            rows.append(rec)
    finally:
        ray.shutdown()
    print(table(list(rows[0]), [list(r.values()) for r in rows]))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


def _record(name: str, label: str, config: DetectorConfig, data: Path) -> dict[str, Any]:
    result, det, _ = evaluate(data, config)
    return {
        "data": name, "run": label, "n_train": result.n_train, "sheets": result.sheets,
        "kind": det.config.templates.kind, "image_auroc": round(result.image_auroc, 2),
        "pixel_auroc": None if result.pixel_auroc is None else round(result.pixel_auroc, 2),
        "pro": None if result.pro is None else round(result.pro, 2),
        "recall": round(result.recall, 1), "false_alarms": round(result.false_alarm_rate, 1),
        "recall_at_1pct": round(result.recall_at_1pct_false_alarms, 1),
        "images_per_s": round(result.images_per_s, 2), "fit_s": round(result.fit_seconds, 1),
    }  # fmt: skip


def _runs(name: str, data: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    out = [_record(name, "defaults", DetectorConfig(), data)]
    print(json.dumps(out[-1]), flush=True)
    if not args.no_all:
        out.append(_record(name, "all", DetectorConfig().replace(**{"templates.kind": "all"}), data))
        print(json.dumps(out[-1]), flush=True)
    return out


def _train_prefix(root: Path, data: Path, n: int) -> Path:
    """A view of ``data`` whose train/good holds its first ``n`` images (symbolic links)."""
    view = root / f"{data.name}-{n}"
    (view / "train" / "good").mkdir(parents=True)
    for path in sorted((data / "train" / "good").iterdir())[:n]:
        (view / "train" / "good" / path.name).symlink_to(path.resolve())
    for sub in ("test", "ground_truth"):
        (view / sub).symlink_to((data / sub).resolve(), target_is_directory=True)
    return view


def _print(rows: list[dict[str, Any]], json_path: Path | None) -> None:
    print(table(list(rows[0]), [list(r.values()) for r in rows]))
    if json_path:
        json_path.write_text(json.dumps(rows, indent=1) + "\n")


def scale(args: argparse.Namespace) -> None:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-bank-") as tmp:
        data = varied(Path(tmp), max(args.banks), args.test_good, args.per_defect)
        for n in args.banks:
            rows += _runs(f"varied, bank {n}", _train_prefix(Path(tmp), data, n), args)
    _print(rows, args.json)
    if args.plot:
        print(f"written {bank_png(rows, args.plot)}")


def products(args: argparse.Namespace) -> None:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-bank-") as tmp:
        for name in args.datasets:
            path = {"bottle": BOTTLE, "battery_weld": BATTERY, "bsd_pitting": BSD}.get(name)
            if name == "varied":
                path = varied(Path(tmp), args.train, args.test_good, args.per_defect)
            if path is None or not Path(path).is_dir():
                print(f"skipped {name}: no data", flush=True)
                continue
            rows += _runs(name, Path(path), args)
    _print(rows, args.json)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("selections", "scale", "products", "folds"):
        p = sub.add_parser(name)
        p.add_argument("--train", type=int, default=500, help="good images of the varied product (default 500)")
        p.add_argument("--test-good", type=int, default=40)
        p.add_argument("--per-defect", type=int, default=14, help="test images per defect kind (3 kinds)")
        p.add_argument("--json", type=Path)
        p.add_argument("--no-all", action="store_true", help="leave ALL out (scale, products)")
    sub.choices["selections"].add_argument("--aspect", default="square", choices=("square", "varied"))
    sub.choices["selections"].add_argument("--data", type=Path, help="an MVTec layout instead of the varied product")
    sub.choices["selections"].add_argument(
        "--runs", nargs="+", default=["all", "cover:60", "pts_o:60", "pr:60", "cover:200", "pr:200"]
    )
    sub.choices["folds"].add_argument("--runs", nargs="+", default=["pts_o:60", "pr:60", "cover:60"])
    sub.choices["scale"].add_argument("--banks", type=int, nargs="+", default=[200, 500, 1000])
    sub.choices["scale"].add_argument("--plot", type=Path, help="draw images/s and fit s against the bank here (PNG)")
    sub.choices["products"].add_argument(
        "--datasets", nargs="+", default=["bottle", "battery_weld", "bsd_pitting", "varied"]
    )
    args = ap.parse_args(with_default_command(sys.argv[1:], list(sub.choices), "selections"))
    {"selections": selections, "scale": scale, "products": products, "folds": folds}[args.command](args)


if __name__ == "__main__":
    main()

"""Template selection and image geometry on real products: accuracy and the cost the template count
controls.

``ablation`` (the default command): the paper's ablation (Table RTMM) and the template-size sweep on
MVTec bottle. Features of the 209 training and 83 test images are extracted once (real mobilenet_v2
weights from ../shared); then, for each selection, the tiny set is selected, every test image is
scored by ATMM, and image AUROC, pixel AUROC and PRO are measured. images/s = decode + backbone
(measured once) + ATMM (per selection), on this machine.

``geometry``: image geometry (squash vs letterbox): image/pixel AUROC and PRO per geometry, ALL
templates, real mobilenet_v2 ImageNet weights (../shared/weights) on bottle and battery_weld
(../shared/data) and a synthetic product of varied aspect (data/synthetic.py, ``aspect="varied"``:
centred bands of 40-100 % height) written to a temporary folder.

``ladder``: ``templates.sheets: auto`` on the same products: the ladder it measures, the K it chooses
and the metrics of that choice against ALL.

``auto``: ``templates.sheets: auto`` against ALL: is a compressed default kind worth it?
For each dataset, ``hetmm evaluate`` twice with the defaults (efficientnet_lite0, packaged
weights, letterbox, far 1 %) except the templates: ``kind: all`` and ``--kind`` (default ``pts_o``)
with ``sheets: auto`` (and ``templates.auto_max_ms_per_image`` = ``--budget`` when given; ``--tiles``
sets ``geometry.tiles`` for both). Reported per run: K chosen (and why), image AUROC, pixel AUROC, PRO,
the verdicts at the calibrated operating point (false alarms on test/good, recall on the defective
images, the out-of-fold estimate of the false-alarm rate), and the cost per frame:

- ``atmm ms/frame``: ATMM scoring of test frames (all tiles) against the installed templates, features
  computed first and untimed, median of ``--rounds`` rounds with the two runs of a dataset interleaved
  round by round (so load from other jobs falls on both alike): the cost the template count controls;
- ``fit est. ms/frame``: with ``--budget``, the fit's estimate of the whole frame's cost for the chosen
  K (``frame_cost.FrameCost``: backbone of all tiles + stitching + ATMM of every tile), the quantity
  ``auto_max_ms_per_image`` budgets; without, what sheets auto measured for the chosen K (out-of-fold
  ATMM time scaled to the final sheet count, summed over the tiles; core/auto_sheets.py);
- ``e2e ms/frame``: ``evaluate``'s predict of the whole test set (decode, backbone, ATMM) per frame;
- ``fit s``: the whole fit (features, the sheets-auto ladder, the calibration); K is per tile position.

With ``--budget B`` the last column says whether the chosen selection met B, by the measured
``e2e ms/frame`` (which also counts reading and decoding the file, left out of the budget's estimate:
``benchmarks/bench_tiles.py speed --budget-only`` measures decoded frames). One JSON line per run;
``--json`` writes them all. Timings mean something only on a quiet machine (docs/performance.md states
the load). ``--train-subset F`` (0 < F < 1) fits both runs of every dataset on ``round(F * N)`` of its N
training images, drawn without replacement by ``random.Random(--subset-seed)`` from the sorted file
names (the same draw for both runs; the test set is untouched): a view of the set (symbolic links
under the temp folder), for a machine on which the full ladder does not fit.

    python benchmarks/bench_templates.py [ablation] [--sheets 60] [--sweep 10 20 30 40 50 60] [--json out.json]
    python benchmarks/bench_templates.py geometry   # image/pixel AUROC, PRO per geometry
    python benchmarks/bench_templates.py ladder     # the auto ladder, chosen K, metrics vs ALL
    python benchmarks/bench_templates.py auto                       # bottle, battery_weld, bsd_pitting, synthetic
    python benchmarks/bench_templates.py auto --budget 40           # + a time budget (ms per frame): is it met?
    python benchmarks/bench_templates.py auto --datasets bottle --kind pts_o --json auto.json
    python benchmarks/bench_templates.py auto --quick               # tiny synthetic run (random weights): it works
    python benchmarks/bench_templates.py auto --datasets bsd_pitting --train-subset 0.5   # half the good frames
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

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BATTERY, BOTTLE, BSD, MOBILENET_WEIGHTS, describe, table, with_default_command

from hetmm_ray.config import BackboneConfig, DetectorConfig
from hetmm_ray.core.atmm import anomaly_maps, pixel_major
from hetmm_ray.core.metrics import image_auroc, pixel_auroc, pro_score
from hetmm_ray.core.pts import select_layer, select_templates
from hetmm_ray.core.scoring import gaussian_blur, image_scores
from hetmm_ray.data.mvtec import MVTecCategory
from hetmm_ray.data.synthetic import write_mvtec_layout
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.tiled import TiledHETMM
from hetmm_ray.workflows.evaluation import evaluate, load_images

KINDS = ("all", "ir", "pr", "pc_k", "pts_k", "pts_o")


# --- ablation: the paper's Table RTMM and the template-size sweep ---------------------------------------
def layer_templates(bank: torch.Tensor, kind: str, k: int) -> torch.Tensor:
    """The templates of selection ``kind`` (K sheets, seed 0) of one layer's bank."""
    chosen = select_layer(bank, kind, k, 0)
    if chosen.centres is not None:
        return chosen.centres
    return bank if chosen.indices is None else select_templates(bank, chosen.indices)


def ablation(args: argparse.Namespace) -> None:
    if not (BOTTLE.is_dir() and MOBILENET_WEIGHTS.is_file()):
        raise SystemExit(f"needs {BOTTLE} and {MOBILENET_WEIGHTS}")

    config = DetectorConfig(backbone=BackboneConfig(name="mobilenet_v2", weights=str(MOBILENET_WEIGHTS)))
    det = HETMM(config)
    cat = MVTecCategory(BOTTLE)
    bank, _ = det.extract(load_images(cat.train_paths(), 256))
    bank = {k: v.to(getattr(torch, args.bank_dtype)) for k, v in bank.items()}
    samples = cat.test_samples()
    paths = [s.path for s in samples]
    t0 = time.perf_counter()
    test, _ = det.extract(load_images(paths, 256))
    front_s = (time.perf_counter() - t0) / len(paths)  # decode + resize + backbone, per image
    labels = np.array([s.label for s in samples])
    masks = np.stack([cat.load_mask(s, 256) for s in samples])
    sc = config.scoring

    def run(kind: str, k: int) -> list[object]:
        t0 = time.perf_counter()
        chosen = {layer: layer_templates(b.float(), kind, k) for layer, b in bank.items()}
        select_s = time.perf_counter() - t0
        pm = {layer: pixel_major(t.float()) for layer, t in chosen.items()}
        t0 = time.perf_counter()
        maps = torch.cat(
            [
                anomaly_maps(
                    {layer: v[i : i + 8] for layer, v in test.items()},
                    pm,
                    sc.forward_windows,
                    sc.backward_windows,
                    sc.alphas,
                    sc.layer_weights,
                    256,
                )
                for i in range(0, len(paths), 8)
            ]
        )
        atmm_s = (time.perf_counter() - t0) / len(paths)
        scores = image_scores(maps, sc.score_sigma, top_k=det.config.score_pixels).numpy()
        m = gaussian_blur(maps, sc.map_sigma).numpy()
        sheets = next(iter(chosen.values())).shape[0]
        return [
            kind,
            sheets,
            100 * image_auroc(scores, labels),
            100 * pixel_auroc(m, masks),
            100 * pro_score(m, masks),
            select_s,
            1000 * atmm_s,
            1 / (front_s + atmm_s),
        ]

    headers = ["templates", "sheets", "image AUROC", "pixel AUROC", "PRO", "select s", "ATMM ms/img", "images/s"]
    ablation = [run(kind, args.sheets) for kind in args.kinds]
    sweep = [run("pts_o", k) for k in args.sweep]
    print(
        f"device: {describe(torch.device('cpu'))}; bank {args.bank_dtype}; decode+backbone {1000 * front_s:.0f} ms/img"
    )
    print(f"\nselections at {args.sheets} sheets (paper Table RTMM):")
    print(table(headers, ablation))
    print("\npts_o template-size sweep:")
    print(table(headers, sweep))
    if args.json:
        Path(args.json).write_text(json.dumps({"headers": headers, "ablation": ablation, "sweep": sweep}, indent=1))


# --- geometry and ladder: squash vs letterbox, and the sheets-auto ladder -----------------------------
def synthetic_varied(n_train: int, n_good: int, per_defect: int, size: int) -> Path:
    root = Path(tempfile.gettempdir()) / f"hetmm-synthetic-varied-{n_train}-{n_good}-{per_defect}-{size}"
    if not (root / "ground_truth").exists():
        write_mvtec_layout(
            root, n_train=n_train, n_test_good=n_good, n_test_per_defect=per_defect, seed=11, size=size, aspect="varied"
        )
    return root


def dataset(name: str, args: argparse.Namespace) -> Path:
    return {"bottle": BOTTLE, "battery_weld": BATTERY}.get(name) or synthetic_varied(
        args.synthetic_train, args.synthetic_good, args.synthetic_per_defect, args.synthetic_size
    )


def config(geometry: str, name: str, args: argparse.Namespace) -> DetectorConfig:
    """Defaults with real mobilenet_v2 weights; the synthetic product at its own (smaller) size."""
    size = args.synthetic_size if name == "synthetic" else 256
    return DetectorConfig.from_dict(
        {
            "backbone": {
                "name": "mobilenet_v2",
                "weights": str(MOBILENET_WEIGHTS),
                "geometry": geometry,
                "image_size": size,
            }
        }
    )


def scored(det: HETMM, category: MVTecCategory, images: list[np.ndarray]) -> dict[str, float]:
    samples = category.test_samples()
    t0 = time.perf_counter()
    pred = det.predict(images)
    seconds = time.perf_counter() - t0
    labels = np.array([s.label for s in samples])
    masks = [category.load_mask(s, m.shape) for s, m in zip(samples, pred.maps, strict=True)]
    if isinstance(pred.maps, np.ndarray):
        masks = np.stack(masks)
    return {
        "image_auroc": 100 * image_auroc(pred.scores, labels),
        "pixel_auroc": 100 * pixel_auroc(pred.maps, masks),
        "pro": 100 * pro_score(pred.maps, masks),
        "ms_per_image": 1000 * seconds / len(images),
    }


def fitted(path: Path, cfg: DetectorConfig) -> tuple[HETMM, MVTecCategory, list[np.ndarray]]:
    category = MVTecCategory(path)
    bb = cfg.backbone
    det = HETMM(cfg).fit(load_images(category.train_paths(), bb.image_size, geometry=bb.geometry))
    test = load_images([s.path for s in category.test_samples()], bb.image_size, geometry=bb.geometry)
    return det, category, test


def run_geometry(args: argparse.Namespace) -> list[dict[str, object]]:
    rows = []
    for name in args.datasets:
        for geometry in ("squash", "letterbox"):
            det, category, test = fitted(dataset(name, args), config(geometry, name, args))
            m = scored(det, category, test)
            rows.append({"dataset": name, "geometry": geometry, "train": det.templates.n_images, **m})
            print(json.dumps(rows[-1]), flush=True)
    print(
        table(
            ["dataset", "geometry", "train", "image AUROC", "pixel AUROC", "PRO", "ms/img"],
            [
                [
                    r["dataset"],
                    r["geometry"],
                    r["train"],
                    f"{r['image_auroc']:.1f}",
                    f"{r['pixel_auroc']:.2f}",
                    f"{r['pro']:.2f}",
                    f"{r['ms_per_image']:.0f}",
                ]
                for r in rows
            ],
        )
    )
    return rows


def run_sheets(args: argparse.Namespace) -> list[dict[str, object]]:
    out = []
    for name in args.datasets:
        det, category, test = fitted(dataset(name, args), config(args.geometry, name, args))
        reference = scored(det, category, test)
        t0 = time.perf_counter()
        det.progress = True  # prints each rung as it is measured
        det.compress("pts_o", "auto")
        det.progress = False
        compress_s = time.perf_counter() - t0
        auto = det.templates.meta["sheets_auto"]
        chosen = scored(det, category, test)
        rec = {"dataset": name, "train": det.templates.n_images, "all": reference, "auto": chosen,
               "compress_s": compress_s, "sheets_auto": auto}  # fmt: skip
        out.append(rec)
        print(json.dumps(rec), flush=True)
        print(f"\n{name} ({det.templates.n_images} good images, {args.geometry}): the ladder")
        print(
            table(
                ["K", "rank corr", "norm diff", "verdicts %", "OOF ms/img", "agrees"],
                [
                    [
                        r["sheets"],
                        f"{r['rank_corr']:.4f}",
                        f"{r['norm_diff']:.4f}",
                        f"{100 * r['verdict_agreement']:.1f}",
                        f"{r['ms_per_image']:.1f}",
                        "yes" if r["agrees"] else "no",
                    ]
                    for r in auto["ladder"]
                ]
                + [["ALL", "", "", "", f"{auto['all_ms_per_image']:.1f}", ""]],
            )
        )
        print(f"chosen K = {auto['chosen']} ({auto['why']}); ladder + selection {compress_s:.0f} s")
        print(
            table(
                ["templates", "sheets", "image AUROC", "pixel AUROC", "PRO", "predict ms/img"],
                [
                    [
                        "all",
                        det.templates.n_images,
                        *(f"{reference[k]:.2f}" for k in ("image_auroc", "pixel_auroc", "pro")),
                        f"{reference['ms_per_image']:.0f}",
                    ],
                    [
                        "pts_o auto",
                        auto["chosen"],
                        *(f"{chosen[k]:.2f}" for k in ("image_auroc", "pixel_auroc", "pro")),
                        f"{chosen['ms_per_image']:.0f}",
                    ],
                ],
            )
        )
    return out


def geometry_or_ladder(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.datasets is None:
        args.datasets = (
            ["bottle", "battery_weld", "synthetic"] if args.command == "geometry" else ["bottle", "synthetic"]
        )
    if args.synthetic_train is None:
        args.synthetic_train = 150 if args.command == "geometry" else 600
    rows = run_geometry(args) if args.command == "geometry" else run_sheets(args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


# --- auto: sheets auto against ALL, per dataset -------------------------------------------------------
DATA = {"bottle": BOTTLE, "battery_weld": BATTERY, "bsd_pitting": BSD}


def synthetic_gears(n_train: int, n_good: int, per_defect: int, size: int) -> Path:
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
        from hetmm_ray.detection.scorer import as_rgb

        feats, boxes, _ = det.tile_features([as_rgb(p) for p in paths], bank=False)
        t = det.n_tiles
        out = []
        for p, d in enumerate(det.dets):
            rows = list(range(p, len(paths) * t, t))
            out.append((d.scorer, {k: v[rows] for k, v in feats.items()}, None if boxes is None else boxes[p::t]))
        return out
    from hetmm_ray.workflows.evaluation import load_images

    bb = det.config.backbone
    images = load_images(paths, bb.image_size, geometry=bb.geometry)
    feats, _, boxes = det.pipeline.extract_with_boxes(images)
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


def auto(args: argparse.Namespace) -> None:
    if args.train_subset is not None and not 0 < args.train_subset < 1:
        sys.exit("--train-subset must lie strictly between 0 and 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tiles is None:
        args.tiles = [1, 1]
    elif args.tiles != "auto":
        args.tiles = [int(v) for v in args.tiles.lower().split("x")]
    if args.quick:
        datasets = {"synthetic": synthetic_gears(24, 4, 2, 64)}
        args.rounds, args.timing_images = min(args.rounds, 2), min(args.timing_images, 4)
    else:
        names = [n.strip() for n in args.datasets.split(",") if n.strip()]
        datasets = {n: DATA[n] if n in DATA else synthetic_gears(args.synthetic_train, 40, 10, 256) for n in names}
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


COMMANDS = {"ablation": ablation, "geometry": geometry_or_ladder, "ladder": geometry_or_ladder, "auto": auto}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("ablation", help="the paper's selections and the pts_o sweep on bottle (the default)")
    p.add_argument("--sheets", type=int, default=60)
    p.add_argument("--sweep", type=int, nargs="*", default=[10, 20, 30, 40, 50, 60])
    p.add_argument("--kinds", nargs="+", default=list(KINDS))
    p.add_argument("--bank-dtype", default="float16", choices=("float16", "float32"))
    p.add_argument("--json")
    for name, text in (("geometry", "squash vs letterbox"), ("ladder", "the sheets-auto ladder against ALL")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--datasets", nargs="+", default=None, help="bottle, battery_weld, synthetic")
        p.add_argument("--geometry", default="letterbox", help="ladder: the geometry to run with")
        p.add_argument(
            "--synthetic-train", type=int, default=None, help="good training images (geometry 150, ladder 600)"
        )
        p.add_argument("--synthetic-good", type=int, default=40)
        p.add_argument("--synthetic-size", type=int, default=128, help="synthetic side and backbone image_size")
        p.add_argument("--synthetic-per-defect", type=int, default=20)
        p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
        p.add_argument("--json", help="write the records here")
    p = sub.add_parser("auto", help="sheets auto against ALL, per dataset: accuracy, verdicts, cost per frame")
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
    args = ap.parse_args(with_default_command(sys.argv[1:], list(COMMANDS), "ablation"))
    COMMANDS[args.command](args)


if __name__ == "__main__":
    main()

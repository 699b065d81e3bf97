"""The verdict threshold: what calibration costs, why the ``far`` rule's estimator, and an inspection
region's effect on false alarms and recall.

``cost``: the cost of out-of-fold calibration (``HETMM.out_of_fold``) against the formula in
ThresholdConfig. Random unit features with mobilenet_v2's layer shapes at 256 px (24x64x64, 32x32x32,
96x16x16; fp16 bank), so no backbone runs: what is timed is the calibration itself. For ALL the cost is
one ATMM scoring per scored image against ~(1 - 1/folds) N templates, so seconds / (n_scored *
K_fold) should be flat; for a compressed selection it adds one selection per fold.

``estimators``: why the ``far`` rule's estimator (core/calibration.py), a seeded simulation. For each
score family (normal, log-normal, Gumbel, gamma, Weibull, Student-t), sample size n and target rate a,
draw n "out-of-fold good scores", set the threshold with each candidate estimator and take the *true*
share of the family above it (its survival function). Prints the median and the 10-90 % band over
draws. ``--outliers 2`` replaces two scores with 5x and 8x the largest (defective images among the
good ones) to check robustness.

``region``: a product whose good parts carry a printed code that changes on every part. The synthetic
gear (``SyntheticProduct(printed_code=True)``): six random 7-segment digits on a plate below the bore,
at a random offset, different on every part; defects keep clear of the plate. The product is fitted
once at the defaults (efficientnet_lite0 packaged weights, 256-px letterbox canvas, ALL templates,
``far`` rule at 1 %, 10 folds), then given a region that excludes the plate
(``SyntheticProduct.code_region``) and recalibrated (``hetmm region``'s path). Both are measured on the
same fresh images: the out-of-fold estimate at the threshold (the tail model's, and the share of
out-of-fold scores above it) and the measured share of fresh good parts flagged; recall on defective
parts per kind and overall; image AUROC; recall at the test set's best threshold flagging <= 1 % of the
fresh good parts; the lowest defective score over the threshold. The maps of the fresh images are
computed once; each product's image scores come from them with its own region masks
(``Scorer.score``'s arithmetic; checked against ``predict`` on a few images).

    python benchmarks/bench_threshold.py cost --sizes 50 100 200 --pts 100
    python benchmarks/bench_threshold.py estimators --draws 400 [--outliers 2]
    python benchmarks/bench_threshold.py region [--train 60] [--fresh 200] [--defects 30] [--seed 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from statistics import NormalDist

import numpy as np
import torch
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig
from hetmm_ray.core.calibration import TailModel, labelled_cuts, recall_cut
from hetmm_ray.core.metrics import image_auroc
from hetmm_ray.core.region import check_region_covers
from hetmm_ray.core.scoring import image_scores
from hetmm_ray.core.templates import TemplateSet
from hetmm_ray.data.synthetic import DEFECT_KINDS, SyntheticProduct
from hetmm_ray.detection.detector import HETMM

# --- cost: out-of-fold calibration ----------------------------------------------------------------------------
SHAPES = {"features.3": (24, 64, 64), "features.6": (32, 32, 32), "features.13": (96, 16, 16)}


def random_bank(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for layer, (c, h, w) in SHAPES.items():
        x = torch.randn((n, c, h, w), generator=g)
        out[layer] = (x / x.norm(dim=1, keepdim=True)).to(torch.float16)
    return out


def cost(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    print("| templates | N | folds | scored | K per fold | seconds | ms per scored image | us per (image x sheet) |")
    print("|---|---|---|---|---|---|---|---|")
    runs = [("all", n) for n in args.sizes] + [("pts_o", n) for n in args.pts]
    for kind, n in runs:
        config = DetectorConfig(
            backbone=BackboneConfig(name="mobilenet_v2", weights="random"),
            templates=TemplateConfig(kind=kind, sheets=args.sheets),
            device="cpu",
        )
        det = HETMM(config)
        ts = TemplateSet(
            bank=random_bank(n), config=config, weights_id="random", image_digests=tuple(map(str, range(n)))
        )
        start = time.perf_counter()
        oof = det.out_of_fold(ts)
        seconds = time.perf_counter() - start
        scored = len(oof.scores)
        k = round(n * (1 - 1 / oof.folds)) if kind == "all" else args.sheets
        per = 1000 * seconds / scored
        pair = 1e6 * seconds / (scored * k)
        print(f"| {kind} | {n} | {oof.folds} | {scored} | {k} | {seconds:.1f} | {per:.1f} | {pair:.0f} |")


# --- estimators: the far rule's estimator, simulated -------------------------------------------------------
FAMILIES = {
    "normal": stats.norm(1, 0.1),
    "lognormal(0.3)": stats.lognorm(0.3),
    "lognormal(0.8)": stats.lognorm(0.8),
    "gumbel": stats.gumbel_r(1, 0.1),
    "gamma(3)": stats.gamma(3),
    "weibull(2)": stats.weibull_min(2),
    "student-t(4)": stats.t(4, 1, 0.1),
}


def empirical(x: np.ndarray, a: float) -> float:
    x = np.sort(x)
    k = math.ceil((len(x) + 1) * (1 - a))
    return float(x[k - 1]) if k <= len(x) else float("nan")


def log_normal(x: np.ndarray, a: float, *, upper: bool) -> float:
    logs = np.log(np.maximum(x, 1e-6))
    mu = np.median(logs)
    s = np.median(logs[logs > mu] - mu) / 0.6745 if upper else 1.4826 * np.median(np.abs(logs - mu))
    return float(np.exp(mu + NormalDist().inv_cdf(1 - a) * s))


ESTIMATORS = {
    "empirical rank": empirical,
    "lognormal MAD": lambda x, a: log_normal(x, a, upper=False),
    "lognormal upper semi-MAD": lambda x, a: log_normal(x, a, upper=True),
    "far rule (TailModel)": lambda x, a: TailModel(x.tolist()).threshold(a),
}


def estimators(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(0)
    for a in args.rates:
        for n in args.sizes:
            print(f"\n### target {100 * a:g} %, n = {n}{f', {args.outliers} outliers' if args.outliers else ''}")
            print("| family | " + " | ".join(ESTIMATORS) + " |")
            print("|---|" + "---|" * len(ESTIMATORS))
            for name, dist in FAMILIES.items():
                cells = []
                draws = [np.maximum(dist.rvs(n, random_state=rng), 1e-3) for _ in range(args.draws)]
                if args.outliers:
                    for x in draws:
                        x[: args.outliers] = x.max() * np.array([5.0, 8.0, 11.0, 14.0])[: args.outliers]
                for est in ESTIMATORS.values():
                    far = np.array([dist.sf(est(x, a)) for x in draws]) * 100
                    if np.isnan(far).all():
                        cells.append("n/a")
                        continue
                    lo, med, hi = np.nanpercentile(far, [10, 50, 90])
                    cells.append(f"{med:.2f} [{lo:.2f}, {hi:.2f}]")
                print(f"| {name} | " + " | ".join(cells) + " |")


# --- region: a printed code excluded -------------------------------------------------------------------
def scores_of(det: HETMM, images: list[np.ndarray], configs: list[DetectorConfig]) -> list[np.ndarray]:
    """Image scores of ``images`` against ``det``'s installed templates under each config's region."""
    scorer = det.scorer
    out: list[list[float]] = [[] for _ in configs]
    for _, batch, boxes in scorer.decoded_batches(images, "score"):
        maps = scorer.score_maps(scorer.features(batch, boxes), scorer.prepared, boxes)
        in_map = scorer.map_boxes(boxes)
        for k, cfg in enumerate(configs):
            regions = scorer.region_masks(in_map, len(maps), region_of=cfg)
            sc = cfg.scoring
            out[k].extend(image_scores(maps, sc.score_sigma, in_map, regions, top_k=cfg.score_pixels).tolist())
    return [np.asarray(s) for s in out]


def region(args: argparse.Namespace) -> None:

    product = SyntheticProduct(seed=args.seed, size=args.size, printed_code=True)
    region = check_region_covers({"size": [args.size, args.size], "exclude": [{"rect": product.code_region()}]})
    config = DetectorConfig().replace(**{"threshold.false_alarm_rate": args.target})
    t0 = time.perf_counter()
    det = HETMM(config).fit([product.good(i) for i in range(args.train)])
    fit_s = time.perf_counter() - t0
    plain_ts = det.templates
    assert plain_ts is not None
    t0 = time.perf_counter()
    ruled_ts = det.calibrated(replace(plain_ts, config=replace(plain_ts.config, region=region)))
    recal_s = time.perf_counter() - t0

    fresh = [product.good(10_000 + i) for i in range(args.fresh)]
    bad, kinds = [], []
    for k, kind in enumerate(DEFECT_KINDS):
        for i in range(args.defects):
            bad.append(product.defective(20_000 + 1000 * k + i, kind)[0])
            kinds.append(kind)
    t0 = time.perf_counter()
    good_scores = scores_of(det, fresh, [plain_ts.config, ruled_ts.config])
    bad_scores = scores_of(det, bad, [plain_ts.config, ruled_ts.config])
    score_s = time.perf_counter() - t0

    # the same arithmetic as predict: a few images through a detector holding the region's version
    ruled = HETMM(config)
    ruled.scorer.install(ruled_ts)
    check = ruled.predict(fresh[:4]).scores
    np.testing.assert_allclose(check, good_scores[1][:4], rtol=1e-5, atol=1e-6)

    rows, results = [], {}
    kinds_arr = np.array(kinds)
    for name, ts, good_s, bad_s in (
        ("no region", plain_ts, good_scores[0], bad_scores[0]),
        ("code excluded", ruled_ts, good_scores[1], bad_scores[1]),
    ):
        cal = ts.calibration
        assert cal is not None
        op = cal.operating_point("far", false_alarm_rate=args.target)
        oof = np.asarray(cal.scores)
        measured_fa = float(np.mean(good_s > op.threshold))
        flagged = bad_s > op.threshold
        labels = np.r_[np.zeros(len(good_s)), np.ones(len(bad_s))]
        all_s = np.r_[good_s, bad_s]
        cuts = labelled_cuts(all_s.tolist(), labels.astype(int).tolist())
        res = {
            "threshold": op.threshold,
            "oof_estimated_false_alarm_rate": op.false_alarm_rate,
            "oof_share_above": float(np.mean(oof > op.threshold)),
            "oof_mean": float(oof.mean()),
            "fresh_good_mean": float(good_s.mean()),
            "measured_false_alarm_rate": measured_fa,
            "false_alarms": int(np.sum(good_s > op.threshold)),
            "recall": float(flagged.mean()),
            "recall_by_kind": {k: float(flagged[kinds_arr == k].mean()) for k in DEFECT_KINDS},
            "image_auroc": image_auroc(all_s, labels),
            "recall_at_1pct_measured_fa": recall_cut(cuts, 0.01).recall,
            "lowest_defect_over_threshold": float(bad_s.min() / op.threshold),
        }
        results[name] = res
        rows.append(
            [
                name,
                f"{res['threshold']:.4f}",
                f"{100 * res['oof_estimated_false_alarm_rate']:.2f}% / {100 * res['oof_share_above']:.2f}%",
                f"{res['false_alarms']}/{len(good_s)} = {100 * measured_fa:.1f}%",
                f"{100 * res['recall']:.1f}%",
                " ".join(f"{k} {100 * v:.0f}%" for k, v in res["recall_by_kind"].items()),
                f"{100 * res['image_auroc']:.1f}",
                f"{100 * res['recall_at_1pct_measured_fa']:.1f}%",
                f"{res['oof_mean']:.4f} / {res['fresh_good_mean']:.4f}",
                f"{res['lowest_defect_over_threshold']:.2f}",
            ]
        )
    print(
        f"synthetic gear with a printed code, seed {args.seed}, {args.size} px; {args.train} train, "
        f"{args.fresh} fresh good, {args.defects} per defect kind; {config.backbone.name} "
        f"({det.backbone.weights_id}), {config.backbone.image_size}-px {config.backbone.geometry}, "
        f"{config.templates.kind}; far rule {100 * args.target:g}%, {config.threshold.folds} folds; "
        f"torch threads {torch.get_num_threads()}"
    )
    print(f"fit {fit_s:.1f}s, recalibrate with the region {recal_s:.1f}s, score {score_s:.1f}s")
    print(
        table(
            [
                "region",
                "threshold",
                "OOF est. FA / OOF above",
                "fresh good flagged",
                "recall",
                "recall by kind",
                "image AUROC",
                "recall @1% measured FA",
                "mean good score OOF / fresh",
                "lowest defect / threshold",
            ],
            rows,
        )
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


COMMANDS = {"cost": cost, "estimators": estimators, "region": region}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("cost", help="out-of-fold calibration's cost against ThresholdConfig's formula")
    p.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200])
    p.add_argument("--pts", type=int, nargs="*", default=[100], help="sizes to also time with pts_o")
    p.add_argument("--sheets", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p = sub.add_parser("estimators", help="the far rule's estimator against others, simulated")
    p.add_argument("--draws", type=int, default=400)
    p.add_argument("--outliers", type=int, default=0)
    p.add_argument("--sizes", type=int, nargs="+", default=[20, 37, 100, 300, 1000])
    p.add_argument("--rates", type=float, nargs="+", default=[0.01, 0.05])
    p = sub.add_parser("region", help="a printed code excluded by a region: false alarms and recall")
    p.add_argument("--train", type=int, default=60, help="good training images")
    p.add_argument("--fresh", type=int, default=200, help="fresh good images measured")
    p.add_argument("--defects", type=int, default=30, help="defective images per kind")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", type=int, default=256, help="generated frame side (px)")
    p.add_argument("--target", type=float, default=0.01, help="far rule: target false-alarm rate")
    p.add_argument("--json")
    args = ap.parse_args()
    COMMANDS[args.command](args)


if __name__ == "__main__":
    main()

"""Inspection region: a product whose good parts carry a printed code that changes on every part.

The synthetic gear (``SyntheticProduct(printed_code=True)``): six random 7-segment digits on a plate
below the bore, at a random offset, different on every part; defects keep clear of the plate. The
product is fitted once at the defaults (efficientnet_lite0 packaged weights, 256-px letterbox
canvas, ALL templates, ``far`` rule at 1 %, 10 folds), then given a region that excludes the
plate (``SyntheticProduct.code_region``) and recalibrated (``hetmm region``'s path: the same
templates, out-of-fold scores under the region). Both are measured on the same fresh images:

- the out-of-fold estimate at the threshold (the tail model's, and the share of out-of-fold
  scores above it), and the measured share of fresh good parts flagged;
- recall on defective parts (every defect lies outside the code), per kind and overall; image
  AUROC; recall at the test set's best threshold flagging <= 1 % of the fresh good parts; the
  lowest defective score over the threshold (the headroom a fainter defect would have).

The maps of the fresh images are computed once; each product's image scores come from them with
its own region masks (``Scorer.score``'s arithmetic; checked against ``predict`` on a few images).

    python benchmarks/bench_region.py [--train 60] [--fresh 200] [--defects 30] [--seed 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table

from hetmm_ray.config import DetectorConfig
from hetmm_ray.core.calibration import labelled_cuts, recall_cut
from hetmm_ray.core.metrics import image_auroc
from hetmm_ray.core.region import check_region_covers
from hetmm_ray.core.scoring import image_scores
from hetmm_ray.data.synthetic import DEFECT_KINDS, SyntheticProduct
from hetmm_ray.detector import HETMM


def scores_of(det: HETMM, images: list[np.ndarray], configs: list[DetectorConfig]) -> list[np.ndarray]:
    """Image scores of ``images`` against ``det``'s installed templates under each config's region."""
    scorer = det.scorer
    out: list[list[float]] = [[] for _ in configs]
    for _, batch, boxes in scorer.decoded_batches(images, "score"):
        maps = scorer.score_maps(scorer.features(batch, boxes), scorer.prepared, boxes)
        in_map = scorer.map_boxes(boxes)
        for k, cfg in enumerate(configs):
            regions = scorer.region_masks(in_map, len(maps), region_of=cfg)
            out[k].extend(image_scores(maps, cfg.scoring.score_sigma, in_map, regions).tolist())
    return [np.asarray(s) for s in out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=60, help="good training images")
    ap.add_argument("--fresh", type=int, default=200, help="fresh good images measured")
    ap.add_argument("--defects", type=int, default=30, help="defective images per kind")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", type=int, default=256, help="generated frame side (px)")
    ap.add_argument("--target", type=float, default=0.01, help="far rule: target false-alarm rate")
    ap.add_argument("--json")
    args = ap.parse_args()

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


if __name__ == "__main__":
    main()

"""The false-alarm estimate printed with a threshold, against held-out good parts; and the good set's
own outliers (core/calibration.py "The estimate reported with a threshold", core/good_outliers.py).

For each product of ``../shared/data`` named (``bottle``, ``battery_weld``, ``bsd_pitting``): a fit at
the defaults on ``train/good`` (``detector_choice.new_detector``: the fit's own geometry rule), then for each
far rate in ``--rates`` the threshold, its printed estimate with its stated interval
(``TailModel.estimate``: Clopper-Pearson at ``ESTIMATE_CONFIDENCE`` from the ``m`` of ``n``
out-of-fold scores above), and the measured share of ``test/good`` scoring above it (``k`` of ``N``).

The check: ``k`` lies inside the 95 % central range of ``BetaBinomial(N, m + 1, n - m)``, the number of
``N`` new exchangeable good parts above the threshold when ``P(above)`` is distributed as the stated
estimate says (``Beta(m + 1, n - m)``, mean ``(m + 1) / (n + 1)``): the printed figure and its error,
widened by nothing but the held-out set's own binomial noise. Test goods that are the same content as
a training frame (battery_weld holds 7) are scored by the product as parts it has seen; they are
counted, and the measure is given without them too.

The good frames standing apart (``operations.good_outliers``) are printed by file name, with the
threshold with and without them, and ``--drop`` refits without them (``Detector.drop``: what
``hetmm drop`` stores) and gives the threshold after.

    python benchmarks/bench_estimate.py [--data battery_weld bottle bsd_pitting] [--rates 0.01 0.02 0.05]
        [--drop] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import BATTERY, BOTTLE, BSD

DATA = {"bottle": BOTTLE, "battery_weld": BATTERY, "bsd_pitting": BSD}


def _images(folder: Path) -> list[Path]:
    from hetmm_ray.config import IMAGE_SUFFIXES

    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)


def _tail_alone(tail: Any, t: float) -> float:
    """The robust log-normal's share above ``t`` (``TailModel``'s ``mu`` and ``log_scale``)."""
    import math
    from statistics import NormalDist

    if tail.log_scale <= 0:
        return 0.0
    return NormalDist().cdf(-(math.log(max(t, 1e-6)) - tail.mu) / tail.log_scale)


def measure(name: str, root: Path, rates: list[float], drop: bool) -> dict[str, Any]:
    import numpy as np

    from hetmm_ray.config import DetectorConfig
    from hetmm_ray.core.calibration import TailModel
    from hetmm_ray.core.device import image_digest
    from hetmm_ray.detection.detector_choice import new_detector
    from hetmm_ray.detection.scorer import as_rgb
    from hetmm_ray.workflows import operations

    train = [str(p) for p in _images(root / "train" / "good")]
    test = [str(p) for p in _images(root / "test" / "good")]
    start = time.perf_counter()
    det = new_detector(DetectorConfig(), train)
    det.fit(train)
    fit_s = time.perf_counter() - start
    scores = np.concatenate([det.predict(test[i : i + 16]).scores for i in range(0, len(test), 16)])
    held = set(det.template_set().image_digests)
    seen = np.array([image_digest(as_rgb(p)) in held for p in test])
    cal = det.calibration
    assert cal is not None
    tail = TailModel(cal.scores)
    rows = []
    for rate in rates:
        t = tail.threshold(rate)
        e = tail.estimate(t)
        k, n_test = int((scores > t).sum()), len(scores)
        k_new, n_new = int((scores[~seen] > t).sum()), int((~seen).sum())
        predictive = stats.betabinom(n_test, e.above + 1, e.n - e.above)
        lo, hi = (int(v) for v in predictive.interval(0.95))
        rows.append(
            {
                "rate": rate,
                "threshold": t,
                "regime": tail.regime(rate),
                "estimate": e.to_json(),
                # what the tail model alone says above t (the estimate before it followed the floor)
                "tail_model_alone": _tail_alone(tail, t),
                "held_out_above": k,
                "held_out": n_test,
                "held_out_rate": k / n_test,
                "predictive_range": [lo, hi],
                "within": lo <= k <= hi,
                "unseen_above": k_new,
                "unseen": n_new,
            }
        )
    report = operations.good_outliers(det)
    names = dict(zip(det.template_set().image_digests, (Path(p).name for p in train), strict=False))
    out: dict[str, Any] = {
        "data": name,
        "train": len(train),
        "test_good": len(test),
        "test_good_seen_in_train": int(seen.sum()),
        "fit_s": round(fit_s, 1),
        "oof_scores": list(cal.scores),
        "test_good_scores": scores.tolist(),
        "rates": rows,
        "outliers": None if report is None else report.to_json(),
        "outlier_names": [] if report is None else [names.get(f.digest, f.digest[:12]) for f in report.frames],
        "outlier_text": None if report is None else report.describe(names),
    }
    if drop and report is not None and report.frames:
        before = det.operating_point()
        det.drop([f.digest for f in report.frames])
        after = det.operating_point()
        assert before is not None and after is not None
        scores_after = np.concatenate([det.predict(test[i : i + 16]).scores for i in range(0, len(test), 16)])
        out["dropped"] = {
            "threshold_before": before.threshold,
            "threshold_after": after.threshold,
            "estimate_after": None if after.estimate is None else after.estimate.to_json(),
            "held_out_above_after": int((scores_after > after.threshold).sum()),
            "images_after": det.template_set().n_images,
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", nargs="+", default=["battery_weld", "bottle", "bsd_pitting"], choices=sorted(DATA))
    ap.add_argument("--rates", nargs="+", type=float, default=[0.01, 0.02, 0.05])
    ap.add_argument("--drop", action="store_true", help="refit without the frames standing apart")
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()
    results = []
    for name in args.data:
        root = DATA[name]
        if not (root / "train" / "good").is_dir():
            print(f"{name}: {root} absent, skipped")
            continue
        r = measure(name, root, args.rates, args.drop)
        results.append(r)
        print(
            f"{name}: {r['train']} good frames fitted in {r['fit_s']}s; {r['test_good']} held-out good "
            f"({r['test_good_seen_in_train']} of them the same content as a training frame)"
        )
        print(
            f"{'rate':>5}  {'threshold':>9}  {'regime':>10}  printed estimate (95% interval; m of n)   "
            "held-out above  predictive 95%  within"
        )
        for row in r["rates"]:
            e = row["estimate"]
            printed = f"{100 * e['rate']:.2f}% ({100 * e['low']:.2f}-{100 * e['high']:.2f}%; {e['above']} of {e['n']})"
            held = f"{row['held_out_above']} of {row['held_out']} ({100 * row['held_out_rate']:.1f}%)"
            lo, hi = row["predictive_range"]
            print(
                f"{100 * row['rate']:>4g}%  {row['threshold']:>9.4f}  {row['regime']:>10}  {printed:<40}  "
                f"{held:>14}  {f'{lo}-{hi}':>14}  {'yes' if row['within'] else 'NO'}"
            )
        print(r["outlier_text"])
        if "dropped" in r:
            d = r["dropped"]
            print(
                f"dropped: threshold {d['threshold_before']:.4f} -> {d['threshold_after']:.4f} "
                f"({d['images_after']} frames); held-out good above after: {d['held_out_above_after']}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if all(row["within"] for r in results for row in r["rates"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Why the ``far`` rule's estimator (core/calibration.py): a seeded simulation.

For each score family (normal, log-normal, Gumbel, gamma, Weibull, Student-t),
sample size n and target rate a, draw n "out-of-fold good scores", set the
threshold with each candidate estimator and take the *true* share of the
family above it (its survival function). Prints the median and the 10-90 %
band over draws. ``--outliers 2`` replaces two scores with 5x and 8x the
largest (defective images among the good ones) to check robustness.

    python benchmarks/sim_threshold.py --draws 400
    python benchmarks/sim_threshold.py --draws 400 --outliers 2
"""

from __future__ import annotations

import argparse
import math
from statistics import NormalDist

import numpy as np
from scipy import stats

from hetmm_ray.core.calibration import TailModel

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=400)
    ap.add_argument("--outliers", type=int, default=0)
    ap.add_argument("--sizes", type=int, nargs="+", default=[20, 37, 100, 300, 1000])
    ap.add_argument("--rates", type=float, nargs="+", default=[0.01, 0.05])
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()

"""``hetmm compare --on-ray``: one pass scoring each decoded batch with both versions, against a pass
per version joined on path (what it did before; what it still does across canvases), in one run.

Two versions of a bottle product (the default backbone, ALL templates of 40 and of 50 other
train images; same canvas), compared over ``test/`` (83 PNGs) on the embedded local Ray. Each way is
timed ``--runs`` times, alternating, after one warm-up of each (Ray's start excluded); the scores
of both ways must be equal (exit status 1 if not).

    PYTHONPATH=. python benchmarks/bench_compare_ray.py [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import BOTTLE

from hetmm_ray.archive import JobOptions, compare_job
from hetmm_ray.config import DetectorConfig
from hetmm_ray.detector import HETMM
from hetmm_ray.distributed.runtime import connect
from hetmm_ray.store import open_store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if not BOTTLE.is_dir():
        sys.exit(f"bench_compare_ray: {BOTTLE} is not there (../shared/data)")
    train = sorted((BOTTLE / "train" / "good").glob("*.png"))
    store_uri = tempfile.mkdtemp(prefix="bench-compare-")
    store = open_store(store_uri)
    base = HETMM(DetectorConfig()).fit([p.read_bytes() for p in train[:40]]).save(store, "bottle")
    candidate = HETMM(DetectorConfig()).fit([p.read_bytes() for p in train[40:90]]).save(store, "bottle")
    source = str(BOTTLE / "test")
    canvas_of = store.record("bottle", base).config  # what read_and_fit fits images to (both versions)
    opts = JobOptions(store=store_uri, progress=False)
    connect(None)

    def two_passes() -> list[compare_job.Side]:
        return [compare_job._collect(compare_job.score_rows(source, "bottle", v, opts))[0] for v in (base, candidate)]

    def one_pass() -> list[compare_job.Side]:
        return compare_job._paired(source, "bottle", (base, candidate), canvas_of, opts)

    ways = {"one pass (both versions per batch)": one_pass, "a pass per version": two_passes}
    sides = {name: way() for name, way in ways.items()}  # warm-up, and the scores compared below
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.runs):
        for name, way in ways.items():
            t0 = time.perf_counter()
            way()
            times[name].append(time.perf_counter() - t0)
    one, two = sides.values()
    images = len(one[0][0])
    worst = max(abs(a[0][p][0] - b[0][p][0]) for a, b in zip(one, two, strict=True) for p in a[0])
    for name, ts in times.items():
        runs = ", ".join(f"{t:.1f}" for t in ts)
        print(f"{name}: {images} images, {runs} s (median {statistics.median(ts):.1f})")
    one_s, two_s = (statistics.median(ts) for ts in times.values())
    ratio = one_s / two_s
    print(f"one pass / a pass per version = {ratio:.2f}; largest score difference {worst:g}")
    sys.exit(0 if worst == 0.0 else 1)


if __name__ == "__main__":
    main()

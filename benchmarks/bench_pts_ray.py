"""PTS fanned out as Ray tasks: wall time with 1, 2 and 4 workers, and the fan-out cost per task.

The same 209-image wide_resnet-shaped bank as ``bench_pts.py`` (cached
features), K = 60. For each worker count a fresh local Ray is started with that
many CPUs and every layer's pixels run as chunks of ``--chunk`` pixels, one CPU
per task. The single-process :func:`pts_indices` (all cores, torch threads) is
measured in the same run as the baseline; results are checked to be identical.

    python benchmarks/bench_pts_ray.py [--workers 1 2 4] [--chunk 256] [--sheets 60]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import ray
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pts import extract_features
from common import describe, table

from hetmm_ray.core.pts import pts_indices
from hetmm_ray.distributed import pts_indices_ray, shutdown_ray


def fanout_overhead(tasks: int) -> float:
    """Seconds per task for tasks doing (almost) nothing: scheduling, transfer and result return."""
    tiny = torch.nn.functional.normalize(torch.randn(3, 4, 1, tasks), dim=1)
    pts_indices_ray(tiny, 2, chunk_pixels=1)  # warm the workers
    t0 = time.perf_counter()
    pts_indices_ray(tiny, 2, chunk_pixels=1)
    return (time.perf_counter() - t0) / tasks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--sheets", type=int, default=60)
    ap.add_argument("--images", type=int, default=209)
    args = ap.parse_args()

    bank, what = extract_features("synthetic", "wide_resnet50_2", args.images)
    t0 = time.perf_counter()
    reference = {name: pts_indices(b, args.sheets) for name, b in bank.items()}
    single = time.perf_counter() - t0

    rows = [["single process (torch threads)", "-", single, 1.0, "-"]]
    for workers in args.workers:
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            t0 = time.perf_counter()
            got = {name: pts_indices_ray(b, args.sheets, chunk_pixels=args.chunk) for name, b in bank.items()}
            wall = time.perf_counter() - t0
            same = all(torch.equal(got[n], reference[n]) for n in bank)
            overhead = fanout_overhead(100)
        finally:
            shutdown_ray()
        rows.append(
            [f"Ray, {workers} worker CPUs", "yes" if same else "NO", wall, single / wall, f"{1000 * overhead:.1f}"]
        )

    pixels = sum(b.shape[2] * b.shape[3] for b in bank.values())
    print(
        f"{describe(torch.device('cpu'))}; features: {what}; K = {args.sheets}; {pixels} pixels; "
        f"chunks of {args.chunk} pixels"
    )
    print(table(["PTS run", "identical", "wall s", "speed-up vs single", "fan-out ms/task"], rows))


if __name__ == "__main__":
    main()

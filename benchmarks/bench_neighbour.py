"""A busy neighbour: how much a process on the same cores slows scoring, per OpenMP wait policy.

Scoring (``HETMM.predict`` of decoded images: backbone + ATMM at 60 sheets, random weights and
bank) runs in a fresh child process with ``--threads`` torch threads, alone and next to a
neighbour that keeps one core busy (a pure-Python spin loop in another process), under
``OMP_WAIT_POLICY=PASSIVE`` (what hetmm_ray sets before torch loads) and ``ACTIVE`` (spinning
waits, the OpenMP default of some runtimes), with ``score_workers`` 0 (the default: one
single-threaded worker per thread, no parallel ops to wait in) and 1 (multi-threaded ops).
Each cell is the median of ``--runs`` timed calls;
the slow-down is "with neighbour" / "alone" in the same policy. On a 2-core box a neighbour
holding one core can at best halve the speed (2x): graceful is close to that, the collapse the
issue measured was 10x.

    python benchmarks/bench_neighbour.py
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measure(backbone: str, runs: int, threads: int, workers: int) -> float:
    """ms per image of predict on 16 decoded 256x256 images, in this process."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig
    from hetmm_ray.core.templates import TemplateSet
    from hetmm_ray.detector import HETMM

    torch.set_num_threads(threads)
    config = DetectorConfig(
        backbone=BackboneConfig(name=backbone, weights="random"),
        templates=TemplateConfig(kind="all"),
        score_workers=workers,
    )
    det = HETMM(config)
    g = torch.Generator().manual_seed(0)
    bank = {k: F.normalize(torch.randn(60, *s, generator=g), dim=1) for k, s in det.backbone.feature_shapes().items()}
    digests = tuple(map(str, range(60)))
    det.scorer.install(
        TemplateSet(bank=bank, config=config, weights_id="random", image_digests=digests), 0, config=det.config
    )
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (256, 256, 3), dtype=np.uint8) for _ in range(16)]
    det.predict(images[:8])  # warm-up (and the backbone's conversion)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        det.predict(images)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times) / len(images)


def _spin(stop) -> None:
    while not stop.is_set():
        for _ in range(100_000):
            pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backbone", default="mobilenet_v2")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--workers", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        print(json.dumps(measure(args.backbone, args.runs, args.threads, args.workers)))
        return
    sys.path.insert(0, str(HERE))
    from common import table

    rows = []
    setups = [("PASSIVE", 0), ("PASSIVE", 1), ("ACTIVE", 1)]  # score_workers 0: one single-threaded worker per thread
    for policy, workers in setups:
        env = {**os.environ, "OMP_WAIT_POLICY": policy}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))
        cells = {}
        for neighbour in (False, True):
            stop = mp.Event()
            spinner = mp.Process(target=_spin, args=(stop,), daemon=True) if neighbour else None
            if spinner:
                spinner.start()
            try:
                cmd = [sys.executable, __file__, "--_child", "--backbone", args.backbone]
                cmd += ["--runs", str(args.runs), "--threads", str(args.threads), "--workers", str(workers)]
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                cells[neighbour] = float(done.stdout.strip().splitlines()[-1])
            finally:
                if spinner:
                    stop.set()
                    spinner.join()
        how = f"{args.threads} single-threaded workers" if workers == 0 else f"{args.threads}-thread ops"
        rows.append([policy, how, f"{cells[False]:.1f}", f"{cells[True]:.1f}", f"{cells[True] / cells[False]:.2f}x"])
    print(
        f"{args.backbone}, 60 sheets, {args.threads} torch threads, {os.cpu_count()} cores; predict of 16 decoded "
        f"256x256 images; median of {args.runs} calls; neighbour: one busy process"
    )
    print(table(["OMP_WAIT_POLICY", "score_workers", "alone ms/img", "with neighbour ms/img", "slow-down"], rows))


if __name__ == "__main__":
    main()

"""Drift alarms on a synthetic line (issue 23, item 4): a stable line, then a camera change.

A synthetic product is fitted on ``--templates`` good images; fresh good parts are then scored in
process (``HETMM.predict``, batches of 32) and fed, in order, to the service's drift monitor
(``record/monitor.py`` with ``ServiceConfig``'s default ``drift_*`` settings), evaluated every
``--every`` parts (the service evaluates at most once a second):

1. **stable**: ``--stable`` fresh good parts (20,000 for the acceptance): the alarm's own false-alarm
   rate is the share of evaluations of each window whose state is not ``ok`` (and the first one);
2. **camera change**: ``--changed`` fresh good parts at brightness x0.85 and rotated by 1 degree:
   after how many parts each window's state turns ``drift`` (the windows start with the stable
   parts in them, as on a real line).

    python benchmarks/drift_check.py                    # acceptance size (long: 20,000+ images)
    python benchmarks/drift_check.py --tiny             # a few hundred images: shows it works

Fresh parts are ``good(i)`` for ``i`` from 10,000 on: the same generator and pose/gain/noise draws
as the templates' ``i < --templates``, so they are exchangeable with them. With ``--tiny``'s 30
templates the far rule's 1 % threshold comes from its parametric tail (no rank exists below 299
scores) and its true rate varies from product to product (seed 21 at 64 px: 4.8 % of 600 fresh
parts; seeds 22-24: 0-0.6 %; seed 21 with 100-400 templates: 0.6-0.75 %), so a tiny run's stable
flagged share is not the acceptance's.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table

from hetmm_ray.config import BackboneConfig, DetectorConfig, ServiceConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detector import HETMM
from hetmm_ray.record.monitor import DriftMonitor, DriftSettings

BATCH = 32


def camera_change(image: np.ndarray) -> np.ndarray:
    """Brightness -15 % and a 1-degree rotation (bilinear, the corners filled from the edge colour)."""
    darker = (image.astype(np.float32) * 0.85).round().clip(0, 255).astype(np.uint8)
    fill = tuple(int(v) for v in darker[0, 0])
    return np.array(Image.fromarray(darker).rotate(1.0, resample=Image.BILINEAR, fillcolor=fill))


def stream(det: HETMM, make: Callable[[], np.ndarray], count: int, start_t: float) -> list[dict]:
    """Score ``count`` images from ``make()`` in batches of BATCH (made batch by batch: 20,000 images
    held at once would be a gigabyte) into monitor rows, one part a second from ``start_t``."""
    rows = []
    for i in range(0, count, BATCH):
        pred = det.predict([make() for _ in range(min(BATCH, count - i))])
        op = pred.operating_point
        for j, s in enumerate(pred.scores):
            rows.append(
                {
                    "time": start_t + i + j,  # one part a second: the time window holds the last 3600
                    "version": 1,
                    "score": float(s),
                    "threshold": float(pred.threshold),
                    "is_anomaly": bool(pred.is_anomaly[j]),
                    "expected_rate": None if op is None else op.false_alarm_rate,
                }
            )
        if (i // BATCH) % 64 == 63:  # a line every 2,048 parts: the acceptance run takes a while
            print(f"  scored {i + len(pred.scores)} / {count}", file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--templates", type=int, default=200)
    parser.add_argument("--stable", type=int, default=20_000)
    parser.add_argument("--changed", type=int, default=2_000)
    parser.add_argument("--every", type=int, default=50, help="parts between evaluations")
    args = parser.parse_args()
    if args.tiny:
        args.size, args.templates, args.stable, args.changed, args.every = 64, 30, 300, 300, 25

    product = SyntheticProduct(seed=21, size=args.size)
    config = DetectorConfig(
        backbone=BackboneConfig(image_size=args.size),  # the default backbone, packaged ImageNet weights
        templates=TemplateConfig(kind="all"),
        threshold=ThresholdConfig(max_images=args.templates),
    )
    t0 = time.perf_counter()
    det = HETMM(config).fit([product.good(i) for i in range(args.templates)])
    print(f"fitted on {args.templates} good images in {time.perf_counter() - t0:.0f} s", flush=True)
    cal = det.templates.calibration if det.templates is not None else None
    service = ServiceConfig()
    settings = DriftSettings.of(service)
    if args.tiny:  # windows the tiny run can fill
        settings = DriftSettings(**{**settings.__dict__, "windows": (100, 200), "min_parts": 50})
    monitor = DriftMonitor(settings, lambda p, v: cal, clock=lambda: now)
    names = settings.names()

    fresh = iter(range(10_000, 10**9))
    stable = stream(det, lambda: product.good(next(fresh)), args.stable, 0.0)
    not_ok = dict.fromkeys(names, 0)
    first = dict.fromkeys(names, None)
    evaluations = 0
    now = 0.0
    for i in range(0, len(stable), args.every):
        chunk = stable[i : i + args.every]
        now = chunk[-1]["time"]
        monitor.observe("line", chunk)
        monitor.evaluate()
        evaluations += 1
        for name, s in monitor.snapshot()["line"]["windows"].items():
            if s.state != "ok":
                not_ok[name] += 1
                first[name] = first[name] or (i + len(chunk), s.state)
    flagged = sum(r["is_anomaly"] for r in stable) / len(stable)
    print(f"stable: {len(stable)} parts, flagged {100 * flagged:.2f} % (expected {stable[0]['expected_rate']:.4f})")

    changed = stream(det, lambda: camera_change(product.good(next(fresh))), args.changed, now + 1)
    raised = dict.fromkeys(names, None)
    for i in range(0, len(changed), args.every):
        chunk = changed[i : i + args.every]
        now = chunk[-1]["time"]
        monitor.observe("line", chunk)
        monitor.evaluate()
        for name, s in monitor.snapshot()["line"]["windows"].items():
            if s.state == "drift" and raised[name] is None:
                raised[name] = i + len(chunk)
    last = monitor.snapshot()["line"]["windows"]
    flagged = sum(r["is_anomaly"] for r in changed) / len(changed)
    rows = [
        [
            name,
            f"{not_ok[name]} / {evaluations}",
            "-" if first[name] is None else f"part {first[name][0]} ({first[name][1]})",
            "not raised" if raised[name] is None else f"after {raised[name]} parts",
            last[name].state,
            f"{last[name].shift:.3f}",
        ]
        for name in names
    ]
    print(f"camera change: {len(changed)} parts, flagged {100 * flagged:.2f} %")
    print(
        table(
            ["window", "stable: evaluations not ok", "stable: first alarm", "change: drift raised", "end", "KS"], rows
        )
    )


if __name__ == "__main__":
    main()

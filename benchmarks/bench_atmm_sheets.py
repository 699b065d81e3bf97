"""ATMM time against the number of sheets per pixel (issue 3: K=60 must be >= 3x faster than K=209).

One batch of 8 bottle test images (mobilenet_v2 taps features.3/6/13, windows
9/7/5) is scored against K templates per pixel for K = 10..60 and 209. Other
jobs share the CPU, so the K values are measured *interleaved*: each round
times every K once (in a shuffled order), and the table reports the median
over rounds, so a noisy spell hits all K alike instead of one of them.

    python benchmarks/bench_atmm_sheets.py [--rounds 9] [--batch 8] [--random] [--profile]

Real bottle features (pts_o sheets from the 209 training images) when ../shared
is present, else (or with ``--random``) random unit features of the same shapes;
the time does not depend on the values. Real features are cached under /tmp.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BOTTLE, MOBILENET_WEIGHTS, describe, table

from hetmm_ray.core.atmm import anomaly_maps, atm_pair, pixel_major

WINDOWS = (9, 7, 5)
SHAPES = {"features.3": (24, 64, 64), "features.6": (32, 32, 32), "features.13": (96, 16, 16)}
SHEETS = (10, 20, 30, 40, 50, 60, 209)
CACHE = Path("/tmp/hetmm_bench_atmm_sheets.pt")


def random_features(batch: int, sheets: tuple[int, ...]) -> tuple[dict, dict[int, dict]]:
    g = torch.Generator().manual_seed(0)
    q = {n: F.normalize(torch.randn(batch, *s, generator=g), dim=1) for n, s in SHAPES.items()}
    bank = {n: F.normalize(torch.randn(max(sheets), *s, generator=g), dim=1) for n, s in SHAPES.items()}
    return q, {k: {n: v[:k] for n, v in bank.items()} for k in sheets}


def bottle_features(batch: int, sheets: tuple[int, ...]) -> tuple[dict, dict[int, dict]]:
    """Query: the first ``batch`` test images; templates: pts_o sheets (all 209 for K >= 209)."""
    key = (batch, sheets)
    if CACHE.is_file():
        cached = torch.load(CACHE)
        if cached["key"] == key:
            return cached["query"], cached["templates"]
    from hetmm_ray.config import BackboneConfig, DetectorConfig
    from hetmm_ray.core.pts import select
    from hetmm_ray.data.mvtec import MVTecCategory
    from hetmm_ray.detector import HETMM
    from hetmm_ray.evaluation import load_images

    cat = MVTecCategory(BOTTLE)
    det = HETMM(DetectorConfig(backbone=BackboneConfig(name="mobilenet_v2", weights=str(MOBILENET_WEIGHTS))))
    bank, _ = det.extract(load_images(cat.train_paths(), 256))
    query, _ = det.extract(load_images([s.path for s in cat.test_samples()[:batch]], 256))
    templates = {k: {n: select("pts_o", b, k, 0).templates.float() for n, b in bank.items()} for k in sheets}
    torch.save({"key": key, "query": query, "templates": templates}, CACHE)
    return query, templates


def profile_layers(query: dict, pms: dict[int, dict], rounds: int) -> None:
    """Per-layer median ms/img, interleaved over K like the main table."""
    rows = []
    times: dict[tuple[int, str], list[float]] = {}
    b = next(iter(query.values())).shape[0]
    for _ in range(rounds):
        for k in random.sample(list(pms), len(pms)):
            for j, name in enumerate(query):
                t0 = time.perf_counter()
                atm_pair(query[name], pms[k][name], WINDOWS[j], WINDOWS[j])
                times.setdefault((k, name), []).append((time.perf_counter() - t0) / b)
    for k in pms:
        rows.append([k] + [1000 * statistics.median(times[(k, n)]) for n in query])
    print(table(["sheets"] + [f"{n} ms/img" for n in query], rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--sheets", type=int, nargs="+", default=list(SHEETS))
    ap.add_argument("--random", action="store_true", help="random unit features even when ../shared exists")
    ap.add_argument("--profile", action="store_true", help="also time each layer separately")
    args = ap.parse_args()
    sheets = tuple(args.sheets)
    real = BOTTLE.is_dir() and MOBILENET_WEIGHTS.is_file() and not args.random
    query, templates = bottle_features(args.batch, sheets) if real else random_features(args.batch, sheets)
    source = "real bottle features (pts_o sheets)" if real else "random unit features"
    pms = {k: {n: pixel_major(t) for n, t in templates[k].items()} for k in sheets}

    def score(k: int) -> torch.Tensor:
        return anomaly_maps(query, pms[k], WINDOWS, WINDOWS, (0.5,) * 3, (1.0,) * 3, 256)

    for k in sheets:  # warm-up: allocator, MKL and thread pool
        score(k)
    times: dict[int, list[float]] = {k: [] for k in sheets}
    for _ in range(args.rounds):
        for k in random.sample(sheets, len(sheets)):
            t0 = time.perf_counter()
            score(k)
            times[k].append((time.perf_counter() - t0) / args.batch)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"device: {describe(torch.device('cpu'))}; inputs: {source}; batch {args.batch};")
    print(f"median of {args.rounds} interleaved rounds")
    rows = [[k, 1000 * med[k], 1000 * min(times[k]), med[max(sheets)] / med[k]] for k in sheets]
    print(table(["sheets", "ms/img (median)", "ms/img (min)", f"speed-up vs {max(sheets)}"], rows))
    if 60 in med and 209 in med:
        print(f"ratio t(209) / t(60) = {med[209] / med[60]:.2f} (bar: >= 3)")
    if args.profile:
        profile_layers(query, pms, args.rounds)


if __name__ == "__main__":
    main()

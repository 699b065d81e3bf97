"""Where PTS time goes per pixel, and what one pixel chunk costs in memory (input to cluster/README.md's estimate).

Per layer of the 209-image wide_resnet-shaped bank (the bench_pts.py features),
on default-sized chunks (two (P, N, N) float64 matrices in 256 MiB):

- steady state, as inside one pts_indices call: the chunk's cosine
  similarities (one float64 batched matmul), the OPTICS graph (N sequential
  steps of (P, N) tensor operations), the Xi labels (per-pixel Python port),
  then cluster medoids and the K hard-normal steps;
- one pts_indices call on a single chunk, as a Ray task runs it: its 256 MiB
  workspace is fresh memory, whose page faults are paid once per task;
- that call's peak resident memory above the process's (sampled every 2 ms).

    python benchmarks/bench_pts_split.py [--sheets 60] [--threads 1] [--chunks 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pts import extract_features
from common import table

from hetmm_ray.core.optics import cosine_distances, optics_graph, xi_labels
from hetmm_ray.core.pts import _chunk_size, _cluster_medoids, _complete, _pixel_vectors, _Workspace, pts_indices

STAGES = ("similarities", "optics graph", "xi labels", "medoids + hard normals")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_extra_mib(fn) -> tuple[float, float]:
    """(seconds, peak RSS above the start) of ``fn()``."""
    base, peak, done = rss_mib(), [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib())
            time.sleep(0.002)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    done.set()
    t.join()
    return dt, max(peak[0], rss_mib()) - base


def split(bank: torch.Tensor, k: int, chunks: int) -> tuple[int, int, list[float]]:
    """(chunk pixels, timed pixels, seconds per stage) over ``chunks`` chunks after a warm-up chunk."""
    n, c, h, w = bank.shape
    p = _chunk_size(n, c, h * w, None)
    ws = _Workspace(p, n, c, bank.device)
    m = max(2, n // k)
    spent, timed = [0.0] * len(STAGES), 0
    for i, p0 in enumerate(range(0, min(h * w, (chunks + 1) * p), p)):
        p1 = min(h * w, p0 + p)
        t = [time.perf_counter()]
        sim = ws.similarities(_pixel_vectors(bank, p0, p1))
        t.append(time.perf_counter())
        graph = optics_graph(cosine_distances(sim, out=ws.work[: p1 - p0]), m, overwrite=True)
        t.append(time.perf_counter())
        labels = xi_labels(graph, m)
        t.append(time.perf_counter())
        first, count = _cluster_medoids(sim, labels, k, ws.work[: p1 - p0])
        _complete(sim, first, count, k)
        t.append(time.perf_counter())
        if i == 0 and h * w > p:  # the warm-up chunk faults the workspace in
            continue
        timed += p1 - p0
        spent = [s + b - a for s, a, b in zip(spent, t, t[1:], strict=False)]
    return p, timed, spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sheets", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a Ray task with one CPU has one)")
    ap.add_argument("--chunks", type=int, default=2, help="chunks timed per layer after the warm-up one")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    feats, what = extract_features("synthetic", "wide_resnet50_2", 209)
    print(f"features: {what}; fp16 bank; K = {args.sheets}; {args.threads} torch thread(s)")
    print(f"load average at start: {os.getloadavg()[0]:.2f} (other processes compete for the same cores)\n")
    rows, weighted, fresh_rows = [], [0.0] * len(STAGES), []
    total_px = sum(v.shape[2] * v.shape[3] for v in feats.values())
    for layer, bank32 in feats.items():
        bank = bank32.half()  # the stored bank dtype
        n, c, h, w = bank.shape
        p, timed, spent = split(bank, args.sheets, args.chunks)
        per_px = [1e3 * s / timed for s in spent]
        weighted = [a + b * h * w / total_px for a, b in zip(weighted, per_px, strict=True)]
        rows.append([layer, f"{n}x{c}x{h}x{w}", p, *(f"{x:.2f}" for x in per_px), f"{sum(per_px):.2f}"])
        one = bank.reshape(n, c, -1)[:, :, :p].contiguous().view(n, c, p, 1)
        seconds, extra = peak_extra_mib(lambda one=one: pts_indices(one, args.sheets))
        ws_mib = 8 * p * (2 * n * n + n * c) / 2**20
        fresh_rows.append([layer, p, f"{1e3 * seconds / p:.2f}", f"{ws_mib:.0f}", f"{extra:.0f}"])
    rows.append(["**per pixel, weighted**", "", "", *(f"{x:.2f}" for x in weighted), f"{sum(weighted):.2f}"])
    print(table(["layer", "bank", "chunk px", *(f"{s} ms/px" for s in STAGES), "total ms/px"], rows))
    print()
    print(table(["layer", "chunk px", "one-chunk call ms/px", "workspace MiB", "peak extra MiB"], fresh_rows))


if __name__ == "__main__":
    main()

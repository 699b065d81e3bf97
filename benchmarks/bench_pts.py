"""PTS speed (docs/algorithm.md §4): one process against per-pixel scikit-learn, fanned out as Ray tasks,
and where the time and memory of a pixel chunk go.

PTS runs one OPTICS clustering per pixel: 5,376 of them for WRN-101-shaped features at 256x256.
hetmm_ray runs them in lockstep over pixel chunks (:mod:`hetmm_ray.core.optics`). Every command works
on the 60-sheet tiny set of a 209-image bank.

``local`` (the default command): the baseline is what the reference implementation does,
scikit-learn OPTICS per pixel (here with the faster precomputed-distance metric) followed by the
selection in numpy. The baseline is timed on a sample of pixels in the same run and extrapolated to
every pixel (stated as such); the sampled pixels' selections are also compared with hetmm_ray's.
Features: ``synthetic`` (default) = a randomly initialised (seeded) backbone on
:class:`hetmm_ray.data.synthetic.SyntheticProduct` images (random Gaussian vectors would be nearly
equidistant and make OPTICS degenerate; CNN features of similar images are not).
``wide_resnet50_2`` has exactly the layer shapes of ``wide_resnet101_2`` at half the extraction time
(PTS only sees the shapes and the values); ``--backbone wide_resnet101_2`` uses the real thing.
``bottle`` = ImageNet mobilenet_v2 features of the real MVTec bottle training images (needs
../shared). Features are cached under the system temp directory.

``ray``: PTS fanned out as Ray tasks: wall time with 1, 2 and 4 workers, and the fan-out cost per
task. The same wide_resnet-shaped bank (cached features), K = 60. For each worker count a fresh local
Ray with that many CPUs runs every layer's pixels as chunks of ``--chunk`` pixels, one CPU per task.
The single-process :func:`pts_indices` (all cores, torch threads) is measured in the same run as the
baseline; results are checked to be identical.

``split``: where PTS time goes per pixel, and what one pixel chunk costs in memory (input to
cluster/README.md's estimate). Per layer of the same bank on default-sized chunks (two (P, N, N)
float64 matrices in 256 MiB): steady state, as inside one pts_indices call (the chunk's cosine
similarities, one float64 batched matmul; the OPTICS graph, N sequential steps of (P, N) tensor
operations; the Xi labels, per-pixel Python port; then cluster medoids and the K hard-normal steps);
one pts_indices call on a single chunk, as a Ray task runs it (its 256 MiB workspace is fresh memory,
whose page faults are paid once per task); that call's peak resident memory above the process's
(sampled every 2 ms).

    python benchmarks/bench_pts.py [local] [--features synthetic|bottle] [--backbone wide_resnet50_2]
                                   [--images 209] [--sheets 60] [--runs 1] [--sklearn-pixels 30]
    python benchmarks/bench_pts.py ray [--workers 1 2 4] [--chunk 256] [--sheets 60]
    python benchmarks/bench_pts.py split [--sheets 60] [--threads 1] [--chunks 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BOTTLE, MOBILENET_WEIGHTS, describe, table, with_default_command

from hetmm_ray.core.optics import cosine_distances, optics_graph, xi_labels
from hetmm_ray.core.pts import (
    Workspace,
    chunk_size,
    cluster_medoids,
    complete_selection,
    pixel_similarities,
    pixel_vectors,
    pts_indices,
)


# --- local: one process against per-pixel scikit-learn ---------------------------------------------------
def extract_features(source: str, backbone: str, n_images: int) -> tuple[dict[str, torch.Tensor], str]:
    from hetmm_ray.config import BackboneConfig, DetectorConfig
    from hetmm_ray.detection.detector import HETMM

    if source == "bottle":
        if not (BOTTLE.is_dir() and MOBILENET_WEIGHTS.is_file()):
            raise SystemExit("--features bottle needs ../shared (MVTec bottle and the mobilenet_v2 weights)")
        from hetmm_ray.data.mvtec import MVTecCategory
        from hetmm_ray.workflows.evaluation import load_images

        backbone = "mobilenet_v2"
        paths = MVTecCategory(BOTTLE).train_paths()[:n_images]
        images = load_images(paths, 256)
        cfg = BackboneConfig(name=backbone, weights=str(MOBILENET_WEIGHTS))
        what = f"real MVTec bottle train images ({len(images)}), ImageNet {backbone}"
    else:
        from hetmm_ray.data.synthetic import SyntheticProduct

        product = SyntheticProduct(seed=0)
        images = [product.good(i) for i in range(n_images)]
        cfg = BackboneConfig(name=backbone, weights="random")
        what = f"synthetic product ({n_images} good images), RANDOMLY initialised {backbone} (seed 0)"
    cache = Path(tempfile.gettempdir()) / f"hetmm_bench_pts_{source}_{backbone}_{n_images}.pt"
    if cache.is_file():
        return torch.load(cache, weights_only=True), what + " [cached]"
    det = HETMM(DetectorConfig(backbone=cfg, device="cpu"))
    t0 = time.perf_counter()
    with torch.inference_mode():
        feats, _ = det.extract(images)
    feats = {k: v.contiguous() for k, v in feats.items()}
    print(f"extracted features in {time.perf_counter() - t0:.0f} s, cached at {cache}", flush=True)
    torch.save(feats, cache)
    return feats, what


def sklearn_pixel(bank: torch.Tensor, pixel: int, k: int) -> tuple[list[int], float]:
    """Per-pixel baseline: scikit-learn OPTICS on precomputed cosine distances, selection in numpy."""
    from sklearn.cluster import OPTICS

    n = bank.shape[0]
    t0 = time.perf_counter()
    # The same float64 matrix hetmm_ray builds, so the selections are comparable bit for bit.
    sim = pixel_similarities(bank, pixel, pixel + 1)[0].numpy()
    dist = np.clip(1.0 - sim, 0.0, None)
    labels = OPTICS(metric="precomputed", min_samples=max(2, n // k)).fit(dist).labels_
    clusters = sorted((np.flatnonzero(labels == lab) for lab in np.unique(labels[labels >= 0])), key=lambda m: m[0])
    chosen: list[int] = []
    for members in clusters or [np.arange(n)]:
        if len(chosen) == k:
            break
        block = sim[np.ix_(members, members)]
        np.fill_diagonal(block, 0.0)
        totals = np.zeros(len(members))
        for j in range(len(members)):  # summed in member order, as hetmm_ray does
            totals += block[:, j]
        chosen.append(int(members[np.argmax(totals)]))
    sums = np.zeros(n)
    for c in chosen:
        sums += sim[c]
    taken = np.zeros(n, dtype=bool)
    taken[chosen] = True
    while len(chosen) < k:
        q = int(np.argmin(np.where(taken, np.inf, sums)))
        chosen.append(q)
        taken[q] = True
        sums += sim[q]
    return chosen, time.perf_counter() - t0


def local(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    feats, what = extract_features(args.features, args.backbone, args.images)
    k = args.sheets
    total_px = sum(v.shape[2] * v.shape[3] for v in feats.values())
    print(f"features: {what}")
    print(f"device: {describe(device)}; K = {k}; {total_px} pixels; PTS runs per layer: {args.runs}")
    print(f"load average at start: {os.getloadavg()[0]:.2f} (other processes compete for the same cores)\n")

    rows = []
    pts_total = skl_total = cpu_total = 0.0
    agree = sampled = 0
    rng = np.random.default_rng(0)
    for layer, bank in feats.items():
        n, c, h, w = bank.shape
        bank_dev = bank.to(device)
        times, cpu_times, idx = [], [], None
        for _ in range(args.runs):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0, c0 = time.perf_counter(), time.process_time()
            idx = pts_indices(bank_dev, k)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
        t_pts = statistics.median(times)
        cpu_total += statistics.median(cpu_times)
        assert idx is not None
        flat = idx.reshape(idx.shape[0], -1).cpu()
        # The sklearn sample is split over layers by pixel count (at least one each).
        n_sample = max(1, round(args.sklearn_pixels * h * w / total_px))
        pixels = rng.choice(h * w, size=min(n_sample, h * w), replace=False)
        skl_times = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for p in pixels:
                chosen, dt = sklearn_pixel(bank, int(p), k)
                skl_times.append(dt)
                agree += chosen == flat[:, p].tolist()
        sampled += len(pixels)
        t_skl = statistics.mean(skl_times) * h * w
        pts_total += t_pts
        skl_total += t_skl
        rows.append(
            [layer, f"{n}x{c}x{h}x{w}", h * w, f"{t_pts:.2f}", f"{statistics.median(cpu_times):.1f}",
             f"{t_pts / (h * w) * 1e3:.2f}",
             f"{statistics.mean(skl_times) * 1e3:.1f} ({len(pixels)} px)", f"{t_skl:.0f}", f"{t_skl / t_pts:.0f}x"]
        )  # fmt: skip
    rows.append(["total", "", total_px, f"{pts_total:.2f}", f"{cpu_total:.1f}", f"{pts_total / total_px * 1e3:.2f}", "",
                 f"{skl_total:.0f}",
                 f"{skl_total / pts_total:.0f}x"])  # fmt: skip
    headers = ["layer", "bank", "pixels", "PTS wall s", "PTS CPU s", "ms/px", "sklearn ms/px (sample)",
               "sklearn s (extrap.)", "speed-up"]  # fmt: skip
    print(table(headers, rows))
    print(f"\nsampled pixels where the per-pixel scikit-learn selection equals hetmm_ray's: {agree}/{sampled}")
    print("sklearn column: measured on the sampled pixels only and extrapolated to all pixels of the layer.")
    print("PTS CPU s: process CPU time over all threads (median run), less sensitive to other load than wall time.")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


# --- ray: PTS fanned out as Ray tasks -----------------------------------------------------------------------
def fanout_overhead(tasks: int) -> float:
    """Seconds per task for tasks doing (almost) nothing: scheduling, transfer and result return."""
    from hetmm_ray.distributed import pts_indices_ray

    tiny = torch.nn.functional.normalize(torch.randn(3, 4, 1, tasks), dim=1)
    pts_indices_ray(tiny, 2, chunk_pixels=1)  # warm the workers
    t0 = time.perf_counter()
    pts_indices_ray(tiny, 2, chunk_pixels=1)
    return (time.perf_counter() - t0) / tasks


def ray_fanout(args: argparse.Namespace) -> None:
    import ray

    from hetmm_ray.distributed import pts_indices_ray, shutdown_ray

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


# --- split: a chunk's time by stage and its memory ---------------------------------------------------------
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


def stage_split(bank: torch.Tensor, k: int, chunks: int) -> tuple[int, int, list[float]]:
    """(chunk pixels, timed pixels, seconds per stage) over ``chunks`` chunks after a warm-up chunk."""
    n, c, h, w = bank.shape
    p = chunk_size(n, c, h * w, None)
    ws = Workspace(p, n, c, bank.device)
    m = max(2, n // k)
    spent, timed = [0.0] * len(STAGES), 0
    for i, p0 in enumerate(range(0, min(h * w, (chunks + 1) * p), p)):
        p1 = min(h * w, p0 + p)
        t = [time.perf_counter()]
        sim = ws.similarities(pixel_vectors(bank, p0, p1))
        t.append(time.perf_counter())
        graph = optics_graph(cosine_distances(sim, out=ws.work[: p1 - p0]), m, overwrite=True)
        t.append(time.perf_counter())
        labels = xi_labels(graph, m)
        t.append(time.perf_counter())
        first, count = cluster_medoids(sim, labels, k, ws.work[: p1 - p0])
        complete_selection(sim, first, count, k)
        t.append(time.perf_counter())
        if i == 0 and h * w > p:  # the warm-up chunk faults the workspace in
            continue
        timed += p1 - p0
        spent = [s + b - a for s, a, b in zip(spent, t, t[1:], strict=False)]
    return p, timed, spent


def split(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    feats, what = extract_features("synthetic", "wide_resnet50_2", 209)
    print(f"features: {what}; fp16 bank; K = {args.sheets}; {args.threads} torch thread(s)")
    print(f"load average at start: {os.getloadavg()[0]:.2f} (other processes compete for the same cores)\n")
    rows, weighted, fresh_rows = [], [0.0] * len(STAGES), []
    total_px = sum(v.shape[2] * v.shape[3] for v in feats.values())
    for layer, bank32 in feats.items():
        bank = bank32.half()  # the stored bank dtype
        n, c, h, w = bank.shape
        p, timed, spent = stage_split(bank, args.sheets, args.chunks)
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


COMMANDS = {"local": local, "ray": ray_fanout, "split": split}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("local", help="one process against per-pixel scikit-learn (the default)")
    p.add_argument("--features", choices=("synthetic", "bottle"), default="synthetic")
    p.add_argument("--backbone", default="wide_resnet50_2", help="for --features synthetic")
    p.add_argument("--images", type=int, default=209)
    p.add_argument("--sheets", type=int, default=60)
    p.add_argument("--runs", type=int, default=1, help="PTS runs per layer; the median is reported")
    p.add_argument("--sklearn-pixels", type=int, default=30, help="pixels timed with per-pixel scikit-learn")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p = sub.add_parser("ray", help="PTS fanned out as Ray tasks, and the fan-out cost per task")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--sheets", type=int, default=60)
    p.add_argument("--images", type=int, default=209)
    p = sub.add_parser("split", help="a pixel chunk's time by stage, and its memory")
    p.add_argument("--sheets", type=int, default=60)
    p.add_argument("--threads", type=int, default=1, help="torch threads (a Ray task with one CPU has one)")
    p.add_argument("--chunks", type=int, default=2, help="chunks timed per layer after the warm-up one")
    args = ap.parse_args(with_default_command(sys.argv[1:], list(COMMANDS), "local"))
    COMMANDS[args.command](args)


if __name__ == "__main__":
    main()

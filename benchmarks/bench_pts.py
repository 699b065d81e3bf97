"""PTS speed: the 60-sheet tiny set of a 209-image product, against per-pixel scikit-learn.

PTS (docs/algorithm.md §4) runs one OPTICS clustering per pixel: 5,376 of them for
WRN-101-shaped features at 256x256. hetmm_ray runs them in lockstep over pixel
chunks (:mod:`hetmm_ray.core.optics`); the baseline is what the reference
implementation does, scikit-learn OPTICS per pixel (here with the faster
precomputed-distance metric) followed by the selection in numpy. The baseline
is timed on a sample of pixels in the same run and extrapolated to every pixel
(stated as such); the sampled pixels' selections are also compared with
hetmm_ray's.

    python benchmarks/bench_pts.py [--features synthetic|bottle] [--backbone wide_resnet50_2]
                                   [--images 209] [--sheets 60] [--runs 1] [--sklearn-pixels 30]

Features: ``synthetic`` (default) = a randomly initialised (seeded) backbone on
:class:`hetmm_ray.data.synthetic.SyntheticProduct` images. Random Gaussian
vectors would be nearly equidistant and make OPTICS degenerate; CNN features of
similar images are not. ``wide_resnet50_2`` has exactly the layer shapes of
``wide_resnet101_2`` at half the extraction time (PTS only sees the shapes and
the values); ``--backbone wide_resnet101_2`` uses the real thing. ``bottle`` =
ImageNet mobilenet_v2 features of the real MVTec bottle training images (needs
../shared). Features are cached under the system temp directory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BOTTLE, MOBILENET_WEIGHTS, describe, table

from hetmm_ray.core.pts import pixel_similarities, pts_indices


def extract_features(source: str, backbone: str, n_images: int) -> tuple[dict[str, torch.Tensor], str]:
    from hetmm_ray.config import BackboneConfig, DetectorConfig
    from hetmm_ray.detector import HETMM

    if source == "bottle":
        if not (BOTTLE.is_dir() and MOBILENET_WEIGHTS.is_file()):
            raise SystemExit("--features bottle needs ../shared (MVTec bottle and the mobilenet_v2 weights)")
        from hetmm_ray.data.mvtec import MVTecCategory
        from hetmm_ray.evaluation import load_images

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--features", choices=("synthetic", "bottle"), default="synthetic")
    ap.add_argument("--backbone", default="wide_resnet50_2", help="for --features synthetic")
    ap.add_argument("--images", type=int, default=209)
    ap.add_argument("--sheets", type=int, default=60)
    ap.add_argument("--runs", type=int, default=1, help="PTS runs per layer; the median is reported")
    ap.add_argument("--sklearn-pixels", type=int, default=30, help="pixels timed with per-pixel scikit-learn")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()

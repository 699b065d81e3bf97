"""Peak memory of ``hetmm evaluate`` and ``hetmm predict`` against the number of test frames.

Writes synthetic line frames (``hetmm_ray/data/surface.py``, ``--size`` px square) in the MVTec layout
with ``--train`` good training frames and, per entry of ``--tests``, that many test frames (half good,
half defective, with masks), then runs, in a fresh process each, under ``/usr/bin/time -f %M``:

- ``hetmm evaluate --data LAYOUT --set geometry.tiles=auto`` (frames at their own resolution, maps
  stitched at the frame's: what a line measures);
- ``evaluate-report``: the same with ``--report DIR`` (the HTML report's gallery thumbnails and
  figures: its peak beside ``evaluate``'s is what the report costs);
- ``hetmm predict`` of the layout's test frames against a product fitted once (``hetmm fit``), heat-maps
  written to a temporary folder.

Each row: the tree whose ``hetmm`` ran (``--tree``, repeatable: compare code versions on the same
frames; default this checkout), the command, the test frames, and the peak RSS (median of ``--runs``).
Memory must not grow with the number of frames: the last column is each row's peak over the same
command's smallest set; ``--plot PNG`` draws the peaks against the frames (``plots.py memory`` of the
rows). The default backbone (efficientnet_lite0, packaged weights), the default
selection (a product of at most 200 training frames is ALL under it). ``--commands predict`` runs one
command only (default both).

    python benchmarks/bench_memory.py                                  # 1024 px, 16 and 48 test frames
    python benchmarks/bench_memory.py --tree /path/to/old/checkout --tree .   # before / after
    python benchmarks/bench_memory.py --size 2048 --tests 16,64 --runs 3

``--metrics DIR [DIR ...]`` instead measures what the bounded pixel metrics cost in accuracy: each
MVTec-layout folder is fit at the defaults and its test set's maps (the default canvas) are reduced
twice, exactly (every pixel kept) and binned (``PixelMetrics(exact_pixels=0)``: the path a set of
more than 30 M map pixels takes); printed: both pixel AUROCs and PROs, their differences and the
binned AUROC's error bound.

    python benchmarks/bench_memory.py --metrics ../shared/data/mvtec_ad/bottle ../shared/data/bsd_pitting
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table
from plots import memory_png

from hetmm_ray.data.surface import write_surface_layout

HERE = Path(__file__).resolve().parents[1]


def peak_rss_mb(argv: list[str], cwd: Path) -> float:
    """Peak RSS of one run of ``argv`` (MB, ``/usr/bin/time -f %M``); the run must succeed."""
    done = subprocess.run(["/usr/bin/time", "-f", "%M", *argv], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return int(done.stderr.strip().splitlines()[-1]) / 1024


def layouts(root: Path, size: int, n_train: int, tests: list[int]) -> dict[int, Path]:
    out = {}
    for n in tests:
        good, per_defect = n // 2, max(1, (n - n // 2) // 2)  # two defect kinds
        out[n] = write_surface_layout(
            root / f"test{n}", height=size, width=size, n_train=n_train, n_test_good=good,
            n_test_per_defect=per_defect,
        )  # fmt: skip
    return out


def metrics_error(folders: list[Path]) -> None:
    """Exact against binned pixel metrics of each folder's test maps (module docstring, ``--metrics``)."""
    from hetmm_ray.config import DetectorConfig
    from hetmm_ray.core.pixel_metrics import PixelMetrics
    from hetmm_ray.data.mvtec import MVTecCategory
    from hetmm_ray.detection.detector_choice import new_detector

    rows = []
    for folder in folders:
        category = MVTecCategory(folder)
        det = new_detector(DetectorConfig(), category.train_paths())
        det.fit(category.train_paths())
        exact, binned = PixelMetrics(exact_pixels=2**62), PixelMetrics(exact_pixels=0)
        samples = category.measurable_samples()
        pixels = 0
        for i in range(0, len(samples), 16):
            part = samples[i : i + 16]
            for s, m in zip(part, det.predict([s.path for s in part]).maps, strict=True):
                mask = category.load_mask(s, m.shape)
                exact.add(m, mask)
                binned.add(m, mask)
                pixels += m.size
        assert exact.exact and not binned.exact
        a, b = 100 * exact.pixel_auroc(), 100 * binned.pixel_auroc()
        p, q = 100 * exact.pro(), 100 * binned.pro()
        rows.append([folder.name, len(samples), pixels, f"{a:.4f}", f"{b:.4f}", f"{b - a:+.5f}",
                     f"{100 * binned.auroc_error_bound():.5f}", f"{p:.4f}", f"{q:.4f}", f"{q - p:+.5f}"])  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    print(table(["data", "images", "map pixels", "pixel AUROC exact", "binned", "diff", "bound",
                 "PRO exact", "binned", "diff"], rows))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=1024, help="frame side, px (default 1024)")
    ap.add_argument("--train", type=int, default=12, help="good training frames (default 12)")
    ap.add_argument("--tests", default="16,48", help="test frame counts, comma-separated (default 16,48)")
    ap.add_argument("--runs", type=int, default=1, help="runs per row; the median is reported (default 1)")
    ap.add_argument("--tree", action="append", type=Path, help="a checkout whose .venv/bin/hetmm runs (repeatable)")
    ap.add_argument("--json", type=Path, help="write the rows here too")
    ap.add_argument("--plot", type=Path, help="draw peak RSS against the test frames here (PNG)")
    ap.add_argument(
        "--commands",
        default="evaluate,predict",
        help="comma-separated, of evaluate, evaluate-report, predict (default evaluate,predict)",
    )
    ap.add_argument("--metrics", type=Path, nargs="+", help="exact against binned pixel metrics of these folders")
    args = ap.parse_args()
    if args.metrics:
        metrics_error(args.metrics)
        return
    tests = sorted(int(t) for t in args.tests.split(","))
    commands = [c.strip() for c in args.commands.split(",")]
    if not commands or not set(commands) <= {"evaluate", "evaluate-report", "predict"}:
        ap.error(f"--commands takes evaluate, evaluate-report and/or predict, not {args.commands!r}")
    trees = [t.resolve() for t in (args.tree or [HERE])]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        root = Path(tmp)
        sets = layouts(root, args.size, args.train, tests)
        for tree in trees:
            hetmm = str(tree / ".venv" / "bin" / "hetmm")
            store = root / f"store-{len(rows)}"
            fit = [hetmm, "fit", str(sets[tests[0]] / "train" / "good"), "--product", "p", "--store", str(store)]
            if "predict" in commands:
                done = subprocess.run([*fit, "--set", "geometry.tiles=auto"], cwd=tree, capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"{' '.join(fit)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
            for command in commands:
                base = None
                for n in tests:
                    if command in ("evaluate", "evaluate-report"):
                        argv = [hetmm, "evaluate", "--data", str(sets[n]), "--set", "geometry.tiles=auto"]
                        argv += ["--report", str(root / "report")] if command == "evaluate-report" else []
                    else:
                        heat = root / "heat"
                        shutil.rmtree(heat, ignore_errors=True)
                        argv = [hetmm, "predict", str(sets[n] / "test"), "--product", "p", "--store", str(store)]
                        argv += ["--out", str(heat)]
                    peak = statistics.median(peak_rss_mb(argv, tree) for _ in range(args.runs))
                    base = base or peak
                    rows.append(
                        {"tree": str(tree), "command": command, "test_frames": n, "peak_rss_mb": round(peak),
                         "vs_smallest": round(peak / base, 2)}
                    )  # fmt: skip
                    print(json.dumps(rows[-1]), flush=True)
    print(
        table(
            ["tree", "command", "test frames", "peak RSS MB", "vs smallest"],
            [[r["tree"], r["command"], r["test_frames"], r["peak_rss_mb"], r["vs_smallest"]] for r in rows],
        )
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.plot:
        print(f"written {memory_png(rows, args.plot)}")


if __name__ == "__main__":
    main()

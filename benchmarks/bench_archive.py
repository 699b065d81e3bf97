"""``hetmm compare --on-ray`` and ``hetmm inspect``: archives on Ray Data.

``compare``: ``hetmm compare --on-ray``'s one pass scoring each decoded batch with both versions,
against a pass per version joined on path (what it did before; what it still does across canvases), in
one run. Two versions of a bottle product (the default backbone, ALL templates of 40 and of 50 other
train images; same canvas), compared over ``test/`` (83 PNGs) on the embedded local Ray. Each way is
timed ``--runs`` times, alternating, after one warm-up of each (Ray's start excluded); the scores of
both ways must be equal (exit status 1 if not). Needs ../shared.

``inspect``: ``hetmm inspect``'s speed and memory (``common.archive_images``: bottle and battery_weld of
../shared re-encoded as JPEG at a side that varies with the index, 1 % corrupt; synthetic gears without
../shared; the product fitted on 30 bottle train images with mobilenet_v2's real weights). Phases:

- **throughput at equal cores**: ``hetmm predict`` (one process) and ``hetmm inspect`` (local Ray) on
  the same local folder of ``--throughput-images`` images and the same stored version, one after the
  other in this run, each in a subprocess pinned to the same ``--cores`` CPUs and with the same torch
  threads (``--cores``): wall seconds from the start of the command to its end, Ray's start excluded for
  inspect (reported apart), images/s and the ratio; and the CPU seconds of every process of each
  (:func:`measure`), so a loaded machine still shows the pipeline's own cost, with inspect's split by
  process (driver, raylet, each Ray worker by the task or actor it runs). ``--inspect-variant OPTIONS``
  runs inspect again with other options after the default run (e.g. ``"--batch-size 64"``), each with
  its ratio to the same predict run.
- **memory**: peak RSS of ``hetmm inspect`` (the driver, the largest other process, and the sum over
  the driver and every Ray process it started) on a tenth of ``--images`` and on all of them, from a
  local folder.

The acceptance runs of ``hetmm inspect`` (every image once from S3 on a 3-node cluster, a worker node
killed, SIGINT and a restart) are ``tests/acceptance/test_inspect_archive.py`` (``make acceptance``).

    python benchmarks/bench_archive.py compare [--runs 3]
    python benchmarks/bench_archive.py inspect                          # both phases (20,000 images: long)
    python benchmarks/bench_archive.py inspect --phases throughput      # hetmm predict vs hetmm inspect, one run
    python benchmarks/bench_archive.py inspect --quick                  # 60 images: both phases work
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ARCHIVE_PRODUCT, BOTTLE, check_output, fit_archive_product, inspect_argv, repo_env, write_images


# --- compare: one pass against a pass per version ---------------------------------------------------------
def compare(args: argparse.Namespace) -> None:
    import torch  # noqa: F401 - before hetmm_ray, as this benchmark has always run: torch's own OpenMP wait policy

    from hetmm_ray.archive import JobOptions, score_rows
    from hetmm_ray.archive.compare_job import collect_sides, paired_sides
    from hetmm_ray.config import DetectorConfig
    from hetmm_ray.detection.detector import HETMM
    from hetmm_ray.distributed.runtime import connect
    from hetmm_ray.store import open_store

    if not BOTTLE.is_dir():
        sys.exit(f"bench_archive.py compare: {BOTTLE} is not there (../shared/data)")
    train = sorted((BOTTLE / "train" / "good").glob("*.png"))
    store_uri = tempfile.mkdtemp(prefix="bench-compare-")
    store = open_store(store_uri)
    base = HETMM(DetectorConfig()).fit([p.read_bytes() for p in train[:40]]).save(store, "bottle")
    candidate = HETMM(DetectorConfig()).fit([p.read_bytes() for p in train[40:90]]).save(store, "bottle")
    source = str(BOTTLE / "test")
    canvas_of = store.record("bottle", base).config  # what read_and_fit fits images to (both versions)
    opts = JobOptions(store=store_uri, progress=False)
    connect(None)

    def two_passes() -> list[Any]:
        return [collect_sides(score_rows(source, "bottle", v, opts))[0] for v in (base, candidate)]

    def one_pass() -> list[Any]:
        return paired_sides(source, "bottle", (base, candidate), canvas_of, opts)

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


# --- inspect: throughput at equal cores, and memory ----------------------------------------------------------
def _pinned(cores: int) -> Any:
    cpus = sorted(os.sched_getaffinity(0))[:cores]
    return lambda: os.sched_setaffinity(0, cpus)


def process_label(pid: int, root: int) -> str:
    """What a process of a command is now, for the CPU breakdown: ``driver`` (the command itself), a
    Ray worker by its title (``ray::IDLE``, or the task or actor it runs: ``ray::MapBatches(...)``),
    else the executable's or script's name (``raylet``, ``gcs_server``, ``agent.py``,
    ``log_monitor.py``...). ``?`` once the process is gone."""
    if pid == root:
        return "driver"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    first = argv[0].decode(errors="replace").strip()
    if first.startswith("ray::"):
        return first.split(" ", 1)[0][:60]
    names = [os.path.basename(a.decode(errors="replace")) for a in argv if a]
    script = next((n for n in names[1:] if n.endswith(".py")), None)
    return script or (names[0] if names else "?")


def process_tree(root: int) -> dict[int, tuple[int, float]]:
    """``{pid: (rss bytes, user + system CPU seconds)}`` of ``root`` and every descendant, from /proc
    (Linux; psutil is not a dependency). A process that ends while it is read is left out."""
    parents: dict[int, list[int]] = {}
    stats: dict[int, tuple[int, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    page = os.sysconf("SC_PAGE_SIZE")
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            rss_pages = int(Path(f"/proc/{d}/statm").read_text().split()[1])
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        ppid, utime, stime = int(fields[1]), int(fields[11]), int(fields[12])
        parents.setdefault(ppid, []).append(int(d))
        stats[int(d)] = (rss_pages * page, (utime + stime) / tick)
    tree: dict[int, tuple[int, float]] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            tree[pid] = stats[pid]
        todo.extend(parents.get(pid, []))
    return tree


def measure(argv: list[str], cores: int, out: Path | None = None) -> dict[str, Any]:
    """Run ``argv`` pinned to ``cores`` CPUs (every process it starts inherits the pinning), sampling its
    process tree every 0.25 s: wall seconds, CPU seconds (user + system, summed over every process
    seen, each at its last sample: a process's last 0.25 s before it exits can be missed), peak RSS
    of the driver, of the largest other process and of the tree's sum. stdout goes to ``out``."""
    sink = open(out, "w") if out else subprocess.DEVNULL
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=repo_env(), stdout=sink, stderr=subprocess.DEVNULL, preexec_fn=_pinned(cores))
    cpu: dict[int, float] = {}
    by_label: Counter[str] = Counter()
    driver = other = tree = 0
    while proc.poll() is None:
        procs = process_tree(proc.pid)
        for pid, (rss, seconds) in procs.items():
            # the CPU since the last sample goes to what the process is now (a Ray worker changes title per task)
            by_label[process_label(pid, proc.pid)] += seconds - cpu.get(pid, 0.0)
            cpu[pid] = seconds
            if pid == proc.pid:
                driver = max(driver, rss)
            else:
                other = max(other, rss)
        tree = max(tree, sum(rss for rss, _ in procs.values()))
        time.sleep(0.25)
    wall = time.perf_counter() - t0
    if out:
        sink.close()  # type: ignore[union-attr]
    return {
        "rc": proc.returncode,
        "wall_s": round(wall, 1),
        "cpu_s": round(sum(cpu.values()), 1),
        "cpu_s_by_process": {k: round(v, 2) for k, v in by_label.most_common()},
        "processes": len(cpu),
        "driver_mib": round(driver / 2**20),
        "largest_other_mib": round(other / 2**20),
        "all_processes_mib": round(tree / 2**20),
    }


def phase_throughput(args: argparse.Namespace, store: str, folder: Path, work: Path) -> dict[str, Any]:
    """``hetmm predict`` and ``hetmm inspect`` on the same folder, the same stored version (the head),
    the same cores (each pinned to the first ``--cores``) and the same torch threads (predict's rule
    is its usable cores; inspect gets one actor with ``--actor-threads`` = cores), one after the
    other in this run. Wall: from the command's start to its end, Ray's start excluded for inspect
    (its own job time; reported apart). CPU: every process of each command (Ray's included)."""
    code = (
        "import sys, time; from hetmm_ray.cli import main; t = time.perf_counter(); "
        "main(sys.argv[1:]); print('WALL', time.perf_counter() - t)"
    )
    argv = [sys.executable, "-c", code, "predict", str(folder), "--product", ARCHIVE_PRODUCT, "--store", store]
    pm = measure(argv, args.cores, work / "predict.out")
    stdout = (work / "predict.out").read_text()
    predict_s = float(stdout.rsplit("WALL", 1)[1])
    scored = sum(1 for line in stdout.splitlines() if line.endswith(".jpg"))
    rate, im, check = inspect_run(args, store, folder, work, "tp-out", [])
    written = check["rows"]
    good = written - check["errors"]
    inspect_s = written / rate
    out = {
        "cores": args.cores,
        "threads": args.cores,
        "images": written,
        "scored": good,
        "predict_scored": scored,
        "predict_s": round(predict_s, 1),
        "predict_images_per_s": round(written / predict_s, 2),
        "inspect_s": round(inspect_s, 1),
        "inspect_images_per_s": round(rate, 2),
        "inspect_ray_start_s": round(im["wall_s"] - inspect_s, 1),
        "ratio": round(rate / (written / predict_s), 3),
        "predict_cpu_s": pm["cpu_s"],
        "inspect_cpu_s": im["cpu_s"],
        "cpu_ms_per_image": {
            "predict": round(1000 * pm["cpu_s"] / max(1, written), 1),
            "inspect": round(1000 * im["cpu_s"] / max(1, written), 1),
        },
        # where inspect's CPU goes: every process of the command by what it is (measure, process_label)
        "inspect_cpu_ms_per_image_by_process": {
            k: round(1000 * v / max(1, written), 2) for k, v in im["cpu_s_by_process"].items()
        },
        "rc": [pm["rc"], im["rc"]],
    }
    for k, extra in enumerate(args.inspect_variant or []):  # the same job with other options, in this run
        v_rate, v_im, v_check = inspect_run(args, store, folder, work, f"tp-out-{k}", extra.split())
        out.setdefault("inspect_variants", {})[extra] = {
            "images_per_s": round(v_rate, 2),
            "ratio": round(v_rate / (written / predict_s), 3),
            "cpu_ms_per_image": round(1000 * v_im["cpu_s"] / max(1, v_check["rows"]), 1),
            "rows": v_check["rows"],
            "rc": v_im["rc"],
        }
    print("throughput:", json.dumps(out), flush=True)
    return out


def inspect_run(
    args: argparse.Namespace, store: str, folder: Path, work: Path, dest: str, extra: list[str]
) -> tuple[float, dict[str, Any], dict[str, Any]]:
    """``hetmm inspect`` of the folder into ``work/dest`` as the throughput phase runs it, with ``extra`` options:
    (its images/s, ``measure``'s figures, ``check_output``'s)."""
    from hetmm_ray.archive import FsSpec

    # one actor with the same threads as predict; its Ray reservation stays 1 CPU (the rest for the tasks)
    actor = ["--concurrency", "1,1", "--actor-threads", str(args.cores), *extra]
    im = measure(inspect_argv(str(folder), str(work / dest), store, *actor), args.cores, work / "inspect.out")
    line = [x for x in (work / "inspect.out").read_text().splitlines() if "images written" in x][-1]
    check = check_output(str(work / dest), FsSpec(), len(list(folder.rglob("*.jpg"))))
    return float(line.split(" images/s")[0].rsplit(", ", 1)[1]), im, check


def phase_memory(args: argparse.Namespace, store: str, folder: Path, work: Path) -> dict[str, Any]:
    files = sorted(str(p) for p in folder.rglob("*.jpg"))
    small = work / "tenth.txt"
    small.write_text("\n".join(files[: len(files) // 10]) + "\n")
    out = {}
    for label, source in ((f"{len(files) // 10}", str(small)), (f"{len(files)}", str(folder))):
        out[label] = measure(inspect_argv(source, str(work / f"mem-{label}"), store), args.cores)
        print(f"memory {label} images:", json.dumps(out[label]), flush=True)
    return out


def inspect(args: argparse.Namespace) -> None:
    if args.quick:
        args.images, args.throughput_images = 60, 30
    work = Path(tempfile.mkdtemp(prefix="bench-inspect-"))
    results: dict[str, Any] = {"args": vars(args)}
    try:
        store = str(work / "store")
        fit_archive_product(store, args.image_size)
        if "throughput" in args.phases:
            tp = work / "tp"
            write_images(tp, args.throughput_images)
            results["throughput"] = phase_throughput(args, store, tp, work)
        if "memory" in args.phases:
            mem = work / "mem"
            write_images(mem, args.images)
            results["memory"] = phase_memory(args, store, mem, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


COMMANDS = {"compare": compare, "inspect": inspect}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("compare", help="hetmm compare --on-ray: one pass against a pass per version")
    p.add_argument("--runs", type=int, default=3)
    p = sub.add_parser("inspect", help="hetmm inspect: throughput at equal cores against hetmm predict, memory")
    p.add_argument("--quick", action="store_true", help="60 images, 30 for throughput: shows the phases work")
    p.add_argument("--images", type=int, default=20_000, help="images of the memory phase (a tenth, then all)")
    # 5,000: the claim is the steady rate; each command's start-up (imports, the model load, Ray's
    # workers: ~18 CPU-seconds for inspect on 2 cores, measured) is a smaller share of it than at 2,000
    p.add_argument("--throughput-images", type=int, default=5_000)
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)), help="CPUs of both phases")
    p.add_argument(
        "--image-size",
        type=int,
        default=256,
        help="the product's canvas (backbone input side); a small one keeps the count runs short",
    )
    p.add_argument(
        "--inspect-variant",
        action="append",
        metavar="OPTIONS",
        help='throughput again with these hetmm inspect options after the default run, e.g. "--batch-size 64" '
        "(repeatable; each reported with its ratio to the same predict run)",
    )
    p.add_argument("--phases", nargs="*", default=["throughput", "memory"], choices=["throughput", "memory"])
    p.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    COMMANDS[args.command](args)


if __name__ == "__main__":
    main()

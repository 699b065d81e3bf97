"""The acceptance runs of ``hetmm inspect`` (issue 24) in one command.

    python benchmarks/bench_inspect.py            # 20,000 images (takes long: run it on an idle machine)
    python benchmarks/bench_inspect.py --quick    # 60 images: shows every phase works

Images: bottle and battery_weld of ../shared (train and test), re-encoded as JPEG at a side that
varies with the index (so each of the ``--images`` files is distinct), 1 % of them corrupt
(truncated or not an image); synthetic gears without ../shared. The product: fitted on 30 bottle
train images with mobilenet_v2's real weights (a synthetic gear product without ../shared).

Phases, each printed as it finishes (and written with ``--json``):

1. **cluster**: the images in a moto S3 bucket (moto's server in a subprocess), ``hetmm inspect``
   from the bucket to Parquet in the bucket on a ``ray.cluster_utils.Cluster`` of ``--nodes`` nodes:
   rows per node, every image once, errors = the corrupt files, 0 lost.
2. **node loss**: the same job into a new DEST; once half the rows are written, a worker node is
   killed (``Cluster.remove_node(allow_graceful=False)``: SIGKILL of its raylet and workers); whether
   the run survived it; then the job started again with the same DEST: complete, no duplicate path.
3. **throughput at equal cores**: ``hetmm predict`` (one process) and ``hetmm inspect`` (local Ray)
   on the same local folder of ``--throughput-images`` images and the same stored version, one
   after the other in this run, each in a subprocess pinned to the same ``--cores`` CPUs and with
   the same torch threads (``--cores``): wall seconds from the start of the command to its end,
   Ray's start excluded for inspect (reported apart), images/s and the ratio; and the CPU seconds
   of every process of each (``measure``), so a loaded machine still shows the pipeline's own cost,
   with inspect's split by process (driver, raylet, each Ray worker by the task or actor it runs).
   ``--inspect-variant OPTIONS`` runs inspect again with other options after the default run
   (e.g. ``"--batch-size 64"``), each with its ratio to the same predict run.
4. **memory**: peak RSS of ``hetmm inspect`` (the driver, the largest other process, and the sum
   over the driver and every Ray process it started) on a tenth of the images and on all of them,
   from a local folder.
5. **SIGINT**: ``hetmm inspect`` interrupted with SIGINT once half its rows are written, then
   started again: complete, no duplicate path.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.common import BOTTLE, MOBILENET_WEIGHTS, SHARED, free_port  # noqa: E402

BATTERY = SHARED / "data" / "battery_weld"
PRODUCT = "bottle"


# --- inputs ----------------------------------------------------------------------------------
def _sources() -> list[Path]:
    found = sorted(BOTTLE.rglob("*.png")) + sorted(BATTERY.rglob("*.png")) if BOTTLE.is_dir() else []
    return [p for p in found if "ground_truth" not in p.parts]


def images(n: int) -> Any:
    """``(name, bytes)`` of ``n`` files, 1 % corrupt (every 100th, at offset 50: half truncated, half text)."""
    sources = _sources()
    gear = None
    if not sources:
        from hetmm_ray.data.synthetic import SyntheticProduct

        gear = SyntheticProduct(seed=0, size=128)
    cache: dict[int, Image.Image] = {}
    for i in range(n):
        if gear is None:
            k = i % len(sources)
            if k not in cache:
                if len(cache) > 64:
                    cache.clear()
                cache[k] = Image.open(sources[k]).convert("RGB")
            side = 160 + 4 * ((i // len(sources)) % 24)
            im = cache[k].resize((side, side), Image.Resampling.BILINEAR)
        else:
            im = Image.fromarray(gear.good(i) if i % 3 else gear.defective(i, "scratch")[0])
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=90)
        data = buf.getvalue()
        if i % 100 == 50:
            data = data[: len(data) // 2] if (i // 100) % 2 else b"not an image\n"
        yield f"{i // 1000:03d}/{i:06d}.jpg", data


def write_folder(folder: Path, n: int) -> list[Path]:
    paths = []
    for name, data in images(n):
        p = folder / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        paths.append(p)
    return paths


def fit_product(store: str, image_size: int = 256) -> None:
    from hetmm_ray.config import BackboneConfig, DetectorConfig
    from hetmm_ray.detector import HETMM
    from hetmm_ray.store import open_store

    if BOTTLE.is_dir() and MOBILENET_WEIGHTS.is_file():
        config = DetectorConfig(
            backbone=BackboneConfig(name="mobilenet_v2", weights=str(MOBILENET_WEIGHTS), image_size=image_size)
        )
        from hetmm_ray.data.decode import decode_image

        train = [decode_image(p) for p in sorted((BOTTLE / "train" / "good").glob("*.png"))[:30]]
    else:
        from hetmm_ray.data.synthetic import SyntheticProduct

        config = DetectorConfig(backbone=BackboneConfig(name="resnet18", weights="random", image_size=64))
        gear = SyntheticProduct(seed=0, size=128)
        train = [gear.good(1000 + i) for i in range(12)]
    HETMM(config).fit(train).save(open_store(store), PRODUCT)


# --- helpers -----------------------------------------------------------------------------------
def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def _pinned(cores: int) -> Any:
    cpus = sorted(os.sched_getaffinity(0))[:cores]
    return lambda: os.sched_setaffinity(0, cpus)


def rows_written(dest: str, spec: Any) -> int:
    import pyarrow.parquet as pq

    from hetmm_ray.archive.listing import part_files

    fs, _ = spec.resolve(dest)
    n = 0
    for p in part_files(dest, spec):
        try:
            n += pq.ParquetFile(fs.open_input_file(p)).metadata.num_rows
        except OSError:
            pass
    return n


def check_output(dest: str, spec: Any, expected: int) -> dict[str, Any]:
    """Every image once? Rows, distinct paths, duplicates, errors."""
    import pyarrow.parquet as pq

    from hetmm_ray.archive.listing import part_files

    fs, _ = spec.resolve(dest)
    paths: Counter[str] = Counter()
    errors = 0
    for p in part_files(dest, spec):
        t = pq.read_table(p, columns=["path", "error"], filesystem=fs)
        paths.update(t.column("path").to_pylist())
        errors += t.num_rows - t.column("error").null_count
    dup = sum(c - 1 for c in paths.values() if c > 1)
    return {
        "rows": sum(paths.values()),
        "distinct": len(paths),
        "duplicates": dup,
        "errors": errors,
        "lost": expected - len(paths),
    }


def _wait(cond: Any, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.5)
    return False


def _inspect_argv(source: str, dest: str, store: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "hetmm_ray.cli",
        "inspect",
        source,
        "--product",
        PRODUCT,
        "--out",
        dest,
        "--store",
        store,
        *extra,
    ]


# --- phases --------------------------------------------------------------------------------------
def phase_cluster(args: argparse.Namespace, store: str, work: Path) -> dict[str, Any]:
    import boto3
    from ray.cluster_utils import Cluster

    from hetmm_ray.archive import FsSpec, JobOptions, inspect_archive
    from hetmm_ray.distributed import shutdown_ray

    os.environ.update(
        {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    )
    port = free_port()
    moto = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {}
    try:
        client = boto3.client("s3", endpoint_url=endpoint)
        assert _wait(lambda: _bucket(client), 60), "moto did not start"
        t0 = time.perf_counter()
        for name, data in images(args.images):
            client.put_object(Bucket="archive", Key=f"in/{name}", Body=data)
        out["upload_s"] = round(time.perf_counter() - t0, 1)
        c = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": args.node_cpus,
                "include_dashboard": False,
                "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4},
            },
        )
        workers = [c.add_node(num_cpus=args.node_cpus) for _ in range(args.nodes - 1)]
        c.wait_for_nodes()
        spec = FsSpec(endpoint)
        opts = JobOptions(
            store=store,
            endpoint_url=endpoint,
            address=c.address,
            block_size=args.block_size,
            concurrency=(args.nodes, args.nodes),
            # the simulated nodes share this machine's cores: their actors' threads together cover them
            # once (the job's rule would give each actor its node's logical CPUs)
            actor_threads=max(1, args.cores // args.nodes),
            progress=not args.quiet,
        )
        report = inspect_archive("s3://archive/in", PRODUCT, "s3://archive/out", opts)
        out["cluster"] = {
            "seconds": round(report.seconds, 1),
            "images_per_s": round(report.written / report.seconds, 2),
            "per_node": report.per_node,
            "errors": report.errors,
            **check_output("s3://archive/out", spec, args.images),
        }
        print("cluster:", json.dumps(out["cluster"]), flush=True)

        # node loss: a worker node SIGKILLed half-way, then the job again with the same DEST
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["report"] = inspect_archive("s3://archive/in", PRODUCT, "s3://archive/out-kill", opts)
            except Exception as exc:  # noqa: BLE001 - the benchmark reports how the run ended
                box["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

        th = threading.Thread(target=run)
        th.start()
        half = _wait(lambda: rows_written("s3://archive/out-kill", spec) >= args.images // 2 or not th.is_alive(), 3600)
        before = rows_written("s3://archive/out-kill", spec)
        c.remove_node(workers[-1], allow_graceful=False)
        th.join()
        first = {
            "killed_at_rows": before,
            "half_reached": half,
            "first_run": "survived" if "report" in box else f"failed ({box.get('error')})",
        }
        c.add_node(num_cpus=args.node_cpus)
        c.wait_for_nodes()
        again = inspect_archive("s3://archive/in", PRODUCT, "s3://archive/out-kill", opts)
        out["node_loss"] = {
            **first,
            "restart_skipped": again.skipped,
            "restart_written": again.written,
            **check_output("s3://archive/out-kill", spec, args.images),
        }
        print("node loss:", json.dumps(out["node_loss"]), flush=True)
        shutdown_ray()
        c.shutdown()
    finally:
        moto.terminate()
        moto.wait()
    return out


def _bucket(client: Any) -> bool:
    try:
        client.create_bucket(Bucket="archive")
        return True
    except Exception:  # noqa: BLE001 - not up yet
        return False


def _label(pid: int, root: int) -> str:
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


def _proc_tree(root: int) -> dict[int, tuple[int, float]]:
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
    proc = subprocess.Popen(argv, env=_env(), stdout=sink, stderr=subprocess.DEVNULL, preexec_fn=_pinned(cores))
    cpu: dict[int, float] = {}
    by_label: Counter[str] = Counter()
    driver = other = tree = 0
    while proc.poll() is None:
        procs = _proc_tree(proc.pid)
        for pid, (rss, seconds) in procs.items():
            # the CPU since the last sample goes to what the process is now (a Ray worker changes title per task)
            by_label[_label(pid, proc.pid)] += seconds - cpu.get(pid, 0.0)
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
    argv = [sys.executable, "-c", code, "predict", str(folder), "--product", PRODUCT, "--store", store]
    pm = measure(argv, args.cores, work / "predict.out")
    stdout = (work / "predict.out").read_text()
    predict_s = float(stdout.rsplit("WALL", 1)[1])
    scored = sum(1 for line in stdout.splitlines() if line.endswith(".jpg"))
    rate, im, check = _inspect_run(args, store, folder, work, "tp-out", [])
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
        # where inspect's CPU goes: every process of the command by what it is (measure, _label)
        "inspect_cpu_ms_per_image_by_process": {
            k: round(1000 * v / max(1, written), 2) for k, v in im["cpu_s_by_process"].items()
        },
        "rc": [pm["rc"], im["rc"]],
    }
    for k, extra in enumerate(args.inspect_variant or []):  # the same job with other options, in this run
        v_rate, v_im, v_check = _inspect_run(args, store, folder, work, f"tp-out-{k}", extra.split())
        out.setdefault("inspect_variants", {})[extra] = {
            "images_per_s": round(v_rate, 2),
            "ratio": round(v_rate / (written / predict_s), 3),
            "cpu_ms_per_image": round(1000 * v_im["cpu_s"] / max(1, v_check["rows"]), 1),
            "rows": v_check["rows"],
            "rc": v_im["rc"],
        }
    print("throughput:", json.dumps(out), flush=True)
    return out


def _inspect_run(
    args: argparse.Namespace, store: str, folder: Path, work: Path, dest: str, extra: list[str]
) -> tuple[float, dict[str, Any], dict[str, Any]]:
    """``hetmm inspect`` of the folder into ``work/dest`` as phase 3 runs it, with ``extra`` options:
    (its images/s, ``measure``'s figures, ``check_output``'s)."""
    from hetmm_ray.archive import FsSpec

    # one actor with the same threads as predict; its Ray reservation stays 1 CPU (the rest for the tasks)
    actor = ["--concurrency", "1,1", "--actor-threads", str(args.cores), *extra]
    im = measure(_inspect_argv(str(folder), str(work / dest), store, *actor), args.cores, work / "inspect.out")
    line = [x for x in (work / "inspect.out").read_text().splitlines() if "images written" in x][-1]
    check = check_output(str(work / dest), FsSpec(), len(list(folder.rglob("*.jpg"))))
    return float(line.split(" images/s")[0].rsplit(", ", 1)[1]), im, check


def peak_rss(argv: list[str], cores: int) -> dict[str, float]:
    return measure(argv, cores)


def phase_memory(args: argparse.Namespace, store: str, folder: Path, work: Path) -> dict[str, Any]:
    files = sorted(str(p) for p in folder.rglob("*.jpg"))
    small = work / "tenth.txt"
    small.write_text("\n".join(files[: len(files) // 10]) + "\n")
    out = {}
    for label, source in ((f"{len(files) // 10}", str(small)), (f"{len(files)}", str(folder))):
        out[label] = peak_rss(_inspect_argv(source, str(work / f"mem-{label}"), store), args.cores)
        print(f"memory {label} images:", json.dumps(out[label]), flush=True)
    return out


def phase_sigint(args: argparse.Namespace, store: str, folder: Path, work: Path) -> dict[str, Any]:
    from hetmm_ray.archive import FsSpec

    n = len(list(folder.rglob("*.jpg")))
    dest = str(work / "sigint-out")
    argv = _inspect_argv(str(folder), dest, store, "--block-size", str(max(1, min(args.block_size, n // 20))))
    # SIGINT back to its default in the child: a benchmark started in the background by a
    # non-interactive shell (nohup ... &) has SIGINT ignored, and Python keeps an ignored SIGINT
    # ignored, so the job would never see the Ctrl-C this phase sends
    proc = subprocess.Popen(
        argv,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    _wait(lambda: rows_written(dest, FsSpec()) >= n // 2 or proc.poll() is not None, 3600)
    at = rows_written(dest, FsSpec())
    proc.send_signal(signal.SIGINT)
    try:
        rc = proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
    after = rows_written(dest, FsSpec())  # what the interrupted run left: the restart's "already done"
    again = subprocess.run(argv, env=_env(), capture_output=True, text=True)
    out = {
        "interrupted_at_rows": at,
        "rows_after_interrupt": after,
        "rc": rc,  # 130: "hetmm: interrupted"
        "restart_rc": again.returncode,
        "restart_report": [x for x in again.stdout.splitlines() if "images written" in x][-1:],
        **check_output(dest, FsSpec(), n),
    }
    print("sigint:", json.dumps(out), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="60 images, 30 for throughput: shows the phases work")
    ap.add_argument("--images", type=int, default=20_000)
    # 5,000: the claim is the steady rate; each command's start-up (imports, the model load, Ray's
    # workers: ~18 CPU-seconds for inspect on 2 cores, measured) is a smaller share of it than at 2,000
    ap.add_argument("--throughput-images", type=int, default=5_000)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument(
        "--node-cpus",
        type=int,
        default=max(2, (os.cpu_count() or 6) // 3),
        help="logical CPUs per node: one detector actor each, the rest for reading and decoding (at least 2)",
    )
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)), help="CPUs of phase 3 and 4")
    ap.add_argument("--block-size", type=int, default=256)
    ap.add_argument(
        "--image-size",
        type=int,
        default=256,
        help="the product's canvas (backbone input side); a small one keeps the count runs short",
    )
    ap.add_argument(
        "--inspect-variant",
        action="append",
        metavar="OPTIONS",
        help='phase 3 again with these hetmm inspect options after the default run, e.g. "--batch-size 64" '
        "(repeatable; each reported with its ratio to the same predict run)",
    )
    ap.add_argument("--phases", nargs="*", default=["cluster", "throughput", "memory", "sigint"])
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.images, args.throughput_images, args.block_size = 60, 30, 8
    work = Path(tempfile.mkdtemp(prefix="bench-inspect-"))
    results: dict[str, Any] = {"args": vars(args)}
    try:
        store = str(work / "store")
        fit_product(store, args.image_size)
        if "cluster" in args.phases:
            results.update(phase_cluster(args, store, work))
        if {"throughput", "sigint"} & set(args.phases):
            tp = work / "tp"
            write_folder(tp, args.throughput_images)
            if "throughput" in args.phases:
                results["throughput"] = phase_throughput(args, store, tp, work)
            if "sigint" in args.phases:
                results["sigint"] = phase_sigint(args, store, tp, work)
        if "memory" in args.phases:
            mem = work / "mem"
            write_folder(mem, args.images)
            results["memory"] = phase_memory(args, store, mem, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

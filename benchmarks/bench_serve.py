"""HTTP and gRPC service throughput vs in-process, in one run: images/s at concurrency 1 and 8,
and with several images per request.

Starts the service of deploy.yaml on a local Ray (or joins ``--address``), publishes one
product per backbone with 60 template sheets (ALL of 60 synthetic good images; random weights:
speed does not depend on them), then, for each backbone:

- in-process: ``HETMM.load(...).predict`` of ``--inproc-images`` copies of the body per call, calls
  repeated for ``--inproc-seconds`` (default ``--seconds``) per run (batch 8, the detector's own
  decode/prefetch pipeline, this process's torch threads);
- over HTTP: ``POST /v1/products/{p}/predict`` with one PNG body per request from
  ``concurrency`` client threads, the detector replica running as many torch threads as the
  in-process run (``user_config.threads``), greedy batching (replica.py / serve/greedy.py);
- over gRPC (issue 25): hetmm.v1.Inspection ``Predict`` with the same body at the same
  concurrencies, to the gRPC application's detector replica (same settings, no ingress hop);
- ``--multi-images`` (8) images per request (HTTP multipart, and one gRPC ``Predict``) from
  ``--multi-concurrency`` (2) clients: is a request of several images amortised as it should be.

The shares of in-process are of the same run's in-process figure: the mean of the in-process rates
measured before the service starts and again after it stops (this machine's speed drifts by a few per
cent over the minutes a run takes). ``--no-grpc``: HTTP only.

The body is a bottle test PNG (900x900) when ../shared is there, else a synthetic 256x256 PNG.
Each cell is the median of ``--runs`` runs; the timing split is the median over the responses'
``timing`` (ingress decode+resize, Ray transfer, queue, score, images per batch).

``CPU ms/image`` is what a row cost per image in CPU time, a figure a loaded machine changes far less
than images/s: in-process, this process's CPU time; over a service path, the CPU time of every
process of the local Ray this run started (proxies, replicas, registry, controller, raylet, GCS,
agents: the descendants of this process, from ``/proc``) plus the client threads' (this process's).
On C busy cores a path delivers at most ``C * 1000 / (CPU ms/image)`` images/s. (With ``--address``
the cluster's processes are not counted: the column is then the client's alone.) ``--by-process``
also prints that column split by process group (``bench_serve_floor.GROUPS``: proxy, ingress, model
replicas, registry, controller, raylet/GCS/agents/log monitor, other, this client) and, first, what
the service costs idle (``--idle-s`` seconds, in CPU ms per second), to place Serve's share.

    python benchmarks/bench_serve.py                      # this machine (CPU)
    python benchmarks/bench_serve.py --backbones efficientnet_lite0 --by-process   # where the CPU goes
    python benchmarks/bench_serve.py --device cuda        # the same on a GPU host with Ray
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import free_port, post_images, table

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detector import HETMM
from hetmm_ray.store import open_store

SHEETS = 60


def _png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def publish(store: str, backbone: str, device: str) -> str:
    """A product with exactly SHEETS templates per pixel (ALL of SHEETS good images)."""
    config = DetectorConfig(
        backbone=BackboneConfig(name=backbone, weights="random"),
        templates=TemplateConfig(kind="all"),
        threshold=ThresholdConfig(max_images=10, folds=2),
        device=device,
    )
    gear = SyntheticProduct(seed=0, size=256)
    HETMM(config).fit([gear.good(i) for i in range(SHEETS)]).save(open_store(store), backbone)
    return backbone


SPLIT = ("decode_ms", "transfer_ms", "queue_ms", "score_ms", "batch_images")


def request_sender(path: str, per_request: int, running: object):
    """``send(product, body, concurrency, requests)`` of one path: HTTP or gRPC, ``per_request`` images."""
    from common import grpc_images, post_multipart

    if path == "gRPC":
        return lambda p, b, c, n: grpc_images(running.grpc_target, p, [b] * per_request, c, n)
    if per_request > 1:
        return lambda p, b, c, n: post_multipart(running.url, p, [b] * per_request, c, n)
    return lambda p, b, c, n: post_images(running.url, p, b, c, n)


def session_cpu() -> float:
    """CPU seconds of this process and its descendants (the local Ray it started), from /proc."""
    return sum(session_cpu_by_group().values())


def session_cpu_by_group() -> dict[str, float]:
    """:func:`session_cpu` split by process group (``bench_serve_floor.GROUPS``; this process is
    ``client (this process)``)."""
    from bench_serve_floor import group_of, process_cpu

    snap = process_cpu()
    mine = descendants() | {os.getpid()}
    spent: dict[str, float] = {}
    for pid, (cpu, cmd) in snap.items():
        if pid in mine:
            group = CLIENT if pid == os.getpid() else group_of(cmd)
            spent[group] = spent.get(group, 0.0) + cpu
    return spent


CLIENT = "client (this process)"


def descendants() -> set[int]:
    """Pids of this process's descendants (the local Ray it started), from /proc."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    mine, grown = {os.getpid()}, True
    while grown:
        grown = False
        for pid, pp in parent.items():
            if pp in mine and pid not in mine:
                mine.add(pid)
                grown = True
    return mine - {os.getpid()}


def wait_for_no_descendants(timeout_s: float) -> None:
    """Until every descendant process has exited (at most ``timeout_s``; then say which are left)."""
    deadline = time.monotonic() + timeout_s
    while (left := descendants()) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        print(f"note: {len(left)} descendant processes still running after {timeout_s:.0f} s", file=sys.stderr)


def idle_cpu(seconds: float) -> dict[str, float]:
    """CPU ms per second (a thousandth of a core) of each process group of the session over ``seconds``
    of an idle service."""
    before = session_cpu_by_group()
    time.sleep(seconds)
    after = session_cpu_by_group()
    return {g: 1000 * (after.get(g, 0.0) - before.get(g, 0.0)) / seconds for g in after}


def drive(send, product: str, body: bytes, concurrency: int, requests: int, per_request: int = 1) -> dict[str, float]:
    """One run of ``send``; ``rps`` counts images per second (``per_request`` per answered request),
    ``cpu_ms`` the session's CPU per image (:func:`session_cpu`)."""
    cpu0 = session_cpu_by_group()
    answered, failures, wall = send(product, body, concurrency, requests)
    cpu1 = session_cpu_by_group()
    cpu = sum(cpu1.values()) - sum(cpu0.values())
    latencies = [s for s, _ in answered]
    images = max(1, per_request * len(latencies))
    return {
        **{f"cpu:{g}": 1000 * (cpu1[g] - cpu0.get(g, 0.0)) / images for g in cpu1},
        "rps": per_request * len(latencies) / wall,
        "cpu_ms": 1000 * cpu / max(1, per_request * len(latencies)),
        "p50": 1000 * float(np.percentile(latencies, 50)),
        "p99": 1000 * float(np.percentile(latencies, 99)),
        "failures": failures,
        **{k: float(np.median([t.get(k, np.nan) for _, t in answered])) for k in SPLIT},
    }


def body_png() -> tuple[bytes, str]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import BOTTLE

    if BOTTLE.is_dir():
        path = sorted((BOTTLE / "test" / "broken_large").glob("*.png"))[0]
        return path.read_bytes(), "bottle test PNG 900x900"
    return _png(SyntheticProduct(seed=1, size=256).good(999)), "synthetic PNG 256x256"


def in_process(
    store: str, product: str, body: bytes, n: int, runs: int, device: str, seconds: float = 0.0
) -> tuple[float, float]:
    """images/s of ``HETMM.predict`` on ``n`` copies of ``body`` per call, and CPU ms per image (this
    process's; medians of ``runs``). A run makes calls until ``seconds`` have passed (at least one), so
    the baseline is measured over as long as a service row: this host's speed swings by a quarter
    between one-second calls (session 12: 21-36 images/s on identical consecutive calls)."""
    det = HETMM.load(open_store(store), product, device=device)
    images = [body] * n
    det.predict(images[:8])
    rates, cpus = zip(*(predict_for(det, images, seconds) for _ in range(runs)), strict=True)
    return statistics.median(rates), statistics.median(cpus)


def predict_for(detector: HETMM, images: list[bytes], seconds: float) -> tuple[float, float]:
    """One in-process run: ``detector.predict(images)`` repeated until ``seconds`` have passed (at least
    once); images/s and this process's CPU ms per image."""
    done, t0, c0 = 0, time.perf_counter(), time.process_time()
    while done == 0 or time.perf_counter() - t0 < seconds:
        detector.predict(images)
        done += len(images)
    return done / (time.perf_counter() - t0), 1000 * (time.process_time() - c0) / done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbones", nargs="+", default=["mobilenet_v2", "efficientnet_lite0"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--seconds", type=float, default=10.0, help="target length of one HTTP run (sets its requests)")
    parser.add_argument("--inproc-images", type=int, default=24, help="images per in-process predict call")
    parser.add_argument(
        "--inproc-seconds", type=float, default=None, help="length of one in-process run (default: --seconds)"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--address", help="Ray cluster to run on (default: a local Ray)")
    parser.add_argument("--no-grpc", action="store_true", help="HTTP only (no gRPC application)")
    parser.add_argument("--multi-images", type=int, default=8, help="images per request of the multi rows (0: none)")
    parser.add_argument("--multi-concurrency", type=int, default=2)
    parser.add_argument(
        "--by-process",
        action="store_true",
        help="also print each row's CPU ms per image by process group, and an idle service's CPU (--idle-s)",
    )
    parser.add_argument("--idle-s", type=float, default=20.0, help="with --by-process: idle seconds measured")
    args = parser.parse_args()
    inproc_s = args.seconds if args.inproc_seconds is None else args.inproc_seconds

    import torch
    from ray import serve

    from hetmm_ray.distributed import shutdown_ray
    from hetmm_ray.serve.run import start_service, stop_service

    threads = torch.get_num_threads()
    store = tempfile.mkdtemp(prefix="bench-serve-")
    products = [publish(store, b, args.device) for b in args.backbones]
    body, source = body_png()
    measured = {p: in_process(store, p, body, args.inproc_images, args.runs, args.device, inproc_s) for p in products}
    inproc = {p: rate for p, (rate, _) in measured.items()}
    port = free_port()
    user = {"threads": threads}  # batching: the ReplicaSettings defaults (greedy)
    running = start_service(
        store=store,
        port=port,
        address=args.address,
        deployments={"Detector": {"num_replicas": 1, "user_config": user}},
        grpc_port=None if args.no_grpc else free_port(),
    )
    rows = []
    by_process: dict[str, dict[str, float]] = {}  # row label -> group -> CPU ms per image
    try:
        if args.by_process:  # the service idle (its products loaded on first use: none yet)
            time.sleep(5)  # past start-up
            by_process["idle service (CPU ms per s)"] = idle_cpu(args.idle_s)
        for product in products:
            with httpx.Client(base_url=running.url, timeout=600) as client:  # warm-up, one request's time
                client.post(f"/v1/products/{product}/predict", content=body, headers={"content-type": "image/png"})
                t0 = time.perf_counter()
                client.post(f"/v1/products/{product}/predict", content=body, headers={"content-type": "image/png"})
                single = time.perf_counter() - t0
            rows.append(
                [product, "in-process", "-", f"{inproc[product]:.2f}", "100%", f"{measured[product][1]:.1f}"] + [""] * 8
            )
            cases = [("HTTP", 1, c) for c in args.concurrency]
            if running.grpc_target:
                cases += [("gRPC", 1, c) for c in args.concurrency]
            if args.multi_images > 1:
                cases += [("HTTP", args.multi_images, args.multi_concurrency)]
                if running.grpc_target:
                    cases += [("gRPC", args.multi_images, args.multi_concurrency)]
            for path, per_request, conc in cases:
                sender = request_sender(path, per_request, running)
                n = max(2 * conc, int(args.seconds / (single * per_request)))
                # warm-up at this concurrency: every score worker of the replica has run (a worker's
                # first batch builds its one-thread backbone runtime), as the in-process warm-up did
                sender(product, body, conc, 4 * conc)
                runs = [drive(sender, product, body, conc, n, per_request) for _ in range(args.runs)]
                med = {k: statistics.median(r[k] for r in runs) for k in ("rps", "cpu_ms", "p50", "p99", *SPLIT)}
                fails = sum(r["failures"] for r in runs)
                label = f"{product} {path} c{conc}" + ("" if per_request == 1 else f" x{per_request}")
                groups = sorted({k for r in runs for k in r if k.startswith("cpu:")})
                by_process[label] = {k[4:]: statistics.median(r.get(k, 0.0) for r in runs) for k in groups}
                rows.append(
                    [
                        product,
                        path if per_request == 1 else f"{path}, {per_request} images per request",
                        conc,
                        f"{med['rps']:.2f}",
                        med["rps"],  # its share of in-process, once in-process is measured again at the end
                        f"{med['cpu_ms']:.1f}",
                        f"{med['p50']:.0f}",
                        f"{med['p99']:.0f}",
                        f"{med['decode_ms']:.1f}",
                        f"{med['transfer_ms']:.1f}",
                        f"{med['queue_ms']:.1f}",
                        f"{med['score_ms']:.1f}",
                        f"{med['batch_images']:.1f}",
                        fails,
                    ]
                )
                print(" | ".join(str(x) for x in rows[-1]), flush=True)
    finally:
        stop_service(running)
        serve.shutdown()
        if args.address is None:  # the local Ray this run started: gone, as it was before the first rows
            shutdown_ray()
    # In-process again, now that the service is gone: this machine's speed drifts by a few per cent over
    # minutes (2-core VM, measured), so each share is of the mean of the in-process rates measured before
    # and after the service rows, not of the first alone. Measured as the first was, with no Ray process
    # left: the local Ray's processes took a while to exit and ran beside it (after a plain serve.shutdown
    # the after rates ran 13-21 % under the before ones in 4 of 5 runs, which inflated every share).
    if args.address is None:
        wait_for_no_descendants(timeout_s=120.0)
    after = {p: in_process(store, p, body, args.inproc_images, args.runs, args.device, inproc_s) for p in products}
    for row in rows:
        product = row[0]
        rate = (measured[product][0] + after[product][0]) / 2
        if row[1] == "in-process":
            row[3] = f"{rate:.2f} ({measured[product][0]:.2f} before, {after[product][0]:.2f} after)"
        else:
            row[4] = f"{100 * row[4] / rate:.0f}%"
    print()
    print(
        f"predict, {SHEETS} sheets, {source} bodies (one image per request unless stated), 1 detector replica "
        f"per application (HTTP, gRPC) with {threads} "
        f"torch threads; in-process: {args.inproc_images} images per call, {threads} threads; median of {args.runs} "
        f"runs; load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    headers = ["backbone", "path", "concurrency", "images/s", "of in-process", "CPU ms/image", "p50 ms", "p99 ms"]
    headers += ["decode ms", "transfer ms", "queue ms", "score ms", "batch images", "failures"]
    print(table(headers, rows))
    if args.by_process:
        from bench_serve_floor import GROUPS

        names = [g for g, _ in GROUPS] + ["other", CLIENT]
        cols = list(by_process)
        lines = [[g] + [f"{by_process[c].get(g, 0.0):.1f}" for c in cols] for g in names]
        lines.append(["all of it"] + [f"{sum(by_process[c].values()):.1f}" for c in cols])
        print("\nCPU ms per image by process (idle: CPU ms per second of an idle service)")
        print(table(["process", *cols], lines))


if __name__ == "__main__":
    main()

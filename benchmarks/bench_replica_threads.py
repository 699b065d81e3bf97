"""Where a detector replica's CPU goes, thread by thread, under one of issue 25's bar loads.

Starts the service of deploy.yaml on a local Ray (one detector replica per application, 2 torch
threads, as ``bench_serve.py``), publishes its efficientnet_lite0 product of 60 sheets, drives
``grpc8`` (gRPC, one image per request, 8 clients) or ``http2x8`` (HTTP, 8-image requests, 2 clients)
with the bottle test PNG and reads each thread's CPU time of the replica that scores and of the
HTTP ingress from ``/proc/<pid>/task`` over a run of about ``--seconds`` (a fixed number of requests,
the CPU read before the first is sent and after the last is answered). Ray names every Python thread of a
worker after the process (``ray::IDLE``), so threads are listed by id with their CPU ms per image,
largest first; what each is follows from its share (two score workers, the backbone runtime's
threads, decode threads, the replica's event loop; BENCHMARKS.md, issue 25, session 13).

    PYTHONPATH=. python benchmarks/bench_replica_threads.py grpc8 [--seconds 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_serve
from bench_serve_floor import process_cpu
from common import free_port, grpc_images, post_multipart, thread_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("load", choices=["grpc8", "http2x8"])
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()

    from ray import serve

    from hetmm_ray.distributed import shutdown_ray
    from hetmm_ray.serve.run import start_service, stop_service

    store = tempfile.mkdtemp(prefix="bench-threads-")
    product = bench_serve.publish(store, "efficientnet_lite0", "auto")
    body, source = bench_serve.body_png()
    running = start_service(
        store=store,
        port=free_port(),
        deployments={"Detector": {"num_replicas": 1, "user_config": {"threads": 2}}},
        grpc_port=free_port(),
    )
    if args.load == "grpc8":
        per_request, replica = 1, "hetmm-grpc:Detector"

        def send(n: int) -> list:
            return grpc_images(running.grpc_target, product, [body], 8, n)[0]
    else:
        per_request, replica = 8, "hetmm:Detector"

        def send(n: int) -> list:
            return post_multipart(running.url, product, [body] * 8, 2, n)[0]

    try:
        send(32)  # warm: the product loaded, every worker thread started
        mine = bench_serve.descendants()
        procs = {pid: cmd for pid, (_, cmd) in process_cpu().items() if pid in mine}
        pids = {
            "scoring replica": next(p for p, c in procs.items() if replica in c),
            "ingress": next(p for p, c in procs.items() if "Ingress" in c),
        }
        requests = max(4, round(args.seconds * 26 / per_request))  # about --seconds at this host's rate
        before = {name: thread_cpu(pid) for name, pid in pids.items()}
        t0 = time.perf_counter()
        images = per_request * len(send(requests))
        wall = time.perf_counter() - t0
        after = {name: thread_cpu(pid) for name, pid in pids.items()}
    finally:
        stop_service(running)
        serve.shutdown()
        shutdown_ray()
    print(f"{args.load}: {images} images in {wall:.1f} s ({images / wall:.1f} images/s), {source} bodies")
    for name in pids:
        spent = sorted(((after[name][t] - before[name].get(t, 0.0), t) for t in after[name]), reverse=True)
        total = sum(s for s, _ in spent)
        top = ", ".join(f"{t}: {1000 * s / max(1, images):.2f}" for s, t in spent[:12] if s > 0)
        print(f"{name}: {1000 * total / max(1, images):.1f} CPU ms per image; by thread id (ms/image): {top}")


if __name__ == "__main__":
    main()

"""``InspectionClient.predict_all`` (``hetmm predict --grpc``): images per request and requests in flight.

Starts the service of deploy.yaml on a local Ray with gRPC (one detector replica, 2 torch threads, as
``bench_serve.py``), publishes ``bench_serve.publish``'s efficientnet_lite0 product, and scores a
folder's images through ``predict_all`` for each (images per request, requests in flight) pair,
alternating the pairs, ``--runs`` times; prints images/s (median and each run). The default images
are the bottle test PNGs (900x900, ``../shared``), 64 of them; ``--images GLOB`` for others (the
battery_weld test PNGs are 400 px wide grayscale: little to decode).

    PYTHONPATH=. python benchmarks/bench_grpc_client.py [--images GLOB] [--runs 3]
"""

from __future__ import annotations

import argparse
import glob
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_serve
from common import BOTTLE, free_port, table

PAIRS = [(16, 1), (8, 1), (8, 2), (16, 2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", default=str(BOTTLE / "test" / "*" / "*.png"), help="a glob of images")
    parser.add_argument("--limit", type=int, default=64, help="at most this many of them")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    paths = sorted(glob.glob(args.images))[: args.limit]
    if not paths:
        sys.exit(f"no images match {args.images} (the bottle set is in ../shared)")
    uploads = [(p, Path(p).read_bytes()) for p in paths]

    from hetmm_ray.serve.grpc.client import InspectionClient
    from hetmm_ray.serve.run import start_service, stop_service

    store = tempfile.mkdtemp(prefix="bench-grpc-client-")
    product = bench_serve.publish(store, "efficientnet_lite0", "auto")
    running = start_service(
        store=store,
        port=free_port(),
        deployments={"Detector": {"num_replicas": 1, "user_config": {"threads": 2}}},
        grpc_port=free_port(),
    )
    rates: dict[tuple[int, int], list[float]] = {pair: [] for pair in PAIRS}
    try:
        with InspectionClient(running.grpc_target, timeout=600) as client:
            list(client.predict_all(product, uploads[:16]))  # warm: the product loaded, threads started
            for _ in range(args.runs):
                for per_request, in_flight in PAIRS:
                    start = time.perf_counter()
                    results = client.predict_all(product, uploads, per_request=per_request, in_flight=in_flight)
                    n = sum(1 for _ in results)
                    rates[(per_request, in_flight)].append(n / (time.perf_counter() - start))
    finally:
        stop_service(running, shutdown_ray=True)
    print(f"{len(uploads)} images ({args.images}), {args.runs} runs of each pair, alternating")
    rows = [
        [per, fl, f"{statistics.median(r):.1f}", " / ".join(f"{x:.1f}" for x in r)] for (per, fl), r in rates.items()
    ]
    print(table(["images per request", "in flight", "images/s (median)", "runs"], rows))


if __name__ == "__main__":
    main()

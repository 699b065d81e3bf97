"""HTTP service throughput and latency: concurrency 1/8/32, with and without batching.

Starts the service of deploy.yaml on a local Ray (or joins ``--address``),
publishes one product per backbone with 60 template sheets (random weights:
speed does not depend on them), then drives ``POST /v1/products/{p}/predict``
with PNG bodies at each concurrency. Batching is switched live through the
detector's ``user_config`` (``max_batch_size`` 8 vs 1), which also exercises
``reconfigure``. Each cell is the median of ``--runs`` runs.

    python benchmarks/bench_serve.py                      # this machine (CPU)
    python benchmarks/bench_serve.py --device cuda        # the same on a GPU host
"""

from __future__ import annotations

import argparse
import io
import socket
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table

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


def drive(url: str, product: str, body: bytes, concurrency: int, requests: int) -> dict[str, float]:
    latencies: list[float] = []
    lock = threading.Lock()
    failures = 0

    def worker(n: int) -> None:
        nonlocal failures
        with httpx.Client(base_url=url, timeout=600) as client:
            for _ in range(n):
                t0 = time.perf_counter()
                r = client.post(f"/v1/products/{product}/predict", content=body, headers={"content-type": "image/png"})
                with lock:
                    if r.status_code == 200:
                        latencies.append(time.perf_counter() - t0)
                    else:
                        failures += 1

    per = max(1, requests // concurrency)
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, [per] * concurrency))
    wall = time.perf_counter() - start
    return {
        "rps": len(latencies) / wall,
        "p50": 1000 * float(np.percentile(latencies, 50)),
        "p99": 1000 * float(np.percentile(latencies, 99)),
        "failures": failures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbones", nargs="+", default=["mobilenet_v2", "wide_resnet101_2"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=20.0, help="target length of one run (sets its requests)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--address", help="Ray cluster to run on (default: a local Ray)")
    args = parser.parse_args()

    from ray import serve

    from hetmm_ray.serve.run import start_service, stop_service

    store = tempfile.mkdtemp(prefix="bench-serve-")
    products = [publish(store, b, args.device) for b in args.backbones]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    rows = []

    def deploy(max_batch: int):  # a live user_config change: reconfigure() on the same replica
        user = {"max_batch_size": max_batch, "batch_wait_timeout_s": 0.05 if max_batch > 1 else 0.0}
        return start_service(
            store=store,
            port=port,
            address=args.address,
            deployments={"Detector": {"num_replicas": 1, "user_config": user}},
        )

    running = deploy(8)
    body = _png(SyntheticProduct(seed=1, size=256).good(999))
    try:
        for product in products:
            # Warm-up: load the product on the replica and estimate one request's time.
            with httpx.Client(base_url=running.url, timeout=600) as client:
                client.post(f"/v1/products/{product}/predict", content=body, headers={"content-type": "image/png"})
                t0 = time.perf_counter()
                client.post(f"/v1/products/{product}/predict", content=body, headers={"content-type": "image/png"})
                single = time.perf_counter() - t0
            for max_batch in (8, 1):
                running = deploy(max_batch)
                for conc in args.concurrency:
                    n = max(conc, int(args.seconds / single))
                    runs = [drive(running.url, product, body, conc, n) for _ in range(args.runs)]
                    med = {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50", "p99")}
                    fails = sum(r["failures"] for r in runs)
                    rows.append(
                        [
                            product,
                            "on (8)" if max_batch > 1 else "off",
                            conc,
                            f"{med['rps']:.2f}",
                            f"{med['p50']:.0f}",
                            f"{med['p99']:.0f}",
                            fails,
                        ]
                    )
                    print(" | ".join(str(x) for x in rows[-1]), flush=True)
    finally:
        stop_service(running)
        serve.shutdown()
    print()
    print(f"HTTP predict, {SHEETS} sheets, PNG 256x256 bodies, 1 detector replica, median of {args.runs} runs")
    print(table(["backbone", "batching", "concurrency", "req/s", "p50 ms", "p99 ms", "failures"], rows))


if __name__ == "__main__":
    main()

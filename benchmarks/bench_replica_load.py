"""Replicas: the cold-load path of a product's tiny set, and how one hot product spreads.

1. Cold load (``--cold``): products with mobilenet_v2-shaped tiny sets of 60 and 209 sheets
   at 256x256 (random features in the backbone's real layer shapes and bank dtype; ALL
   templates, so the tiny set is the sheets themselves) are published through the registry.
   A replica-like actor then runs the replica's own load path (``Detector._swap``: the
   registry's snapshot, the tiny sets from the object store, the serving detector built)
   for a product it does not hold, ``--samples`` times each (a fresh probe object per
   sample; the backbone is built once beforehand, as a running replica has it).
2. Warm set (``--spread``): one product, ``--replicas`` detector replicas, ``--concurrency``
   HTTP clients. Today's routing (the product's one model id: ``hot_product_inflight`` set
   out of reach) against the warm set (``hot_product_inflight`` 4, spread over every
   replica). Each response names the replica that scored it; the split is reported.

    python benchmarks/bench_replica_load.py --cold --spread
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import free_port, post_images, table

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig


def mobilenet_set(sheets: int, seed: int) -> Any:
    """A TemplateSet of ``sheets`` random images in mobilenet_v2's layer shapes at 256x256."""
    import torch
    import torch.nn.functional as F

    from hetmm_ray.core.backbone import Backbone
    from hetmm_ray.core.scoring import Calibration
    from hetmm_ray.core.templates import TemplateSet

    config = DetectorConfig(
        backbone=BackboneConfig(name="mobilenet_v2", weights="random"),
        templates=TemplateConfig(kind="all"),
        threshold=ThresholdConfig(max_images=4, folds=2),
    )
    size = config.backbone.image_size
    shapes = {k: v.shape[1:] for k, v in Backbone(config.backbone)(torch.rand(1, 3, size, size)).items()}
    dtype = getattr(torch, config.bank_dtype)
    g = torch.Generator().manual_seed(seed)
    bank = {k: F.normalize(torch.randn(sheets, *s, generator=g), dim=1).to(dtype) for k, s in shapes.items()}
    return TemplateSet(
        bank=bank,
        config=config,
        weights_id="random:seed=0",
        image_digests=tuple(f"{seed:08x}{i:024x}" for i in range(sheets)),
        calibration=Calibration(tuple(0.1 + 0.001 * i for i in range(sheets))),
    )


def cold_load(store: str, args: argparse.Namespace) -> list[list[Any]]:
    import ray

    from hetmm_ray.distributed import get_registry
    from hetmm_ray.serve.replica import Detector, ProductModel
    from hetmm_ray.store import open_store

    registry = get_registry(store, detached=True)
    rows = []
    for sheets in args.sheets:
        product = f"mnv2-{sheets}"
        ts = mobilenet_set(sheets, sheets)
        open_store(store).put(product, ts)
        tiny_mib = sum(v.numel() * v.element_size() for v in ts.bank.values()) / 2**20
        ray.get(registry.snapshot.remote(product))  # published: its tiny set is in the object store

        @ray.remote(num_cpus=0.5)
        class Probe:
            def __init__(self) -> None:
                self.detector = Detector.func_or_class(store, 4)

            async def load(self, product: str) -> float:
                head = await self.detector.registry.head.remote(product)
                model = ProductModel(product)  # not held here: the whole replica load path runs
                t0 = time.perf_counter()
                await self.detector._swap(model, head)
                return time.perf_counter() - t0

        probe = Probe.remote()
        ray.get(probe.load.remote(product))  # builds the backbone once, as a running replica has it
        times = [1000 * ray.get(probe.load.remote(product)) for _ in range(args.samples)]
        rows.append(
            [
                f"mobilenet_v2, {sheets} sheets",
                f"{tiny_mib:.1f}",
                f"{np.percentile(times, 50):.0f}",
                f"{np.percentile(times, 99):.0f}",
                args.samples,
            ]
        )
        print(" | ".join(str(x) for x in rows[-1]), flush=True)
        ray.kill(probe)
    return rows


def _png(size: int) -> bytes:
    from PIL import Image

    from hetmm_ray.data.synthetic import SyntheticProduct

    buf = io.BytesIO()
    Image.fromarray(SyntheticProduct(seed=1, size=size).good(999)).save(buf, format="PNG")
    return buf.getvalue()


def drive(url: str, product: str, body: bytes, concurrency: int, requests: int) -> dict[str, Any]:
    answered, failures, _ = post_images(url, product, body, concurrency, requests)
    replicas = Counter(timing["replica"] for _, timing in answered)
    return {"replicas": replicas, "p50": 1000 * statistics.median(s for s, _ in answered), "failures": failures}


def spread(store: str, args: argparse.Namespace) -> list[list[Any]]:
    from ray import serve

    from hetmm_ray.data.synthetic import SyntheticProduct
    from hetmm_ray.detector import HETMM
    from hetmm_ray.serve.run import start_service, stop_service
    from hetmm_ray.store import open_store

    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=64),
        templates=TemplateConfig(kind="all"),
        threshold=ThresholdConfig(max_images=4, folds=2),
    )
    gear = SyntheticProduct(seed=0, size=64)
    HETMM(config).fit([gear.good(i) for i in range(6)]).save(open_store(store), "hot")
    body = _png(64)
    port = free_port()
    rows = []
    for label, inflight in (("pinned (today)", 100_000), ("warm set", 4)):
        running = start_service(
            store=store,
            port=port,
            args={"hot_product_inflight": inflight, "hot_product_spread": args.replicas},
            deployments={
                "Detector": {"num_replicas": args.replicas, "ray_actor_options": {"num_cpus": 0.25}},
                "Ingress": {"ray_actor_options": {"num_cpus": 0.1}},
            },
        )
        try:
            drive(running.url, "hot", body, args.concurrency, args.concurrency)  # warm-up
            out = drive(running.url, "hot", body, args.concurrency, args.requests)
        finally:
            stop_service(running)
        served = sorted(out["replicas"].values(), reverse=True)
        total = sum(served)
        rows.append(
            [
                label,
                f"{len(served)} of {args.replicas}",
                " / ".join(f"{100 * n / total:.0f}%" for n in served),
                f"{out['p50']:.0f}",
                out["failures"],
            ]
        )
        print(" | ".join(str(x) for x in rows[-1]), flush=True)
    serve.shutdown()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--spread", action="store_true")
    parser.add_argument("--sheets", nargs="+", type=int, default=[60, 209])
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument("--json", help="write the tables here")
    args = parser.parse_args()

    from hetmm_ray.distributed import connect

    connect(num_cpus=2)
    store = tempfile.mkdtemp(prefix="bench-replica-")
    out: dict[str, Any] = {}
    if args.cold:
        out["cold"] = cold_load(store, args)
        print()
        print(table(["tiny set", "MiB", "cold load p50 ms", "p99 ms", "samples"], out["cold"]))
    if args.spread:
        out["spread"] = spread(store, args)
        print()
        print(f"one product, concurrency {args.concurrency}, {args.replicas} replicas, {args.requests} requests")
        print(table(["routing", "replicas serving", "split", "p50 ms", "failures"], out["spread"]))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

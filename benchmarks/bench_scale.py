"""Growing the number of products on a 3-node cluster: processes, memory, create, hot update, predict.

Starts a ``ray.cluster_utils.Cluster`` of ``--nodes`` raylets on this machine, a registry
with ``--hosts`` template hosts (distributed/hosts.py), and grows the store to each of
``--products`` (default 10, 100, 1000) tiny synthetic products: random, L2-normalised
resnet18-shaped features at ``--image-size`` (no backbone runs: cost does not depend on
the values), ``--images`` images each, ``--kind``/``--sheets`` selection, created through
``ProductRegistry.create`` (selection, calibration, publish, placement on the hosts) with
``--create-concurrency`` creates in flight. After each step it records:

- processes of the whole cluster (every descendant of this process: GCS, raylets, workers)
  and the Ray worker processes by kind (``ray::TemplateHost``, ...), resident memory (RSS)
  and proportional set size (PSS: shared pages counted once over their sharers);
- the products' own tensors: what the hosts hold (banks + selections) and the object
  store's use (published tiny sets), so memory per added product is compared with them;
- create throughput (products/minute) of that step.

Then: the hot-update latency of one product while the others idle (``--updates`` updates
of one new image, median), and, with ``--serve``, predict latency over HTTP for products
that are cold on every replica versus warm (the same product again).

    python benchmarks/bench_scale.py                                  # 10, 100, 1000
    python benchmarks/bench_scale.py --products 10 100 --json out.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import free_port, table

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig

RESNET18 = {"layer1": (64, 4), "layer2": (128, 8), "layer3": (256, 16)}  # channels, stride


def layer_shapes(image_size: int) -> dict[str, tuple[int, int, int]]:
    return {k: (c, max(1, image_size // s), max(1, image_size // s)) for k, (c, s) in RESNET18.items()}


def features(n: int, seed: int, image_size: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for layer, shape in layer_shapes(image_size).items():
        x = rng.standard_normal((n, *shape), dtype=np.float32)
        out[layer] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def digests(seed: int, n: int) -> list[str]:
    return [f"{seed:08x}{i:024x}" for i in range(n)]


def _descendants(root: int) -> list[int]:
    """Every descendant of ``root`` (from /proc: Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def cluster_processes() -> dict[str, Any]:
    """Every process of the local cluster (this driver's descendants) with RSS and PSS (smaps_rollup)."""
    kinds: dict[str, int] = {}
    pss_by_kind: dict[str, int] = {}
    rss = pss = count = 0
    for pid in _descendants(os.getpid()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue  # exited meanwhile
        fields = {line.split(":")[0]: line.split()[1] for line in rollup.splitlines()[1:] if ":" in line}
        kind = cmd.split()[0] if cmd.startswith("ray::") else Path(cmd.split()[0] if cmd else "?").name
        kinds[kind] = kinds.get(kind, 0) + 1
        pss_by_kind[kind] = pss_by_kind.get(kind, 0) + int(fields.get("Pss", 0)) * 1024
        rss += int(fields.get("Rss", 0)) * 1024
        pss += int(fields.get("Pss", 0)) * 1024
        count += 1
    # Idle task workers come and go with Ray's worker pool, not with products: the memory that
    # should grow with products is the rest (hosts, registry, raylets with their object stores, GCS).
    steady = pss - pss_by_kind.get("ray::IDLE", 0)
    return {
        "processes": count,
        "kinds": dict(sorted(kinds.items())),
        "pss_by_kind": dict(sorted(pss_by_kind.items())),
        "rss": rss,
        "pss": pss,
        "pss_without_idle_workers": steady,
    }


def object_store_used() -> int:
    import ray

    total = ray.cluster_resources().get("object_store_memory", 0)
    free = ray.available_resources().get("object_store_memory", 0)
    return int(total - free)


def create_products(registry: Any, names: list[str], args: argparse.Namespace, config: dict[str, Any]) -> float:
    """Create ``names`` with ``--create-concurrency`` creates in flight; returns seconds taken."""
    import ray

    start = time.perf_counter()
    pending: list[Any] = []
    for name in names:
        seed = int(name.rsplit("-", 1)[1])
        pending.append(
            registry.create.remote(
                name, config, features(args.images, seed, args.image_size), digests(seed, args.images)
            )
        )
        if len(pending) >= args.create_concurrency:
            done, pending = ray.wait(pending, num_returns=1)
            ray.get(done)
    ray.get(pending)
    return time.perf_counter() - start


def own_tensor_bytes(args: argparse.Namespace) -> dict[str, int]:
    """A product's own tensors: bank, selection indices (PTS kinds) and published tiny set."""
    shapes = layer_shapes(args.image_size)
    per_image = sum(4 * c * h * w for c, h, w in shapes.values())
    selected = args.kind != "all"
    sheets = min(args.sheets, args.images) if selected else args.images
    return {
        "bank": args.images * per_image,
        "indices": sum(8 * sheets * h * w for _, h, w in shapes.values()) if selected else 0,
        "tiny": sheets * per_image,
    }


def snapshot_state(registry: Any, products: int, seconds: float, created: int) -> dict[str, Any]:
    import ray

    hosts = ray.get(registry.hosts_info.remote())
    procs = cluster_processes()
    return {
        "products": products,
        "create_s": seconds,
        "created": created,
        "products_per_min": 60 * created / seconds if seconds else None,
        "host_shards": sum(h.get("shards", 0) for h in hosts),
        "host_tensor_bytes": sum(h.get("tensor_bytes", 0) for h in hosts),
        "host_pids": sorted(h.get("pid", -1) for h in hosts),
        "object_store_bytes": object_store_used(),
        **procs,
    }


def hot_update_latency(registry: Any, product: str, args: argparse.Namespace) -> list[float]:
    import ray

    seed0 = int(product.rsplit("-", 1)[1])
    times = []
    for i in range(args.updates):
        seed = 10_000_000 + seed0 * 100 + i
        t0 = time.perf_counter()
        ray.get(registry.update.remote(product, features(1, seed, args.image_size), digests(seed, 1)))
        times.append(time.perf_counter() - t0)
    return times


def _png(size: int) -> bytes:
    from PIL import Image

    from hetmm_ray.data.synthetic import SyntheticProduct

    buf = io.BytesIO()
    Image.fromarray(SyntheticProduct(seed=1, size=size).good(999)).save(buf, format="PNG")
    return buf.getvalue()


def predict_cold_warm(address: str, store: str, products: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Predict latency over HTTP: first request of a product no replica holds, then again (warm)."""
    import httpx
    from ray import serve

    from hetmm_ray.serve.run import start_service, stop_service

    port = free_port()
    running = start_service(
        store=store,
        port=port,
        address=address,
        args={"template_hosts": args.hosts, "max_products_per_replica": 4},
        deployments={
            "Detector": {"num_replicas": args.replicas, "ray_actor_options": {"num_cpus": 0.25}},
            "Ingress": {"ray_actor_options": {"num_cpus": 0.1}},
        },
    )
    body = _png(args.image_size)
    cold, warm = [], []
    try:
        with httpx.Client(base_url=running.url, timeout=600) as client:

            def post(product: str) -> float:
                t0 = time.perf_counter()
                r = client.post(f"/v1/products/{product}/predict", content=body, headers={"content-type": "image/png"})
                r.raise_for_status()
                return time.perf_counter() - t0

            post(products[0])  # the replicas' first request builds the backbone: not a product's cold load
            for product in products[1 : 1 + args.cold_samples]:
                cold.append(post(product))
                warm.extend(post(product) for _ in range(3))
    finally:
        stop_service(running)
        serve.shutdown()
    return {
        "cold_ms": [1000 * t for t in cold],
        "warm_ms": [1000 * t for t in warm],
        "cold_p50_ms": 1000 * float(np.percentile(cold, 50)),
        "cold_p99_ms": 1000 * float(np.percentile(cold, 99)),
        "warm_p50_ms": 1000 * float(np.percentile(warm, 50)),
        "warm_p99_ms": 1000 * float(np.percentile(warm, 99)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--products", nargs="+", type=int, default=[10, 100, 1000])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--cpus-per-node", type=int, default=1)
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--images", type=int, default=6, help="good images per product")
    parser.add_argument("--kind", default="pts_o")
    parser.add_argument("--sheets", type=int, default=2)
    parser.add_argument("--create-concurrency", type=int, default=4)
    parser.add_argument("--updates", type=int, default=5)
    parser.add_argument("--serve", action="store_true", help="also measure cold vs warm predict over HTTP")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--cold-samples", type=int, default=10)
    parser.add_argument("--json", help="write the measurements here")
    args = parser.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    from hetmm_ray.distributed import connect, get_registry, shutdown_ray

    store = tempfile.mkdtemp(prefix="bench-scale-")
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": args.cpus_per_node, "include_dashboard": False},
    )
    for _ in range(1, args.nodes):
        cluster.add_node(num_cpus=args.cpus_per_node)
    cluster.wait_for_nodes()
    connect(cluster.address)
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=args.image_size),
        templates=TemplateConfig(kind=args.kind, sheets=args.sheets),
        threshold=ThresholdConfig(max_images=4, folds=2),
    ).to_dict()
    registry = get_registry(store, placement={"hosts": args.hosts, "num_cpus": 0})
    ray.get(registry.hosts_info.remote())  # start the hosts before the first measurement
    results: dict[str, Any] = {"args": vars(args), "cpu_count": os.cpu_count(), "steps": []}
    results["own_tensor_bytes_per_product"] = own_tensor_bytes(args)
    results["empty"] = snapshot_state(registry, 0, 0.0, 0)
    have = 0
    try:
        for target in sorted(args.products):
            names = [f"p-{i:05d}" for i in range(have, target)]
            seconds = create_products(registry, names, args, config)
            have = target
            step = snapshot_state(registry, target, seconds, len(names))
            results["steps"].append(step)
            print(
                f"{target} products: {step['processes']} processes, PSS {step['pss'] / 2**20:.0f} MiB, "
                f"RSS {step['rss'] / 2**20:.0f} MiB, host tensors {step['host_tensor_bytes'] / 2**20:.1f} MiB, "
                f"object store {step['object_store_bytes'] / 2**20:.1f} MiB, "
                f"create {step['products_per_min']:.1f}/min, kinds {step['kinds']}",
                flush=True,
            )
        times = hot_update_latency(registry, "p-00000", args)
        results["hot_update_s"] = times
        print(
            f"hot update of one product while {have - 1} idle: median {statistics.median(times):.2f} s "
            f"({', '.join(f'{t:.2f}' for t in times)})",
            flush=True,
        )
        if args.serve:
            results["predict"] = predict_cold_warm(cluster.address, store, [f"p-{i:05d}" for i in range(have)], args)
            p = results["predict"]
            print(
                f"predict: cold p50 {p['cold_p50_ms']:.0f} ms p99 {p['cold_p99_ms']:.0f} ms; "
                f"warm p50 {p['warm_p50_ms']:.0f} ms p99 {p['warm_p99_ms']:.0f} ms",
                flush=True,
            )
    finally:
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
        shutdown_ray()
        cluster.shutdown()

    rows = []
    prev = results["empty"]
    own = sum(results["own_tensor_bytes_per_product"].values())
    for step in results["steps"]:
        added = step["products"] - prev["products"]
        per_all = (step["pss"] - prev["pss"]) / added
        per = (step["pss_without_idle_workers"] - prev["pss_without_idle_workers"]) / added
        actors = sum(v for k, v in step["kinds"].items() if k.startswith("ray::") and k != "ray::IDLE")
        rows.append(
            [
                step["products"],
                step["processes"],
                actors,
                step["kinds"].get("ray::IDLE", 0),
                f"{step['pss'] / 2**20:.0f}",
                f"{step['pss_without_idle_workers'] / 2**20:.0f}",
                f"{step['rss'] / 2**20:.0f}",
                f"{own / 1024:.0f}",
                f"{per / 1024:.0f}",
                f"{per_all / 1024:.0f}",
                f"{step['products_per_min']:.1f}",
            ]
        )
        prev = step
    print()
    print(f"{args.nodes}-node Cluster, {args.hosts} template hosts, {os.cpu_count()} cores shared with other work")
    print(
        table(
            [
                "products",
                "processes",
                "actor/agent procs",
                "idle task workers",
                "PSS MiB",
                "PSS w/o idle MiB",
                "RSS MiB",
                "own KiB/product",
                "PSS w/o idle KiB/added",
                "PSS KiB/added",
                "creates/min",
            ],
            rows,
        )
    )
    if "hot_update_s" in results:
        print(
            f"hot update (median of {len(results['hot_update_s'])}): {statistics.median(results['hot_update_s']):.2f} s"
        )


if __name__ == "__main__":
    main()

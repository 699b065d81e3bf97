"""Replicas, products and template hosts on Ray: how the service scales and what it holds.

``autoscale``: autoscaling under a stated load profile; detector replicas and p50/p99 latency over
time, as a PNG. The service of deploy.yaml on a local Ray with more logical CPUs than cores
(``--ray-cpus``, 8: the Detector asks 0.5 CPU, so its max_replicas fit), the Detector with deploy.yaml's
autoscaling options and shortened delays (``--upscale-delay-s`` 2, ``--downscale-delay-s`` 10,
``--look-back-s`` 4; metrics pushed every second), one product (60 sheets, random weights), driven by:
``--idle-s`` of nothing; ``--heavy-s`` of ``--clients`` closed-loop clients sending ``--images``-image
multipart predicts; one client sending one-image predicts until one replica is left (at most
``--light-max-s``), then ``--idle-s`` more. Running replicas are sampled every second
(``serve.status()``). Writes ``out/autoscale.csv`` (per second: replicas, answered, failed, p50 and p99
ms of the requests started in the last ``--window-s``) and ``out/autoscale.png`` (drawn with Pillow),
and prints the largest replica count, when >= 3 and back to 1 were reached, and the failed requests.

``one-machine``: how ``hetmm serve`` scales and threads its Detector on one machine, against the
alternatives, each started the way ``hetmm serve`` starts it, alternating (this host drifts over
minutes): ``one machine`` (1 replica, threads = the machine's cores: what it runs), ``deploy.yaml``
(deploy.yaml's Detector as written: autoscaled from 1 replica of ``num_cpus`` 0.5, 1 thread), ``3 x 1``
and ``3 x 2`` (three replicas of 1 and of 2 threads). One PNG body per HTTP request, closed-loop
clients at each ``--concurrency``; images/s and p50 are medians of ``--runs`` runs per round, the
cells medians over ``--rounds`` rounds.

``replicas``: the cold-load path of a product's tiny set (``--cold``), and how one hot product spreads
(``--spread``). Cold: products with mobilenet_v2-shaped tiny sets of 60 and 209 sheets at 256x256
(random features in the backbone's real layer shapes and bank dtype, ALL templates) are published
through the registry; a replica-like actor runs the replica's own load path (``Detector.swap``: the
registry's snapshot, the tiny sets from the object store, the serving detector built) for a product it
does not hold, ``--samples`` times each (the backbone built once beforehand, as a running replica has
it). Spread: one product, ``--replicas`` detector replicas, ``--concurrency`` HTTP clients, pinned
routing (``hot_product_inflight`` out of reach) against the warm set (``hot_product_inflight`` 4, spread
over every replica); each response names the replica that scored it.

``scale``: growing the number of products on a ``--nodes`` cluster (``ray.cluster_utils.Cluster``), a
registry with ``--hosts`` template hosts, tiny synthetic products (random, L2-normalised
resnet18-shaped features at ``--image-size``, ``--images`` images, ``--kind``/``--sheets``) created
through ``ProductRegistry.create`` with ``--create-concurrency`` in flight, to each of ``--products``.
After each step: processes of the cluster by kind, RSS and PSS, the products' own tensors (hosts'
bytes, object store use), creates per minute. Then the hot-update latency of one product while the
others idle (``--updates``, median) and, with ``--serve``, predict latency over HTTP of products cold on
every replica against warm.

``candidate-memory``: a candidate version on the template hosts: bytes held and the hosts' RSS before,
with it, after ``discard`` (``--discards`` times) and after ``promote``; one synthetic product
(random resnet18-shaped features, ``--images`` images at ``--image-size``, ALL; each candidate adds
``--extra``). Memory only, no timings.

``tiled-create``: a tiled product's create on a ``ray.cluster_utils.Cluster`` of ``--nodes`` nodes of
``--cpus-per-node`` CPUs each (default: 1 node, then 2, of 1 CPU), the same frames: ``--frames``
synthetic surface frames of ``--size`` px (``data/surface.py``'s ``write_surface_layout``, PNG bytes),
``--tiles`` (``RxC`` or ``auto``, resolved by ``geometry_rule.choose_geometry``), ``--backbone`` with
``--weights`` at ``backbone.image_size`` ``--image-size``, the product's other defaults unless given.
Each run is what the service's tiled create runs before it publishes: the frame-batch feature tasks
(``extract.extract_tiles_ray``, ``--task-cpus`` each, default ``TASK_CPUS``, SPREAD), then a fit task per
position and its calibration's fold ranges as tasks (``position_fit.fit_tiles_ray``, ``--task-cpus``
each) and their join (``position_fit.tiles_fitted``); the time of each part and the
whole (wall, from the first task submitted to the template set back). Before the timed runs of a
cluster, one untimed create of a frame per task slot starts every node's workers and builds their
backbones, as a running service has them. Prints the median of ``--runs`` runs per cluster, the ratio of
each cluster's total to the first's, and whether every cluster fitted the same product; ``--json``
writes it all.

    python benchmarks/bench_cluster.py autoscale                 # the profile above
    python benchmarks/bench_cluster.py autoscale --heavy-s 20 --clients 4 --images 2 --light-max-s 60
    python benchmarks/bench_cluster.py one-machine
    python benchmarks/bench_cluster.py replicas --cold --spread --json replica.json
    python benchmarks/bench_cluster.py scale --products 10 100 1000 --serve --json scale.json
    python benchmarks/bench_cluster.py candidate-memory --discards 6
    python benchmarks/bench_cluster.py candidate-memory --images 8 --extra 4 --image-size 32   # a quick check
    python benchmarks/bench_cluster.py tiled-create --frames 32 --json tiled-create.json
    python benchmarks/bench_cluster.py tiled-create --frames 32 --task-cpus 1 --runs 3   # 2 cores: a task per core
    python benchmarks/bench_cluster.py tiled-create --frames 4 --size 160 --image-size 48 --backbone resnet18  # a check
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    REPO,
    body_png,
    descendants,
    drive,
    free_port,
    png_bytes,
    post_images,
    publish,
    request_sender,
    served,
    table,
)

# --- autoscale ---------------------------------------------------------------------------------------------
PUSH_ENV = (
    "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S",
    "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S",
)


def running_replicas() -> int:
    from ray import serve

    app = serve.status().applications.get("hetmm")
    if app is None or "Detector" not in app.deployments:
        return 0
    return int(app.deployments["Detector"].replica_states.get("RUNNING", 0))


class Load:
    """Closed-loop HTTP clients; every answer kept as (start s, latency s, status)."""

    def __init__(self, url: str, product: str, body: bytes, t0: float) -> None:
        self.url, self.product, self.body, self.t0 = url, product, body, t0
        self.records: list[tuple[float, float, int]] = []
        self.lock = threading.Lock()

    def start(self, clients: int, images: int, stop: threading.Event) -> list[threading.Thread]:
        import httpx

        files = [("images", (f"{i}.png", self.body, "image/png")) for i in range(images)]

        def client() -> None:
            with httpx.Client(timeout=600) as http:
                while not stop.is_set():
                    start = time.monotonic()
                    try:
                        status = http.post(f"{self.url}/v1/products/{self.product}/predict", files=files).status_code
                    except httpx.HTTPError:
                        status = 0
                    with self.lock:
                        self.records.append((start - self.t0, time.monotonic() - start, status))

        threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
        for t in threads:
            t.start()
        return threads


def plot(rows: list[dict[str, float]], path: Path, title: str) -> None:
    """Replicas (top) and p50/p99 ms (bottom) against seconds, drawn with Pillow."""
    from PIL import Image, ImageDraw

    w, h, left, right = 1000, 640, 70, 20
    panels = [(40, 260, "replicas"), (330, 590, "latency ms (p50 blue, p99 red)")]
    img = Image.new("RGB", (w, h), "white")
    draw = ImageDraw.Draw(img)
    draw.text((left, 10), title, fill="black")
    t_max = max(r["t"] for r in rows) or 1.0
    x = lambda t: left + (w - left - right) * t / t_max  # noqa: E731

    def axes(top: int, bottom: int, label: str, y_max: float) -> None:
        draw.rectangle([left, top, w - right, bottom], outline="black")
        draw.text((left + 5, top + 3), label, fill="black")
        for i in range(5):
            v = y_max * i / 4
            y = bottom - (bottom - top) * i / 4
            draw.line([left - 4, y, left, y], fill="black")
            draw.text((5, y - 6), f"{v:.0f}", fill="black")
        for i in range(6):
            t = t_max * i / 5
            draw.text((x(t) - 10, bottom + 4), f"{t:.0f}s", fill="black")

    top, bottom, label = panels[0]
    r_max = max(4.0, max(r["replicas"] for r in rows))
    axes(top, bottom, label, r_max)
    y = lambda v: bottom - (bottom - top) * v / r_max  # noqa: E731
    pts = [(x(r["t"]), y(r["replicas"])) for r in rows]
    draw.line([p for a, b in itertools.pairwise(pts) for p in (a, (b[0], a[1]), b)], fill="darkgreen", width=3)
    top, bottom, label = panels[1]
    lat = [r for r in rows if r["p50_ms"] == r["p50_ms"]]  # not NaN
    l_max = max([100.0] + [r["p99_ms"] for r in lat]) * 1.05
    axes(top, bottom, label, l_max)
    y = lambda v: bottom - (bottom - top) * v / l_max  # noqa: E731
    for key, colour in (("p50_ms", "blue"), ("p99_ms", "red")):
        pts = [(x(r["t"]), y(r[key])) for r in lat]
        if len(pts) > 1:
            draw.line(pts, fill=colour, width=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)


def autoscale(args: argparse.Namespace) -> None:
    import hetmm_ray  # noqa: F401, I001 - first, as in the service: it sets the OpenMP wait policy before torch loads
    import numpy as np
    import yaml

    from hetmm_ray.serve.app import DEPLOY_YAML

    for k in PUSH_ENV:
        os.environ.setdefault(k, "1")
    store = tempfile.mkdtemp(prefix="bench-autoscale-")
    product = publish(store, args.backbone, "auto")
    body, source = body_png()
    app = yaml.safe_load(DEPLOY_YAML.read_text())["applications"][0]
    stated = next(d for d in app["deployments"] if d["name"] == "Detector")["autoscaling_config"]
    autoscaling = {
        **stated,
        "upscale_delay_s": args.upscale_delay_s,
        "downscale_delay_s": args.downscale_delay_s,
        "look_back_period_s": args.look_back_s,
    }
    samples: list[tuple[float, int]] = []
    # the service's own embedded Ray (distributed.runtime.connect), with more logical CPUs than cores
    with served(
        store=store,
        port=free_port(),
        num_cpus=args.ray_cpus,
        deployments={"Detector": {"autoscaling_config": autoscaling}},
    ) as running:
        t0 = time.monotonic()
        sampling = threading.Event()

        def sampler() -> None:
            while not sampling.is_set():
                samples.append((time.monotonic() - t0, running_replicas()))
                time.sleep(1.0)

        threading.Thread(target=sampler, daemon=True).start()
        load = Load(running.url, product, body, t0)
        try:
            time.sleep(args.idle_s)
            stop = threading.Event()
            threads = load.start(args.clients, args.images, stop)
            time.sleep(args.heavy_s)
            stop.set()
            for t in threads:
                t.join()
            heavy_end = time.monotonic() - t0
            stop = threading.Event()
            threads = load.start(1, 1, stop)
            deadline = time.monotonic() + args.light_max_s
            while time.monotonic() < deadline and running_replicas() > 1:
                time.sleep(1.0)
            time.sleep(args.idle_s)
            stop.set()
            for t in threads:
                t.join()
        finally:
            sampling.set()

    rows = []
    for t, replicas in samples:
        window = [r for r in load.records if t - args.window_s < r[0] <= t]
        ok = [lat for _, lat, s in window if s == 200]
        rows.append(
            {
                "t": round(t, 1),
                "replicas": replicas,
                "answered": sum(1 for r in load.records if t - 1.0 < r[0] <= t and r[2] == 200),
                "failed": sum(1 for r in load.records if t - 1.0 < r[0] <= t and r[2] != 200),
                "p50_ms": float(np.percentile(ok, 50) * 1000) if ok else float("nan"),
                "p99_ms": float(np.percentile(ok, 99) * 1000) if ok else float("nan"),
            }
        )
    stem = Path(args.out)
    stem.parent.mkdir(parents=True, exist_ok=True)
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    failed = sum(1 for _, _, s in load.records if s != 200)
    peak = max(r for _, r in samples)
    up = next((t for t, r in samples if r >= 3), None)
    down = next((t for t, r in samples if t > heavy_end and r == 1), None)
    title = (
        f"{args.clients} clients x {args.images}-image requests for {args.heavy_s:.0f} s, then 1 client x 1 image; "
        f"{product}, {source}; delays up {args.upscale_delay_s:g} s / down {args.downscale_delay_s:g} s"
    )
    plot(rows, stem.with_suffix(".png"), title)
    print(title)
    print(
        f"requests {len(load.records)}, failed {failed}; replicas peak {peak}; >= 3 at "
        f"{'-' if up is None else f'{up:.0f} s'}; back to 1 at {'-' if down is None else f'{down:.0f} s'} "
        f"(load ended at {heavy_end:.0f} s); {os.cpu_count()} cores, Ray {args.ray_cpus} logical CPUs"
    )
    print(f"wrote {stem.with_suffix('.csv')} and {stem.with_suffix('.png')}")


# --- one-machine ---------------------------------------------------------------------------------------------
def layouts() -> dict[str, dict | None]:
    """Name -> the ``deployments`` override given to ``start_service`` (None: what hetmm serve runs)."""
    from hetmm_ray.serve.app import DEPLOY_YAML, deployment_options, load_deploy_config

    app = next(a for a in load_deploy_config(DEPLOY_YAML)["applications"] if a["name"] == "hetmm")
    stated = deployment_options(app)["Detector"]
    return {
        "one machine": None,
        "deploy.yaml": {"Detector": {"autoscaling_config": stated["autoscaling_config"]}},
        "3 x 1": {"Detector": {"num_replicas": 3, "user_config": {**stated["user_config"], "threads": 1}}},
        "3 x 2": {"Detector": {"num_replicas": 3, "user_config": {**stated["user_config"], "threads": 2}}},
    }


LAYOUTS = ["one machine", "deploy.yaml", "3 x 1", "3 x 2"]


def one_machine(args: argparse.Namespace) -> None:
    store = tempfile.mkdtemp(prefix="bench-one-machine-")
    product = publish(store, args.backbone, "auto")
    body, source = body_png()
    options = layouts()
    seen: dict[tuple[str, int], list[tuple[float, float, int]]] = {}
    for round_ in range(args.rounds):
        for name in args.layouts:
            with served(store=store, port=free_port(), deployments=options[name]) as running:
                send = request_sender("HTTP", 1, running)
                send(product, body, 1, 4)  # the product loaded, the first batches run
                for conc in args.concurrency:
                    send(product, body, conc, 4 * conc)
                    runs = [drive(send, product, body, conc, args.requests) for _ in range(args.runs)]
                    rps = statistics.median(r["rps"] for r in runs)
                    p50 = statistics.median(r["p50"] for r in runs)
                    fails = sum(int(r["failures"]) for r in runs)
                    seen.setdefault((name, conc), []).append((rps, p50, fails))
                    print(f"round {round_ + 1} {name} ({running.detector}) c{conc}: {rps:.1f} images/s", flush=True)
    rows = []
    for name in args.layouts:
        for conc in args.concurrency:
            cells = seen[(name, conc)]
            base = (
                statistics.median(r for r, _, _ in seen[("one machine", conc)]) if "one machine" in args.layouts else 0
            )
            rps = statistics.median(r for r, _, _ in cells)
            rows.append(
                [
                    name,
                    conc,
                    " / ".join(f"{r:.1f}" for r, _, _ in cells),
                    f"{rps:.1f}",
                    f"{100 * rps / base:.0f} %" if base else "-",
                    f"{statistics.median(p for _, p, _ in cells):.0f}",
                    sum(f for _, _, f in cells),
                ]
            )
    print()
    print(f"HTTP, {source} bodies, {args.backbone}; medians of {args.runs} runs x {args.rounds} rounds, alternating")
    print(table(["Detector", "clients", "images/s by round", "images/s", "of one machine", "p50 ms", "failed"], rows))


# --- replicas: cold load and spread ---------------------------------------------------------------------------
def mobilenet_set(sheets: int, seed: int) -> Any:
    """A TemplateSet of ``sheets`` random images in mobilenet_v2's layer shapes at 256x256."""
    import torch
    import torch.nn.functional as F

    from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
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
    import numpy as np
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
                await self.detector.swap(model, head)
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


def spread_run(url: str, product: str, body: bytes, concurrency: int, requests: int) -> dict[str, Any]:
    answered, failures, _ = post_images(url, product, body, concurrency, requests)
    replicas = Counter(timing["replica"] for _, timing in answered)
    return {"replicas": replicas, "p50": 1000 * statistics.median(s for s, _ in answered), "failures": failures}


def spread(store: str, args: argparse.Namespace) -> list[list[Any]]:
    from ray import serve

    from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
    from hetmm_ray.data.synthetic import SyntheticProduct
    from hetmm_ray.detection.detector import HETMM
    from hetmm_ray.store import open_store

    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=64),
        templates=TemplateConfig(kind="all"),
        threshold=ThresholdConfig(max_images=4, folds=2),
    )
    gear = SyntheticProduct(seed=0, size=64)
    HETMM(config).fit([gear.good(i) for i in range(6)]).save(open_store(store), "hot")
    body = png_bytes(SyntheticProduct(seed=1, size=64).good(999))
    port = free_port()
    rows = []
    for label, inflight in (("pinned (today)", 100_000), ("warm set", 4)):
        with served(
            leave="apps",  # Serve keeps its proxy on the port: the next layout reuses it
            store=store,
            port=port,
            args={"hot_product_inflight": inflight, "hot_product_spread": args.replicas},
            deployments={
                "Detector": {"num_replicas": args.replicas, "ray_actor_options": {"num_cpus": 0.25}},
                "Ingress": {"ray_actor_options": {"num_cpus": 0.1}},
            },
        ) as running:
            spread_run(running.url, "hot", body, args.concurrency, args.concurrency)  # warm-up
            out = spread_run(running.url, "hot", body, args.concurrency, args.requests)
        served_by = sorted(out["replicas"].values(), reverse=True)
        total = sum(served_by)
        rows.append(
            [
                label,
                f"{len(served_by)} of {args.replicas}",
                " / ".join(f"{100 * n / total:.0f}%" for n in served_by),
                f"{out['p50']:.0f}",
                out["failures"],
            ]
        )
        print(" | ".join(str(x) for x in rows[-1]), flush=True)
    serve.shutdown()
    return rows


def replicas(args: argparse.Namespace) -> None:
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


# --- scale: many products on a cluster -----------------------------------------------------------------------
RESNET18 = {"layer1": (64, 4), "layer2": (128, 8), "layer3": (256, 16)}  # channels, stride


def layer_shapes(image_size: int) -> dict[str, tuple[int, int, int]]:
    return {k: (c, max(1, image_size // s), max(1, image_size // s)) for k, (c, s) in RESNET18.items()}


def features(n: int, seed: int, image_size: int) -> dict[str, Any]:
    """Random, L2-normalised resnet18-shaped features of ``n`` images (numpy)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = {}
    for layer, shape in layer_shapes(image_size).items():
        x = rng.standard_normal((n, *shape), dtype=np.float32)
        out[layer] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def digests(seed: int, n: int) -> list[str]:
    return [f"{seed:08x}{i:024x}" for i in range(n)]


def cluster_processes() -> dict[str, Any]:
    """Every process of the local cluster (this driver's descendants) with RSS and PSS (smaps_rollup)."""
    kinds: dict[str, int] = {}
    pss_by_kind: dict[str, int] = {}
    rss = pss = count = 0
    for pid in descendants():
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


def predict_cold_warm(address: str, store: str, products: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Predict latency over HTTP: first request of a product no replica holds, then again (warm)."""
    import httpx
    import numpy as np

    from hetmm_ray.data.synthetic import SyntheticProduct

    body = png_bytes(SyntheticProduct(seed=1, size=args.image_size).good(999))
    cold, warm = [], []
    with served(
        leave="serve",  # the cluster is this benchmark's own: it shuts it down
        store=store,
        port=free_port(),
        address=address,
        args={"template_hosts": args.hosts, "max_products_per_replica": 4},
        deployments={
            "Detector": {"num_replicas": args.replicas, "ray_actor_options": {"num_cpus": 0.25}},
            "Ingress": {"ray_actor_options": {"num_cpus": 0.1}},
        },
    ) as running:
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
    return {
        "cold_ms": [1000 * t for t in cold],
        "warm_ms": [1000 * t for t in warm],
        "cold_p50_ms": 1000 * float(np.percentile(cold, 50)),
        "cold_p99_ms": 1000 * float(np.percentile(cold, 99)),
        "warm_p50_ms": 1000 * float(np.percentile(warm, 50)),
        "warm_p99_ms": 1000 * float(np.percentile(warm, 99)),
    }


def scale(args: argparse.Namespace) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
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
    headers = ["products", "processes", "actor/agent procs", "idle task workers", "PSS MiB", "PSS w/o idle MiB"]
    headers += ["RSS MiB", "own KiB/product", "PSS w/o idle KiB/added", "PSS KiB/added", "creates/min"]
    print(table(headers, rows))
    if "hot_update_s" in results:
        print(
            f"hot update (median of {len(results['hot_update_s'])}): {statistics.median(results['hot_update_s']):.2f} s"
        )


# --- candidate-memory ------------------------------------------------------------------------------------------
CANDIDATE_PRODUCT = "cand-memory"
MIB = 1 << 20


def candidate_bank(n: int, seed: int, image_size: int) -> dict[str, Any]:
    import torch

    return {k: torch.from_numpy(v) for k, v in features(n, seed, image_size).items()}


def template_set(feats: dict[str, Any], config: Any, seed: int) -> Any:
    from hetmm_ray.core.templates import TemplateSet

    n = next(iter(feats.values())).shape[0]
    names = tuple(f"{seed:06x}{i:026x}" for i in range(n))
    return TemplateSet(bank=feats, config=config, weights_id="random:seed=0", image_digests=names)


def holdings(registry: Any) -> dict[str, Any]:
    import ray

    hosts = ray.get(registry.host_holdings.remote())
    sets: dict[tuple[int, bool], int] = {}
    layers: dict[tuple[int, bool], int] = {}
    for h in hosts:
        for row in h["sets"]:
            key = (row["version"], row["candidate"])
            sets[key] = sets.get(key, 0) + row["bytes"]
            layers[key] = layers.get(key, 0) + len(row["layers"])
    return {
        "sets": sets,
        "layers": layers,
        "bytes": sum(sets.values()),
        "rss": sum(h["rss_bytes"] or 0 for h in hosts),
        "loads": sum(h["loads"] for h in hosts),
    }


def wait_for(registry: Any, check: Any, within: float = 300.0) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        snap = holdings(registry)
        if check(snap) or time.monotonic() > deadline:
            return snap
        time.sleep(0.5)


def candidate_memory(args: argparse.Namespace) -> None:
    import ray
    import torch

    from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
    from hetmm_ray.distributed import get_registry
    from hetmm_ray.distributed.runtime import connect
    from hetmm_ray.store import open_store

    connect(num_cpus=2)
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=args.image_size),
        templates=TemplateConfig(kind="all"),
        threshold=ThresholdConfig(folds=2),
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        uri = str(Path(tmp) / "store")
        store = open_store(uri)
        head = candidate_bank(args.images, 0, args.image_size)
        store.put(CANDIDATE_PRODUCT, template_set(head, config, 0))
        registry = get_registry(uri, placement={"hosts": args.hosts})
        ray.get(registry.set_poll.remote(0.5))
        ray.get(registry.shard_handles.remote(CANDIDATE_PRODUCT))
        grown = {k: torch.cat([v, candidate_bank(args.extra, 1, args.image_size)[k]]) for k, v in head.items()}

        def step(name: str, snap: dict[str, Any]) -> None:
            sets = ", ".join(f"v{v}{' cand' if c else ''}: {b / MIB:.1f}" for (v, c), b in sorted(snap["sets"].items()))
            rows.append([name, sets, f"{snap['bytes'] / MIB:.1f}", f"{snap['rss'] / MIB:.0f}", snap["loads"]])

        time.sleep(2.0)  # let the host settle after the first load
        step("head loaded", before := holdings(registry))
        steps = [*((2 + i, "discard") for i in range(args.discards)), (2 + args.discards, "promote")]
        for version, end in steps:
            store.put(
                CANDIDATE_PRODUCT,
                template_set(grown, config, 0),
                expect_head=store.head(CANDIDATE_PRODUCT),
                candidate=True,
            )
            loaded = wait_for(registry, lambda s, v=version: s["layers"].get((v, True)) == len(RESNET18))
            step(f"candidate v{version} (store poll)", loaded)
            if end == "discard":
                ray.get(registry.discard.remote(CANDIDATE_PRODUCT, version))
                time.sleep(2.0)  # the drop is fire-and-forget: let the host free it
                after = wait_for(registry, lambda s, v=version: (v, True) not in s["sets"])
                step(f"v{version} discarded", after)
            else:
                ray.get(registry.promote.remote(CANDIDATE_PRODUCT, version))
                step(f"v{version} promoted", wait_for(registry, lambda s, v=version: (v, False) in s["sets"]))
        ray.kill(registry)
    print(f"product: {args.images} images (+{args.extra} in a candidate) at {args.image_size} px, {args.hosts} host(s)")
    print(table(["step", "held per set (MiB)", "held (MiB)", "host RSS (MiB)", "shard loads"], rows))
    change = (after["bytes"] - before["bytes"]) / max(1, before["bytes"])
    rss = (after["rss"] - before["rss"]) / max(1, before["rss"])
    print(f"after the last discard vs before: held {change:+.1%}, host RSS {rss:+.1%}")


# --- tiled-create ----------------------------------------------------------------------------------------------
def tiled_frames(args: argparse.Namespace) -> list[bytes]:
    """``--frames`` synthetic surface frames of ``--size`` px as PNG bytes (the same on every run)."""
    from hetmm_ray.data.surface import write_surface_layout

    root = Path(tempfile.mkdtemp(prefix="bench-tiled-"))
    write_surface_layout(
        root, height=args.size, width=args.size, n_train=args.frames, n_test_good=0, n_test_per_defect=0, masks=False
    )
    return [f.read_bytes() for f in sorted((root / "train" / "good").glob("*.png"))]


def tiled_config(args: argparse.Namespace, images: list[bytes]) -> Any:
    """The product's configuration as the create job resolves it (``geometry_rule.choose_geometry``)."""
    from hetmm_ray.config import DetectorConfig
    from hetmm_ray.detection.geometry_rule import choose_geometry

    tiles: Any = "auto" if args.tiles == "auto" else [int(v) for v in args.tiles.lower().split("x")]
    changes: dict[str, Any] = {
        "backbone.name": args.backbone,
        "backbone.weights": args.weights,
        "backbone.image_size": args.image_size,
        "geometry.tiles": tiles,
        "device": "cpu",
    }
    for key, value in (("templates.kind", args.kind), ("templates.sheets", args.sheets)):
        if value is not None:
            changes[key] = value
    choice = choose_geometry(DetectorConfig().replace(**changes), images)
    if not choice.config.geometry.tiled:
        raise SystemExit(f"tiled-create: {args.tiles} tiles at {args.size} px resolve to one canvas; choose others")
    return choice.config


def tiled_run(config: Any, images: list[bytes], task_cpus: float) -> tuple[dict[str, float], Any, list[str]]:
    """One tiled create's feature tasks (``task_cpus`` each), then its position fit tasks and their join:
    seconds of the features, of the fit and in all, the template set, and the node each feature batch
    ran on."""

    from hetmm_ray.distributed.extract import extract_tiles_ray
    from hetmm_ray.distributed.position_fit import fit_tiles_ray, tiles_fitted

    start = time.perf_counter()
    batches = extract_tiles_ray(config, images, num_cpus=task_cpus)
    extracted = time.perf_counter()
    ts = tiles_fitted(config, fit_tiles_ray(config, batches, images[0], num_cpus=task_cpus).results())
    done = time.perf_counter()
    return {"features_s": extracted - start, "fit_s": done - extracted, "total_s": done - start}, ts, batches.nodes


def same_product(a: Any, b: Any) -> bool:
    import torch

    return (
        a.image_digests == b.image_digests
        and a.calibration == b.calibration
        and a.meta["tiles"]["scales"] == b.meta["tiles"]["scales"]
        and set(a.bank) == set(b.bank)
        and all(torch.equal(a.bank[k], b.bank[k]) and torch.equal(a.templates(k), b.templates(k)) for k in a.bank)
    )


def tiled_create(args: argparse.Namespace) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from hetmm_ray.config import TASK_CPUS
    from hetmm_ray.detection.interface import frames_per_pass
    from hetmm_ray.distributed import connect, shutdown_ray
    from hetmm_ray.distributed.extract import frames_per_batch

    images = tiled_frames(args)
    config = tiled_config(args, images)
    grid = list(config.geometry.tiles)
    print(
        f"{len(images)} frames of {args.size} px, tiles {grid[0]} x {grid[1]}, {config.backbone.name} "
        f"({config.backbone.weights}) at {config.backbone.image_size} px, {config.templates.kind} "
        f"{config.templates.sheets} sheets, {frames_per_pass(config)} frames per backbone pass; "
        f"{os.cpu_count()} cores on this machine",
        flush=True,
    )
    results: dict[str, Any] = {"args": vars(args), "cpu_count": os.cpu_count(), "tiles": grid, "clusters": []}
    first: Any = None
    try:
        for nodes in args.nodes:
            cluster = Cluster(
                initialize_head=True, head_node_args={"num_cpus": args.cpus_per_node, "include_dashboard": False}
            )
            for _ in range(1, nodes):
                cluster.add_node(num_cpus=args.cpus_per_node)
            cluster.wait_for_nodes()
            connect(cluster.address)
            try:
                task_cpus = TASK_CPUS if args.task_cpus is None else args.task_cpus
                slots = max(1, int(nodes * args.cpus_per_node / task_cpus))
                warm = (images * slots)[: max(2, slots * frames_per_pass(config))]
                tiled_run(config, warm, task_cpus)  # every node's workers started, their backbones built
                per_task = frames_per_batch(len(images), frames_per_pass(config), task_cpus)
                print(f"  {nodes} node(s): {per_task} frames per feature task", flush=True)
                runs, same, spread = [], True, Counter()
                for _ in range(args.runs):
                    times, ts, where = tiled_run(config, images, task_cpus)
                    runs.append(times)
                    spread.update(where)
                    first = ts if first is None else first
                    same = same and same_product(ts, first)
                    print(
                        f"  {nodes} node(s) x {args.cpus_per_node} CPU: features {times['features_s']:.1f} s, "
                        f"fit {times['fit_s']:.1f} s, total {times['total_s']:.1f} s",
                        flush=True,
                    )
                alive = len([n for n in ray.nodes() if n["Alive"]])
            finally:
                shutdown_ray()
                cluster.shutdown()
            median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            results["clusters"].append(
                {
                    "nodes": nodes,
                    "alive_nodes": alive,
                    "cpus_per_node": args.cpus_per_node,
                    "frames_per_feature_task": per_task,
                    "runs": runs,
                    "median": median,
                    "batches_per_node": sorted(spread.values()),
                    "same_product_as_first": same,
                }
            )
    finally:
        base = results["clusters"][0]["median"]["total_s"] if results["clusters"] else None
        for c in results["clusters"]:
            c["ratio_to_first"] = c["median"]["total_s"] / base if base else None
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
    rows = [
        [
            f"{c['nodes']} x {c['cpus_per_node']}",
            f"{c['median']['features_s']:.1f}",
            f"{c['median']['fit_s']:.1f}",
            f"{c['median']['total_s']:.1f}",
            f"{c['ratio_to_first']:.2f}",
            " / ".join(str(n) for n in c["batches_per_node"]),
            "yes" if c["same_product_as_first"] else "NO",
        ]
        for c in results["clusters"]
    ]
    print()
    print(f"tiled create, median of {args.runs} run(s) per cluster, {os.cpu_count()} cores shared with other work")
    headers = ["nodes x CPUs", "features s", "fit s", "total s", "total / first", "batches per node", "same product"]
    print(table(headers, rows))


COMMANDS = {
    "autoscale": autoscale,
    "one-machine": one_machine,
    "replicas": replicas,
    "scale": scale,
    "candidate-memory": candidate_memory,
    "tiled-create": tiled_create,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("autoscale", help="replicas and p50/p99 over time under a load profile")
    p.add_argument("--ray-cpus", type=int, default=8)
    p.add_argument("--backbone", default="mobilenet_v2")
    p.add_argument("--clients", type=int, default=12)
    p.add_argument("--images", type=int, default=4, help="images per request of the heavy phase")
    p.add_argument("--idle-s", type=float, default=10.0)
    p.add_argument("--heavy-s", type=float, default=90.0)
    p.add_argument("--light-max-s", type=float, default=240.0)
    p.add_argument("--window-s", type=float, default=5.0, help="latency percentiles over this window")
    p.add_argument("--upscale-delay-s", type=float, default=2.0)
    p.add_argument("--downscale-delay-s", type=float, default=10.0)
    p.add_argument("--look-back-s", type=float, default=4.0)
    p.add_argument("--out", default=str(REPO / "out" / "autoscale"), help="path stem of the .csv and .png")
    p = sub.add_parser("one-machine", help="hetmm serve's Detector on one machine against the alternatives")
    p.add_argument("--backbone", default="mobilenet_v2")
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    p.add_argument("--requests", type=int, default=120, help="requests per run")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--layouts", nargs="+", default=LAYOUTS)
    p = sub.add_parser("replicas", help="a product's cold load, and one hot product's spread")
    p.add_argument("--cold", action="store_true")
    p.add_argument("--spread", action="store_true")
    p.add_argument("--sheets", nargs="+", type=int, default=[60, 209])
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--requests", type=int, default=160)
    p.add_argument("--json", help="write the tables here")
    p = sub.add_parser("scale", help="growing the number of products on a multi-node cluster")
    p.add_argument("--products", nargs="+", type=int, default=[10, 100, 1000])
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--cpus-per-node", type=int, default=1)
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--images", type=int, default=6, help="good images per product")
    p.add_argument("--kind", default="pts_o")
    p.add_argument("--sheets", type=int, default=2)
    p.add_argument("--create-concurrency", type=int, default=4)
    p.add_argument("--updates", type=int, default=5)
    p.add_argument("--serve", action="store_true", help="also measure cold vs warm predict over HTTP")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--cold-samples", type=int, default=10)
    p.add_argument("--json", help="write the measurements here")
    p = sub.add_parser("candidate-memory", help="a candidate's bytes and host RSS, loaded, discarded, promoted")
    p.add_argument("--images", type=int, default=400)
    p.add_argument("--extra", type=int, default=100)
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--hosts", type=int, default=1)
    p.add_argument("--discards", type=int, default=2, help="candidates loaded and discarded before the promoted one")
    p = sub.add_parser("tiled-create", help="a tiled product's create on 1 node, then 2 (1 CPU each), same frames")
    p.add_argument("--frames", type=int, default=32)
    p.add_argument("--size", type=int, default=1024, help="frame side, px")
    p.add_argument("--tiles", default="2x2", help="RxC or auto")
    p.add_argument("--backbone", default="efficientnet_lite0")
    p.add_argument("--weights", default="random")
    p.add_argument("--image-size", type=int, default=256)
    p.add_argument("--kind", default=None, help="templates.kind (default: the product default)")
    p.add_argument("--sheets", type=int, default=None, help="templates.sheets (default: the product default)")
    p.add_argument("--nodes", nargs="+", type=int, default=[1, 2], help="cluster sizes, in order")
    p.add_argument("--cpus-per-node", type=int, default=1)
    p.add_argument(
        "--task-cpus", type=float, default=None,
        help="CPUs each feature task asks (default config.TASK_CPUS; 1 on a machine with as many cores as node CPUs)",
    )  # fmt: skip
    p.add_argument("--runs", type=int, default=1, help="timed runs per cluster (the median is reported)")
    p.add_argument("--json", help="write the measurements here")
    args = parser.parse_args()
    COMMANDS[args.command](args)


if __name__ == "__main__":
    main()

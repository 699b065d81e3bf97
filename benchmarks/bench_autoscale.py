"""Autoscaling under a stated load profile: detector replicas and p50/p99 latency over time, as a PNG.

Starts the service of deploy.yaml on a local Ray with more logical CPUs than cores (``--ray-cpus``,
8: the Detector asks 0.5 CPU, so its max_replicas fit), the Detector with deploy.yaml's options
(min/max replicas, target_ongoing_requests, the images-in-flight policy of serve/autoscaling.py) and
shortened delays (``--upscale-delay-s`` 2, ``--downscale-delay-s`` 10, ``--look-back-s`` 4; the
replicas and handles push their metrics every second), publishes one product (bench_serve.py's: 60
sheets, random weights) and drives:

1. ``--idle-s`` seconds of nothing;
2. ``--heavy-s`` seconds of ``--clients`` closed-loop clients, each sending ``--images``-image
   multipart predicts;
3. one client sending one-image predicts one after another until one replica is left (at most
   ``--light-max-s``), then ``--idle-s`` seconds more.

Every second it samples the Detector's running replicas (``serve.status()``); every answer is kept
with its start, latency and status. Writes ``out/autoscale.csv`` (one row per second: replicas,
requests answered, failed, p50 and p99 ms of the requests started in that window of ``--window-s``)
and ``out/autoscale.png`` (replicas above, p50/p99 below; drawn with Pillow), and prints the summary:
the largest replica count, when >= 3 and back to 1 were reached, and the failed requests.

    python benchmarks/bench_autoscale.py                       # the profile above
    python benchmarks/bench_autoscale.py --heavy-s 20 --clients 4 --images 2 --light-max-s 60   # a quick look
"""

from __future__ import annotations

import argparse
import csv
import itertools
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hetmm_ray  # noqa: F401, I001 - first, as in the service: it sets the OpenMP wait policy before torch loads
from common import free_port

OUT = Path(__file__).resolve().parents[1] / "out"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ray-cpus", type=int, default=8)
    parser.add_argument("--backbone", default="mobilenet_v2")
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--images", type=int, default=4, help="images per request of the heavy phase")
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--heavy-s", type=float, default=90.0)
    parser.add_argument("--light-max-s", type=float, default=240.0)
    parser.add_argument("--window-s", type=float, default=5.0, help="latency percentiles over this window")
    parser.add_argument("--upscale-delay-s", type=float, default=2.0)
    parser.add_argument("--downscale-delay-s", type=float, default=10.0)
    parser.add_argument("--look-back-s", type=float, default=4.0)
    parser.add_argument("--out", default=str(OUT / "autoscale"), help="path stem of the .csv and .png")
    args = parser.parse_args()

    import yaml
    from bench_serve import body_png, publish
    from ray import serve

    from hetmm_ray.distributed import shutdown_ray
    from hetmm_ray.serve.app import DEPLOY_YAML
    from hetmm_ray.serve.run import start_service, stop_service

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
    # the service's own embedded Ray (distributed.runtime.connect), with more logical CPUs than cores
    running = start_service(
        store=store,
        port=free_port(),
        num_cpus=args.ray_cpus,
        deployments={"Detector": {"autoscaling_config": autoscaling}},
    )
    samples: list[tuple[float, int]] = []
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
        stop_service(running)
        serve.shutdown()
        shutdown_ray()

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


if __name__ == "__main__":
    main()

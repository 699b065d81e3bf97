"""What Ray Serve itself costs per request on this machine: the floor under bench_serve.py's HTTP figures.

The service's HTTP path (bench_serve.py) spends CPU on scoring plus everything around it: the
client, Serve's HTTP proxy, the ingress replica, the Ray hop to the detector replica, and Ray's
own processes (raylet, GCS, controller, agents). This measures the second part alone, with no
scoring: a minimal application of the same shape (proxy -> FastAPI ingress that reads the body
-> handle call carrying a 256x256x3 image -> a deployment that answers at once), driven with the
same bodies at the same concurrency, and the CPU seconds of every process on the machine over
the run (``/proc``), per request.

Against the in-process CPU per image (``HETMM.predict``, measured in the same run) this bounds
what any Serve design of this shape can reach here: on ``C`` cores the HTTP path can deliver at
most ``in_process_cpu / (in_process_cpu + floor_cpu)`` of the in-process images/s, before any
cost of its own.

    python benchmarks/bench_serve_floor.py                                    # the service's settings
    RAY_SERVE_USE_GRPC_BY_DEFAULT=0 python benchmarks/bench_serve_floor.py    # Ray Serve's defaults
    RAY_SERVE_THROUGHPUT_OPTIMIZED=1 RAY_SERVE_ENABLE_DIRECT_INGRESS=0 python benchmarks/bench_serve_floor.py

The Ray it starts has the service's Serve settings (``config.SERVE_ENVIRONMENT``) unless the
environment says otherwise.
"""

# No `from __future__ import annotations`: FastAPI must see the real `Request` type on the route.
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hetmm_ray  # noqa: F401, I001 - first, as in the service: it sets the OpenMP wait policy before torch loads
from common import free_port, post_images, table

_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu() -> dict[int, tuple[float, str]]:
    """pid -> (user + system CPU seconds, command line) of every process readable in /proc."""
    out: dict[int, tuple[float, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            fields = stat[stat.rfind(")") + 2 :].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            out[int(entry)] = ((int(fields[11]) + int(fields[12])) / _TICK, cmd)
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not ours to read
    return out


GROUPS = (
    ("HTTP proxy", ("ProxyActor",)),
    ("ingress replica", ("Front", "Ingress")),
    ("model replica", ("Sink", "Detector")),
    ("Serve controller", ("ServeController",)),
    ("raylet, GCS, agents, log monitor", ("raylet", "gcs_server", "Agent", "log_monitor", "dashboard")),
)


def group_of(cmd: str) -> str:
    for name, tags in GROUPS:
        if any(t in cmd for t in tags):
            return name
    return "other"


def cpu_by_group(before: dict, after: dict, me: int) -> dict[str, float]:
    spent: dict[str, float] = {}
    for pid, (cpu, cmd) in after.items():
        if pid in before and pid != me:
            spent[group_of(cmd)] = spent.get(group_of(cmd), 0.0) + cpu - before[pid][0]
    return spent


def floor_app():
    """proxy -> FastAPI ingress (reads the body) -> handle call with a 256x256x3 image -> instant answer."""
    import numpy as np
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from ray import serve

    app = FastAPI()

    @serve.deployment(name="Sink", ray_actor_options={"num_cpus": 0.5})
    class Sink:
        async def predict(self, images: list) -> list[dict]:
            return [{"score": float(im[0, 0, 0]), "timing": {}} for im in images]

    @serve.deployment(name="Front", ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=1024)
    @serve.ingress(app)
    class Front:
        def __init__(self, sink) -> None:
            # as the service's ingress: by value over gRPC under the service's settings
            by_value = os.environ.get("RAY_SERVE_USE_GRPC_BY_DEFAULT") == "1"
            self.sink = sink.options(_by_reference=not by_value)
            self.image = np.zeros((256, 256, 3), np.uint8)  # what the service ships after resizing

        @app.post("/v1/products/{product}/predict")
        async def predict(self, product: str, request: Request) -> JSONResponse:
            body = await request.body()
            image = self.image.copy()
            image[0, 0, 0] = body[0]
            results = await self.sink.options(multiplexed_model_id=product).predict.remote([image])
            return JSONResponse({"product": product, **results[0]})

    return Front.bind(Sink.bind())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--inproc-images", type=int, default=24)
    args = parser.parse_args()

    import ray
    from bench_serve import body_png, publish
    from ray import serve

    from hetmm_ray.detector import HETMM
    from hetmm_ray.distributed.runtime import serve_environment
    from hetmm_ray.store import open_store

    body, source = body_png()
    # in-process CPU per image: what scoring costs when nothing surrounds it
    store = tempfile.mkdtemp(prefix="bench-floor-")
    det = HETMM.load(open_store(store), publish(store, "mobilenet_v2", "auto"))
    images = [body] * args.inproc_images
    det.predict(images[:8])
    inproc_cpu, inproc_rate = [], []
    for _ in range(args.runs):
        c0, t0 = time.process_time(), time.perf_counter()
        det.predict(images)
        inproc_cpu.append(1000 * (time.process_time() - c0) / len(images))
        inproc_rate.append(len(images) / (time.perf_counter() - t0))
    in_ms, in_rate = statistics.median(inproc_cpu), statistics.median(inproc_rate)

    port = free_port()
    serve_environment()  # as the service's own local Ray (values already in the environment win)
    ray.init(include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(floor_app(), name="floor", route_prefix="/")
    url = f"http://127.0.0.1:{port}"
    post_images(url, "p", body, args.concurrency, 4 * args.concurrency)  # warm
    per_run: list[dict[str, float]] = []
    rates = []
    me = os.getpid()
    for _ in range(args.runs):
        before, c0 = process_cpu(), time.process_time()
        answered, failures, wall = post_images(url, "p", body, args.concurrency, args.requests)
        after, client = process_cpu(), time.process_time() - c0
        n = len(answered)
        assert failures == 0, f"{failures} requests failed"
        spent = cpu_by_group(before, after, me)
        spent["client (this process)"] = client
        per_run.append({k: 1000 * v / n for k, v in spent.items()})
        rates.append(n / wall)
    serve.shutdown()
    ray.shutdown()

    names = [g for g, _ in GROUPS] + ["other", "client (this process)"]
    rows = [[g, f"{statistics.median(r.get(g, 0.0) for r in per_run):.1f}"] for g in names]
    floor_ms = sum(statistics.median(r.get(g, 0.0) for r in per_run) for g in names)
    rows.append(["all of it", f"{floor_ms:.1f}"])
    knobs = {k: v for k, v in os.environ.items() if k.startswith("RAY_SERVE_")}
    print(
        f"\nServe floor: {source} bodies, concurrency {args.concurrency}, {args.requests} requests per run, "
        f"median of {args.runs} runs; {statistics.median(rates):.0f} requests/s with nothing to score; "
        f"{os.cpu_count()} cores; Serve settings {knobs or 'default'}"
    )
    print(table(["process", "CPU ms per request"], rows))
    cores = os.cpu_count() or 1
    ceiling = in_ms / (in_ms + floor_ms)
    print(
        f"\nin-process: {in_rate:.1f} images/s, {in_ms:.1f} CPU ms per image (decode to verdict, "
        f"{args.inproc_images} images per call)\nceiling of the HTTP path on this machine: "
        f"{in_ms:.1f} / ({in_ms:.1f} + {floor_ms:.1f}) = {100 * ceiling:.0f}% of in-process "
        f"({cores * 1000 / (in_ms + floor_ms):.1f} images/s with every core busy)"
    )


if __name__ == "__main__":
    main()

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

Four paths in one run (issue 25), each driven with the same bodies at the same concurrency:

- ``floor HTTP``: the minimal application above;
- ``floor gRPC``: Serve's gRPC proxy -> a deployment that answers ``hetmm.v1.Inspection/Predict``
  at once (the same 256x256x3 copy, a ``PredictReply``): the shape of the gRPC path, no ingress hop;
- ``service HTTP``: the service's own ``Ingress`` (serve/ingress.py: checks, decode to the product's
  canvas, metrics, the console's ring) in front of a detector that answers at once;
- ``service gRPC``: the service's own gRPC replica (serve/grpc/service.py: checks, decode) with
  its scoring answered at once.

The service rows include decoding the body (in the ingress for HTTP, in the replica for gRPC); the
floor rows do not decode. ``--paths`` picks some.

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
    ("proxy (HTTP and gRPC)", ("ProxyActor",)),
    ("ingress replica", ("Front", "Ingress")),
    ("model replica", ("Sink", "Detector", "Inspection")),
    ("registry", ("ProductRegistry", "TemplateHost")),
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


def floor_grpc_app():
    """gRPC proxy -> a deployment answering hetmm.v1.Inspection/Predict at once (the same image copy)."""
    import numpy as np
    from ray import serve

    from hetmm_ray.serve.grpc import inspection_pb2 as pb

    @serve.deployment(name="GrpcSink", ray_actor_options={"num_cpus": 0.5})
    class GrpcSink:
        def __init__(self) -> None:
            self.image = np.zeros((256, 256, 3), np.uint8)

        async def Predict(self, request, grpc_context):
            image = self.image.copy()
            image[0, 0, 0] = request.images[0].data[0]
            result = pb.Result(name=request.images[0].name, score=float(image[0, 0, 0]))
            return pb.PredictReply(product=request.product, results=[result])

    return GrpcSink.bind()


def _stub_results(images: list, version: int = 1) -> list[dict]:
    """What a detector replica answers, without scoring."""
    timing = {"queue_ms": 0.0, "score_ms": 0.0, "batch_images": len(images), "batch_requests": 1, "replica": "stub"}
    rule = {"threshold_rule": "far", "rule_target": 0.01, "estimated_false_alarm_rate": 0.01}
    return [
        {"score": 0.0, "threshold": 1.0, "is_anomaly": False, **rule, "version": version, "timing": dict(timing)}
        for _ in images
    ]


def service_http_app(store: str):
    """The service's own Ingress in front of a detector that answers at once."""
    import dataclasses

    from ray import serve

    from hetmm_ray.config import ServiceConfig
    from hetmm_ray.serve.ingress import Ingress

    @serve.deployment(name="StubDetector", ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=32)
    class StubDetector:
        async def predict(self, images: list, want_maps: bool = False, map_size: int | None = None) -> list[dict]:
            return _stub_results(images)

    service = dataclasses.asdict(ServiceConfig(store=store, http_host="127.0.0.1"))
    return Ingress.bind(StubDetector.bind(), service)


def service_grpc_app(store: str):
    """The service's own gRPC replica, its scoring answered at once."""
    import dataclasses

    from ray import serve

    from hetmm_ray.config import ServiceConfig
    from hetmm_ray.serve.grpc.service import InspectionDetector

    class StubInspection(InspectionDetector.func_or_class):
        async def score(self, model_id: str, request) -> list[dict]:
            return _stub_results(request.images)

    stub = serve.deployment(StubInspection, name="StubInspection", ray_actor_options={"num_cpus": 0.5})
    service = dataclasses.asdict(ServiceConfig(store=store))
    return stub.bind(store, 4, service)


PATHS = ("floor HTTP", "floor gRPC", "service HTTP", "service gRPC")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--inproc-images", type=int, default=24)
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    args = parser.parse_args()

    import ray
    from bench_serve import body_png, publish
    from ray import serve

    from hetmm_ray.detector import HETMM
    from hetmm_ray.distributed import shutdown_ray
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

    from common import grpc_images

    from hetmm_ray.config import GRPC_APP_NAME, GRPC_SERVICER

    product = "mobilenet_v2"  # published above, for the service paths
    port, grpc_port = free_port(), free_port()
    serve_environment()  # as the service's own local Ray (values already in the environment win)
    ray.init(include_dashboard=False)
    grpc_options = {"port": grpc_port, "grpc_servicer_functions": [GRPC_SERVICER]}
    serve.start(http_options={"host": "127.0.0.1", "port": port}, grpc_options=grpc_options)
    url, target = f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}"
    apps = {
        "floor HTTP": (floor_app, "floor", "/", lambda c, n: post_images(url, "p", body, c, n)),
        "floor gRPC": (
            floor_grpc_app, GRPC_APP_NAME, "/floor-grpc", lambda c, n: grpc_images(target, "p", [body], c, n)
        ),
        "service HTTP": (
            lambda: service_http_app(store), "service", "/", lambda c, n: post_images(url, product, body, c, n)
        ),
        "service gRPC": (
            lambda: service_grpc_app(store), GRPC_APP_NAME, "/service-grpc",
            lambda c, n: grpc_images(target, product, [body], c, n),
        ),
    }  # fmt: skip
    me = os.getpid()
    results: dict[str, tuple[list[dict[str, float]], list[float]]] = {}
    for path in args.paths:
        build, name, prefix, send = apps[path]
        for old in list(serve.status().applications):  # one application at a time: the gRPC proxy
            serve.delete(old)  # routes by application name, HTTP by prefix
        serve.run(build(), name=name, route_prefix=prefix)
        answered, failures, _ = send(args.concurrency, 4 * args.concurrency)  # warm
        assert failures == 0, f"{path}: {failures} warm-up requests failed"
        per_run: list[dict[str, float]] = []
        rates = []
        for _ in range(args.runs):
            before, c0 = process_cpu(), time.process_time()
            answered, failures, wall = send(args.concurrency, args.requests)
            after, client = process_cpu(), time.process_time() - c0
            n = len(answered)
            assert failures == 0, f"{path}: {failures} requests failed"
            spent = cpu_by_group(before, after, me)
            spent["client (this process)"] = client
            per_run.append({k: 1000 * v / n for k, v in spent.items()})
            rates.append(n / wall)
        results[path] = (per_run, rates)
    serve.shutdown()
    shutdown_ray()

    names = [g for g, _ in GROUPS] + ["other", "client (this process)"]
    rows = [[g] + [f"{statistics.median(r.get(g, 0.0) for r in results[p][0]):.1f}" for p in results] for g in names]
    floors = {p: sum(statistics.median(r.get(g, 0.0) for r in results[p][0]) for g in names) for p in results}
    rows.append(["all of it"] + [f"{floors[p]:.1f}" for p in results])
    rows.append(["requests/s"] + [f"{statistics.median(results[p][1]):.0f}" for p in results])
    knobs = {k: v for k, v in os.environ.items() if k.startswith("RAY_SERVE_")}
    print(
        f"\nServe floor: {source} bodies, concurrency {args.concurrency}, {args.requests} requests per run, "
        f"median of {args.runs} runs; nothing scored; {os.cpu_count()} cores; Serve settings {knobs or 'default'}"
    )
    print(table(["process: CPU ms per request", *results], rows))
    cores = os.cpu_count() or 1
    print(
        f"\nin-process: {in_rate:.1f} images/s, {in_ms:.1f} CPU ms per image (decode to verdict, "
        f"{args.inproc_images} images per call)"
    )
    for path, floor_ms in floors.items():
        ceiling = in_ms / (in_ms + floor_ms)
        print(
            f"ceiling of {path} on this machine: {in_ms:.1f} / ({in_ms:.1f} + {floor_ms:.1f}) = "
            f"{100 * ceiling:.0f}% of in-process ({cores * 1000 / (in_ms + floor_ms):.1f} images/s, every core busy)"
        )
    if "floor HTTP" in floors and "floor gRPC" in floors:
        print(f"floor gRPC / floor HTTP: {floors['floor gRPC'] / floors['floor HTTP']:.2f}")


if __name__ == "__main__":
    main()

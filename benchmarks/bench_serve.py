"""The service under load: images/s and CPU per image over HTTP and gRPC against in-process, and where
the CPU goes. One command per question; each starts deploy.yaml's service on a local Ray
(``common.served``) unless it says otherwise.

``paths`` (the default command): HTTP and gRPC throughput vs in-process, in one run. Publishes one
product per backbone with 60 template sheets (ALL of 60 synthetic good images; random weights: speed
does not depend on them), then, for each backbone:

- in-process: ``load_detector(...).predict`` of ``--inproc-images`` copies of the body per call, calls
  repeated for ``--inproc-seconds`` (default ``--seconds``) per run (batch 8, the detector's own
  decode/prefetch pipeline, this process's torch threads);
- over HTTP: ``POST /v1/products/{p}/predict`` with one PNG body per request from ``concurrency``
  client threads, the detector replica running as many torch threads as the in-process run
  (``user_config.threads``), greedy batching (replica.py / serve/greedy.py);
- over gRPC: hetmm.v1.Inspection ``Predict`` with the same body at the same concurrencies, to the gRPC
  application's detector replica (same settings, no ingress hop);
- ``--multi-images`` (8) images per request (HTTP multipart, and one gRPC ``Predict``) from
  ``--multi-concurrency`` (2) clients: is a request of several images amortised as it should be.

The shares of in-process are of the same run's in-process figure: the mean of the in-process rates
measured before the service starts and again after it stops (this machine's speed drifts by a few per
cent over the minutes a run takes). ``--no-grpc``: HTTP only. Each cell is the median of ``--runs``
runs; the timing split is the median over the responses' ``timing`` (ingress decode+resize, Ray
transfer, queue, score, images per batch). ``CPU ms/image`` is what a row cost per image in CPU time
(in-process: this process's; a service path: every process of the local Ray this run started plus the
client threads'; with ``--address`` the client's alone). On C busy cores a path delivers at most
``C * 1000 / (CPU ms/image)`` images/s. ``--by-process`` also prints that column by process group
(``common.GROUPS``) and, first, what the service costs idle (``--idle-s`` seconds, CPU ms per second).

``floor``: what Ray Serve itself costs per request, with no scoring (the floor under ``paths``' HTTP
figures). Four paths, each driven with the same bodies at ``--concurrency``, CPU seconds of every
process on the machine per request (``/proc``): ``floor HTTP`` (proxy -> FastAPI ingress that reads
the body -> handle call carrying a 256x256x3 image -> a deployment that answers at once), ``floor
gRPC`` (Serve's gRPC proxy -> a deployment answering ``Predict`` at once), ``service HTTP`` (the
service's own ``Ingress`` in front of a detector that answers at once) and ``service gRPC`` (the
service's own gRPC replica, scoring answered at once); the service rows include decoding the body.
Against the in-process CPU per image (same run) this bounds what any Serve design of this shape can
reach here: ``in_process_cpu / (in_process_cpu + floor_cpu)`` of the in-process images/s. The Ray it
starts has the service's Serve settings (``config.SERVE_ENVIRONMENT``) unless the environment says
otherwise.

``interleaved``: the two bar rows (gRPC 1 image x 8 clients: 80 %; HTTP 8 images x 2 clients: 85 %)
against an in-process run measured seconds before each, ``--rounds`` times (efficientnet_lite0, 60
sheets, one detector replica per application with this process's torch threads). In-process runs with
every process of the local Ray stopped (SIGSTOP, then SIGCONT; ``--no-freeze`` leaves the idle service
running beside it); each service row about ``--seconds`` long. Prints each round, the median share of
each row and the CPU per image by process group.

``threads grpc8|http2x8``: where a detector replica's CPU goes, thread by thread, under one of the bar
loads: each thread's CPU of the scoring replica and of the HTTP ingress (``/proc/<pid>/task``) over a
run of about ``--seconds``, in CPU ms per image, largest first.

``client``: ``InspectionClient.predict_all`` (``hetmm predict --grpc``) for each (images per request,
requests in flight) pair, alternating, ``--runs`` times, on a folder's images (default: 64 bottle test
PNGs of ../shared; ``--images GLOB`` for others); images/s, median and each run.

``idle``: what a Ray worker process costs doing nothing (no service: a local Ray started as the service
starts its own, ``--actors`` plain actors): each actor's CPU ms per second over ``--seconds``, its
main thread's share and that thread's wake-ups per second (Ray's core worker checks for signals every
10 ms).

The body is a bottle test PNG (900x900) when ../shared is there, else a synthetic 256x256 PNG.

    python benchmarks/bench_serve.py [paths] [--backbones efficientnet_lite0] [--by-process]
    python benchmarks/bench_serve.py floor                                   # the service's settings
    RAY_SERVE_USE_GRPC_BY_DEFAULT=0 python benchmarks/bench_serve.py floor   # Ray Serve's defaults
    python benchmarks/bench_serve.py interleaved [--rounds 5] [--seconds 10] [--no-freeze]
    python benchmarks/bench_serve.py threads grpc8 [--seconds 20]
    python benchmarks/bench_serve.py client [--images GLOB] [--runs 3]
    python benchmarks/bench_serve.py idle [--actors 4] [--seconds 20]
"""

# No `from __future__ import annotations`: FastAPI must see the real `Request` type on floor's route.
import argparse
import glob
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    BOTTLE,
    BSD,
    CLIENT,
    GROUPS,
    SHEETS,
    SPLIT,
    body_png,
    cpu_by_group,
    descendants,
    drive,
    free_port,
    grpc_images,
    idle_cpu,
    png_bytes,
    post_images,
    post_multipart,
    process_cpu,
    publish,
    request_sender,
    served,
    table,
    thread_cpu,
    wait_for_no_descendants,
    with_default_command,
)

from hetmm_ray.detection.detector_choice import load_detector


# --- paths: HTTP and gRPC vs in-process ----------------------------------------------------------------
def in_process(
    store: str, product: str, body: bytes, n: int, runs: int, device: str, seconds: float = 0.0
) -> tuple[float, float]:
    """images/s of ``HETMM.predict`` on ``n`` copies of ``body`` per call, and CPU ms per image (this
    process's; medians of ``runs``). A run makes calls until ``seconds`` have passed (at least one), so
    the baseline is measured over as long as a service row: this host's speed swings by a quarter
    between one-second calls (identical consecutive calls differ that much)."""
    from hetmm_ray.store import open_store

    det = load_detector(open_store(store), product, device=device)
    images = [body] * n
    det.predict(images[:8])
    rates, cpus = zip(*(predict_for(det, images, seconds) for _ in range(runs)), strict=True)
    return statistics.median(rates), statistics.median(cpus)


def predict_for(detector: Any, images: list[bytes], seconds: float) -> tuple[float, float]:
    """One in-process run: ``detector.predict(images)`` repeated until ``seconds`` have passed (at least
    once); images/s and this process's CPU ms per image."""
    done, t0, c0 = 0, time.perf_counter(), time.process_time()
    while done == 0 or time.perf_counter() - t0 < seconds:
        detector.predict(images)
        done += len(images)
    return done / (time.perf_counter() - t0), 1000 * (time.process_time() - c0) / done


def paths(args: argparse.Namespace) -> None:
    import httpx
    import torch  # before hetmm_ray, as this benchmark has always run: torch's own OpenMP wait policy

    inproc_s = args.seconds if args.inproc_seconds is None else args.inproc_seconds
    threads = torch.get_num_threads()
    store = tempfile.mkdtemp(prefix="bench-serve-")
    products = [publish(store, b, args.device) for b in args.backbones]
    body, source = body_png()
    measured = {p: in_process(store, p, body, args.inproc_images, args.runs, args.device, inproc_s) for p in products}
    inproc = {p: rate for p, (rate, _) in measured.items()}
    user = {"threads": threads}  # batching: the ReplicaSettings defaults (greedy)
    rows: list[list[Any]] = []
    by_process: dict[str, dict[str, float]] = {}  # row label -> group -> CPU ms per image
    with served(
        store=store,
        port=free_port(),
        address=args.address,
        deployments={"Detector": {"num_replicas": 1, "user_config": user}},
        grpc_port=None if args.no_grpc else free_port(),
    ) as running:
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
        names = [g for g, _ in GROUPS] + ["other", CLIENT]
        cols = list(by_process)
        lines = [[g] + [f"{by_process[c].get(g, 0.0):.1f}" for c in cols] for g in names]
        lines.append(["all of it"] + [f"{sum(by_process[c].values()):.1f}" for c in cols])
        print("\nCPU ms per image by process (idle: CPU ms per second of an idle service)")
        print(table(["process", *cols], lines))


# --- floor: Serve's own CPU per request, nothing scored ------------------------------------------------
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


def stub_results(images: list, version: int = 1) -> list[dict]:
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
            return stub_results(images)

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
            return stub_results(request.images)

    stub = serve.deployment(StubInspection, name="StubInspection", ray_actor_options={"num_cpus": 0.5})
    service = dataclasses.asdict(ServiceConfig(store=store))
    return stub.bind(store, 4, service)


FLOOR_PATHS = ("floor HTTP", "floor gRPC", "service HTTP", "service gRPC")


def floor(args: argparse.Namespace) -> None:
    import hetmm_ray  # noqa: F401, I001 - first, as in the service: it sets the OpenMP wait policy before torch loads
    import ray
    from ray import serve

    from hetmm_ray.config import GRPC_APP_NAME, GRPC_SERVICER
    from hetmm_ray.distributed import shutdown_ray
    from hetmm_ray.distributed.runtime import serve_environment
    from hetmm_ray.store import open_store

    body, source = body_png()
    # in-process CPU per image: what scoring costs when nothing surrounds it
    store = tempfile.mkdtemp(prefix="bench-floor-")
    det = load_detector(open_store(store), publish(store, "mobilenet_v2", "auto"))
    images = [body] * args.inproc_images
    det.predict(images[:8])
    inproc_cpu, inproc_rate = [], []
    for _ in range(args.runs):
        c0, t0 = time.process_time(), time.perf_counter()
        det.predict(images)
        inproc_cpu.append(1000 * (time.process_time() - c0) / len(images))
        inproc_rate.append(len(images) / (time.perf_counter() - t0))
    in_ms, in_rate = statistics.median(inproc_cpu), statistics.median(inproc_rate)

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
            spent[CLIENT] = client
            per_run.append({k: 1000 * v / n for k, v in spent.items()})
            rates.append(n / wall)
        results[path] = (per_run, rates)
    serve.shutdown()
    shutdown_ray()

    names = [g for g, _ in GROUPS] + ["other", CLIENT]
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


# --- interleaved: the bar rows against an adjacent in-process run ---------------------------------------
BAR_ROWS = (("gRPC", 1, 8), ("HTTP", 8, 2))  # (path, images per request, clients): the two bar rows


@contextmanager
def frozen(pids: set[int]) -> Iterator[None]:
    """Every process of ``pids`` stopped for the block (SIGSTOP), then continued (SIGCONT)."""
    stopped = []
    try:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            except ProcessLookupError:
                continue
        yield
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                continue


def interleaved(args: argparse.Namespace) -> None:
    import torch  # before hetmm_ray, as this benchmark has always run: torch's own OpenMP wait policy

    from hetmm_ray.store import open_store

    store = tempfile.mkdtemp(prefix="bench-interleaved-")
    product = publish(store, "efficientnet_lite0", "auto")
    body, source = body_png()
    detector = load_detector(open_store(store), product, device="auto")
    images = [body] * 24
    detector.predict(images[:8])
    user = {"threads": torch.get_num_threads()}
    shares: dict[str, list[float]] = {f"{p} c{c} x{n}": [] for p, n, c in BAR_ROWS}
    by_group: dict[str, dict[str, list[float]]] = {}  # process group -> row -> CPU ms per image, per round
    print(
        f"efficientnet_lite0, 60 sheets, {source} bodies; "
        f"in-process with the local Ray {'running' if args.no_freeze else 'stopped'}"
    )
    print(
        "| round | in-process images/s (CPU ms/image) | "
        + " | ".join(f"{k} images/s (CPU ms/image), share" for k in shares)
        + " |"
    )
    print("|---|---|" + "---|" * len(shares))
    with served(
        store=store,
        port=free_port(),
        deployments={"Detector": {"num_replicas": 1, "user_config": user}},
        grpc_port=free_port(),
    ) as running:
        senders = {}
        for path, per_request, clients in BAR_ROWS:  # warm-up: every score worker has run at this load
            senders[path] = request_sender(path, per_request, running)
            senders[path](product, body, clients, 4 * clients)
        for round_ in range(1, args.rounds + 1):
            with frozen(set() if args.no_freeze else descendants()):
                rate, cpu = predict_for(detector, images, args.seconds)
            cells = [f"{rate:.2f} ({cpu:.1f})"]
            for (path, per_request, clients), key in zip(BAR_ROWS, shares, strict=True):
                requests = max(2 * clients, int(args.seconds * rate * 0.8 / per_request))
                row = drive(senders[path], product, body, clients, requests, per_request)
                share = 100 * row["rps"] / rate
                shares[key].append(share)
                for k, v in row.items():
                    if k.startswith("cpu:"):
                        by_group.setdefault(k[4:], {}).setdefault(key, []).append(v)
                cells.append(
                    f"{row['rps']:.2f} ({row['cpu_ms']:.1f}), {share:.0f} %"
                    + (f", {row['failures']} failed" if row["failures"] else "")
                )
            print(f"| {round_} | " + " | ".join(cells) + " |", flush=True)
    print("| median | | " + " | ".join(f"{statistics.median(v):.0f} %" for v in shares.values()) + " |")
    print("\nCPU ms per image by process (median over the rounds)")
    print("| process | " + " | ".join(shares) + " |")
    print("|---|" + "---|" * len(shares))
    for group, rows in sorted(by_group.items(), key=lambda g: -sum(statistics.median(v) for v in g[1].values())):
        print(f"| {group} | " + " | ".join(f"{statistics.median(rows.get(k, [0.0])):.1f}" for k in shares) + " |")


# --- threads: a replica's CPU by thread -------------------------------------------------------------------
def threads(args: argparse.Namespace) -> None:
    store = tempfile.mkdtemp(prefix="bench-threads-")
    product = publish(store, "efficientnet_lite0", "auto")
    body, source = body_png()
    with served(
        store=store,
        port=free_port(),
        deployments={"Detector": {"num_replicas": 1, "user_config": {"threads": 2}}},
        grpc_port=free_port(),
    ) as running:
        if args.load == "grpc8":
            per_request, replica = 1, "hetmm-grpc:Detector"

            def send(n: int) -> list:
                return grpc_images(running.grpc_target, product, [body], 8, n)[0]
        else:
            per_request, replica = 8, "hetmm:Detector"

            def send(n: int) -> list:
                return post_multipart(running.url, product, [body] * 8, 2, n)[0]

        send(32)  # warm: the product loaded, every worker thread started
        mine = descendants()
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
    print(f"{args.load}: {images} images in {wall:.1f} s ({images / wall:.1f} images/s), {source} bodies")
    for name in pids:
        spent = sorted(((after[name][t] - before[name].get(t, 0.0), t) for t in after[name]), reverse=True)
        total = sum(s for s, _ in spent)
        top = ", ".join(f"{t}: {1000 * s / max(1, images):.2f}" for s, t in spent[:12] if s > 0)
        print(f"{name}: {1000 * total / max(1, images):.1f} CPU ms per image; by thread id (ms/image): {top}")


# --- client: predict_all's images per request and requests in flight -------------------------------------
CLIENT_PAIRS = [(16, 1), (8, 1), (8, 2), (16, 2)]


def client(args: argparse.Namespace) -> None:
    files = sorted(glob.glob(args.images))[: args.limit]
    if not files:
        sys.exit(f"no images match {args.images} (the bottle set is in ../shared)")
    uploads = [(p, Path(p).read_bytes()) for p in files]

    from hetmm_ray.serve.grpc.client import InspectionClient

    store = tempfile.mkdtemp(prefix="bench-grpc-client-")
    product = publish(store, "efficientnet_lite0", "auto")
    rates: dict[tuple[int, int], list[float]] = {pair: [] for pair in CLIENT_PAIRS}
    with served(
        store=store,
        port=free_port(),
        deployments={"Detector": {"num_replicas": 1, "user_config": {"threads": 2}}},
        grpc_port=free_port(),
    ) as running:
        with InspectionClient(running.grpc_target, timeout=600) as inspection:
            list(inspection.predict_all(product, uploads[:16]))  # warm: the product loaded, threads started
            for _ in range(args.runs):
                for per_request, in_flight in CLIENT_PAIRS:
                    start = time.perf_counter()
                    results = inspection.predict_all(product, uploads, per_request=per_request, in_flight=in_flight)
                    n = sum(1 for _ in results)
                    rates[(per_request, in_flight)].append(n / (time.perf_counter() - start))
    print(f"{len(uploads)} images ({args.images}), {args.runs} runs of each pair, alternating")
    rows = [
        [per, fl, f"{statistics.median(r):.1f}", " / ".join(f"{x:.1f}" for x in r)] for (per, fl), r in rates.items()
    ]
    print(table(["images per request", "in flight", "images/s (median)", "runs"], rows))


# --- idle: a Ray worker process doing nothing ------------------------------------------------------------
def wakeups(pid: int) -> int:
    """Voluntary context switches of the main thread of ``pid`` (each one wake-up after a sleep)."""
    with open(f"/proc/{pid}/task/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))


def idle(args: argparse.Namespace) -> None:
    import ray

    from hetmm_ray.distributed import shutdown_ray
    from hetmm_ray.distributed.runtime import connect

    @ray.remote(num_cpus=0)
    class Idle:
        def pid(self) -> int:
            return os.getpid()

    connect(None)
    try:
        actors = [Idle.remote() for _ in range(args.actors)]
        pids = ray.get([a.pid.remote() for a in actors])
        time.sleep(args.settle_s)
        before = {pid: (thread_cpu(pid), wakeups(pid)) for pid in pids}
        t0 = time.perf_counter()
        threading.Event().wait(args.seconds)
        wall = time.perf_counter() - t0
        after = {pid: (thread_cpu(pid), wakeups(pid)) for pid in pids}
    finally:
        shutdown_ray()

    print(f"{args.actors} idle Ray actors over {wall:.1f} s (CPU ms per second; main thread = the process id)")
    print("| actor pid | all threads | main thread | main thread wake-ups per s | threads |")
    print("|---|---|---|---|---|")
    totals, mains, wakes = [], [], []
    for pid in pids:
        (cpu0, woke0), (cpu1, woke1) = before[pid], after[pid]
        spent = {t: cpu1[t] - cpu0.get(t, 0.0) for t in cpu1}
        total = 1000 * sum(spent.values()) / wall
        main_ms = 1000 * spent.get(pid, 0.0) / wall
        woke = (woke1 - woke0) / wall
        totals.append(total)
        mains.append(main_ms)
        wakes.append(woke)
        print(f"| {pid} | {total:.1f} | {main_ms:.1f} | {woke:.0f} | {len(cpu1)} |")
    print(
        f"| median | {statistics.median(totals):.1f} | {statistics.median(mains):.1f} "
        f"| {statistics.median(wakes):.0f} | |"
    )


# --- raw: a camera's frame as pixels vs as PNG -------------------------------------------------------
def _raw_inputs() -> dict[str, Any]:
    """Frames of a line's cameras from real pixels: bsd_pitting's 1130x460 RGB frame as it is, and
    scaled to 5 MP (2448x2048) as RGB8 and Mono8 (its green plane); the synthetic gear without
    ../shared."""
    import numpy as np
    from PIL import Image

    from hetmm_ray.data.decode import decode_image

    files = sorted((BSD / "test" / "good").glob("*")) if BSD.exists() else []
    if files:
        base, source = decode_image(files[0]), f"bsd_pitting {files[0].name}"
    else:
        from hetmm_ray.data.synthetic import SyntheticProduct

        base, source = SyntheticProduct(seed=39, size=460).good(0), "synthetic gear (no ../shared)"
    big = np.asarray(Image.fromarray(base).resize((2448, 2048), Image.BILINEAR))
    print(f"frames from {source}")
    return {
        f"{base.shape[1]}x{base.shape[0]} RGB8": base,
        "2448x2048 RGB8": big,
        "2448x2048 Mono8": np.ascontiguousarray(big[..., 1]),
    }


def _cpu_ms(fn: Callable[[], object], runs: int, reps: int) -> float:
    """Median over ``runs`` of this process's CPU ms per call of ``fn`` (``reps`` calls a run)."""
    fn()
    per_call = []
    for _ in range(runs):
        c0 = time.process_time()
        for _ in range(reps):
            fn()
        per_call.append(1000 * (time.process_time() - c0) / reps)
    return statistics.median(per_call)


def raw(args: argparse.Namespace) -> None:
    """Bytes on the wire and CPU per frame on both sides, PNG against raw pixels.

    Station: the frame to a serialized ``PredictRequest`` (PNG: Pillow's encoder at its default
    level, what ``png_bytes`` and most stations use; raw: ``raw_frame_of``, no encoding). Replica:
    the serialized request parsed and the frame made the canvas the product scores
    (``decode_to_canvas`` with one thread, as under load; 256 px squash, the default product's).
    Each side is the code the service and the station run, in this one process, one thread."""
    import torch

    from hetmm_ray.data.raw_frame import raw_frame_of
    from hetmm_ray.serve.canvas import decode_to_canvas
    from hetmm_ray.serve.grpc import inspection_pb2 as pb
    from hetmm_ray.serve.grpc.messages import image_message, upload_of

    torch.set_num_threads(1)
    canvas = (256, "squash")
    rows = []
    for name, array in _raw_inputs().items():
        encodings = {
            "PNG": lambda a=array: image_message("f", png_bytes(a)),
            "raw": lambda a=array: image_message("f", raw_frame_of(a)),
        }
        for path, encode in encodings.items():

            def station(encode: Callable[[], Any] = encode) -> bytes:
                return pb.PredictRequest(product="p", images=[encode()]).SerializeToString()

            wire = station()

            def replica(wire: bytes = wire) -> Any:
                request = pb.PredictRequest.FromString(wire)
                return decode_to_canvas([("f", upload_of(request.images[0]))], canvas, busy=True)

            rows.append(
                [
                    name,
                    path,
                    len(wire) / 2**20,
                    _cpu_ms(station, args.runs, args.reps),
                    _cpu_ms(replica, args.runs, args.reps),
                ]
            )
    base = {r[0]: r for r in rows if r[1] == "PNG"}
    out = [[*r, r[3] / base[r[0]][3], r[4] / base[r[0]][4]] for r in rows]
    print(
        table(
            [
                "frame",
                "sent as",
                "MiB on the wire",
                "station CPU ms",
                "replica CPU ms",
                "station / PNG",
                "replica / PNG",
            ],
            out,
        )
    )


COMMANDS = {
    "paths": paths,
    "raw": raw,
    "floor": floor,
    "interleaved": interleaved,
    "threads": threads,
    "client": client,
    "idle": idle,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("paths", help="HTTP and gRPC vs in-process (the default)")
    p.add_argument("--backbones", nargs="+", default=["mobilenet_v2", "efficientnet_lite0"])
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    p.add_argument("--seconds", type=float, default=10.0, help="target length of one HTTP run (sets its requests)")
    p.add_argument("--inproc-images", type=int, default=24, help="images per in-process predict call")
    p.add_argument(
        "--inproc-seconds", type=float, default=None, help="length of one in-process run (default: --seconds)"
    )
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--device", default="auto")
    p.add_argument("--address", help="Ray cluster to run on (default: a local Ray)")
    p.add_argument("--no-grpc", action="store_true", help="HTTP only (no gRPC application)")
    p.add_argument("--multi-images", type=int, default=8, help="images per request of the multi rows (0: none)")
    p.add_argument("--multi-concurrency", type=int, default=2)
    p.add_argument(
        "--by-process",
        action="store_true",
        help="also print each row's CPU ms per image by process group, and an idle service's CPU (--idle-s)",
    )
    p.add_argument("--idle-s", type=float, default=20.0, help="with --by-process: idle seconds measured")
    p = sub.add_parser("floor", help="Serve's own CPU per request, nothing scored")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--inproc-images", type=int, default=24)
    p.add_argument("--paths", nargs="+", choices=FLOOR_PATHS, default=list(FLOOR_PATHS))
    p = sub.add_parser("interleaved", help="the bar rows against an in-process run seconds before each")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--no-freeze", action="store_true", help="leave the idle service running during in-process")
    p = sub.add_parser("threads", help="a detector replica's CPU by thread under a bar load")
    p.add_argument("load", choices=["grpc8", "http2x8"])
    p.add_argument("--seconds", type=float, default=20.0)
    p = sub.add_parser("client", help="InspectionClient.predict_all: images per request and in flight")
    p.add_argument("--images", default=str(BOTTLE / "test" / "*" / "*.png"), help="a glob of images")
    p.add_argument("--limit", type=int, default=64, help="at most this many of them")
    p.add_argument("--runs", type=int, default=3)
    p = sub.add_parser("raw", help="a camera frame as raw pixels vs as PNG: bytes and CPU on both sides")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--reps", type=int, default=3, help="calls per run")
    p = sub.add_parser("idle", help="what an idle Ray worker process costs")
    p.add_argument("--actors", type=int, default=4)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--settle-s", type=float, default=5.0, help="wait after the actors started")
    args = parser.parse_args(with_default_command(sys.argv[1:], list(COMMANDS), "paths"))
    COMMANDS[args.command](args)


if __name__ == "__main__":
    main()

"""Shared helpers for the benchmark scripts: timing, machine rate, tables, inputs."""

from __future__ import annotations

import os
import socket
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import torch

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
BOTTLE = SHARED / "data" / "mvtec_ad" / "bottle"
MOBILENET_WEIGHTS = SHARED / "weights" / "mobilenet_v2_imagenet.pth"


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of ``pid`` (``/proc/<pid>/task/<tid>/stat``: utime + stime)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return out


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (bound then closed: nothing listens there)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn: Callable[[], object], *, runs: int, device: torch.device, warmup: int = 1) -> float:
    """Median wall time of ``fn`` over ``runs`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_rate(device: torch.device, dtype: torch.dtype = torch.float32, n: int = 2048) -> float:
    """Measured dense matmul FLOP/s: the machine's practical peak for this dtype."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    t = median_time(lambda: a @ b, runs=5, device=device)
    return 2 * n**3 / t


def table(headers: list[str], rows: list[list[object]]) -> str:
    cells = [headers] + [[f"{c:.3g}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (torch {torch.__version__})"
    return f"CPU, {torch.get_num_threads()} threads (torch {torch.__version__})"


def post_images(
    url: str, product: str, body: bytes, concurrency: int, requests: int
) -> tuple[list[tuple[float, dict]], int, float]:
    """``requests`` PNG predicts over HTTP from ``concurrency`` clients (each ``requests //
    concurrency``, at least 1): ``([(seconds, timing)] of the answered ones, failures, wall s)``."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    answered: list[tuple[float, dict]] = []
    failures = 0
    lock = threading.Lock()

    def worker(n: int) -> None:
        nonlocal failures
        with httpx.Client(base_url=url, timeout=600) as client:
            for _ in range(n):
                t0 = time.perf_counter()
                r = client.post(f"/v1/products/{product}/predict", content=body, headers={"content-type": "image/png"})
                with lock:
                    if r.status_code == 200:
                        answered.append((time.perf_counter() - t0, r.json()["timing"]))
                    else:
                        failures += 1

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, [max(1, requests // concurrency)] * concurrency))
    return answered, failures, time.perf_counter() - start


def run_clients(
    call: Callable[[object], tuple[bool, dict]], open_client: Callable[[], object], concurrency: int, requests: int
) -> tuple[list[tuple[float, dict]], int, float]:
    """``requests`` calls from ``concurrency`` threads (each ``requests // concurrency``, at least 1),
    each thread with its own ``open_client()``; ``call(client) -> (ok, timing)``. Returns
    ``([(seconds, timing)] of the answered ones, failures, wall s)`` as :func:`post_images`."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    answered: list[tuple[float, dict]] = []
    failures = 0
    lock = threading.Lock()

    def worker(n: int) -> None:
        nonlocal failures
        client = open_client()
        try:
            for _ in range(n):
                t0 = time.perf_counter()
                ok, timing = call(client)
                with lock:
                    if ok:
                        answered.append((time.perf_counter() - t0, timing))
                    else:
                        failures += 1
        finally:
            client.close()  # type: ignore[attr-defined]

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, [max(1, requests // concurrency)] * concurrency))
    return answered, failures, time.perf_counter() - start


def grpc_images(
    target: str, product: str, bodies: list[bytes], concurrency: int, requests: int
) -> tuple[list[tuple[float, dict]], int, float]:
    """:func:`post_images` over gRPC (hetmm.v1.Inspection ``Predict``), ``bodies`` in each request;
    the timing of the first result, with ``transfer_ms`` = total - decode - queue - score."""
    import grpc

    from hetmm_ray.serve.grpc.client import InspectionClient

    images = [(f"{i}.png", b) for i, b in enumerate(bodies)]

    def call(client: object) -> tuple[bool, dict]:
        try:
            reply = client.predict(product, images)  # type: ignore[attr-defined]
        except grpc.RpcError:
            return False, {}
        t = reply.results[0].timing
        timing = {k: getattr(t, k) for k in ("decode_ms", "queue_ms", "score_ms", "batch_images", "total_ms")}
        timing["transfer_ms"] = max(0.0, t.total_ms - t.decode_ms - t.queue_ms - t.score_ms)
        return True, timing

    return run_clients(call, lambda: InspectionClient(target, timeout=600), concurrency, requests)


def multipart_body(files: list[tuple[str, bytes]], field: str = "images") -> tuple[bytes, str]:
    """``files`` ((filename, PNG bytes)) as one ``multipart/form-data`` body: (body, content type)."""
    boundary = f"hetmm-bench-{uuid.uuid4().hex}"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{name}"\r\n'
        f"Content-Type: image/png\r\n\r\n".encode()
        + data
        + b"\r\n"
        for name, data in files
    ]
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def post_multipart(
    url: str, product: str, bodies: list[bytes], concurrency: int, requests: int
) -> tuple[list[tuple[float, dict]], int, float]:
    """:func:`post_images` with ``bodies`` as one multipart request (several images per request).
    The request body is encoded once and sent as it is by every call, as a line PC sends what it holds
    (httpx's ``files=`` encoded it again on every call: about 1 CPU ms per image of the client's,
    on the same cores as the service)."""
    import httpx

    body, content_type = multipart_body([(f"{i}.png", b) for i, b in enumerate(bodies)])
    headers = {"content-type": content_type}

    def call(client: object) -> tuple[bool, dict]:
        r = client.post(f"/v1/products/{product}/predict", content=body, headers=headers)  # type: ignore[attr-defined]
        return r.status_code == 200, (r.json()["results"][0]["timing"] if r.status_code == 200 else {})

    return run_clients(call, lambda: httpx.Client(base_url=url, timeout=600), concurrency, requests)


def start_service_retrying(*, tries: int = 5, **kwargs: object) -> object:
    """``hetmm_ray.serve.run.start_service(**kwargs)``, tried again (after ``ray.shutdown``) when the
    embedded Ray does not come up: Ray gives its raylet a fixed 30 s to register, which a loaded
    machine can miss ("The current node timed out during startup"); anything else is raised."""

    from hetmm_ray.distributed import shutdown_ray
    from hetmm_ray.serve.run import start_service

    for attempt in range(1, tries + 1):
        try:
            return start_service(**kwargs)  # type: ignore[arg-type]
        except Exception as exc:  # only Ray's start-up timeout is retried
            if "timed out during startup" not in str(exc) or attempt == tries:
                raise
            print(f"Ray did not start ({exc}); try {attempt + 1} of {tries}", flush=True)
            shutdown_ray()
            time.sleep(10.0)
    raise AssertionError("unreachable")

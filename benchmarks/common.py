"""The benchmark harness: everything the scripts in benchmarks/ share, in one module.

- paths of ../shared: ``SHARED``, ``BOTTLE``, ``BATTERY``, ``BSD``, ``MOBILENET_WEIGHTS``;
- timing and reports: :func:`median_time`, :func:`matmul_rate`, :func:`describe`, :func:`table`,
  :func:`with_default_command` (a script's subcommand when none is named);
- CPU from ``/proc``: :func:`thread_cpu`, :func:`process_cpu`, :func:`descendants`, the process
  groups of a local Ray (:data:`GROUPS`, :func:`group_of`, :func:`cpu_by_group`,
  :func:`session_cpu_by_group`), :func:`idle_cpu`, :func:`wait_for_no_descendants`;
- inputs: :func:`png_bytes`, :func:`body_png`, :func:`encoded_images`, :func:`publish` (a product of
  60 sheets), :func:`install_bank` (a random template bank in a detector);
- the service: :func:`served` (deploy.yaml's service for a ``with`` block), :func:`free_port`, and the
  clients (:func:`post_images`, :func:`post_multipart`, :func:`grpc_images`, :func:`request_sender`,
  :func:`drive`);
- archives for ``hetmm inspect``: :func:`archive_images`, :func:`write_images`,
  :func:`fit_archive_product`, :func:`inspect_argv`, :func:`repo_env`, :func:`rows_written`,
  :func:`check_output`, :func:`wait_until`.

Only the standard library loads with this module: torch, Ray and hetmm_ray load inside the functions
that use them. So a script decides what loads first (``import hetmm_ray`` before torch sets the
OpenMP wait policy the service runs with; the benchmarks that always measured without it still do),
and ``device_check.py`` runs where there is torch and no Ray. No script imports another, only this
module and ``plots.py`` (the figures of their ``--json``): a script run as ``python
benchmarks/NAME.py`` imports them as ``common`` and ``plots`` (its folder is on ``sys.path``); the
tests import them as ``benchmarks.common`` and ``benchmarks.plots``.
"""

from __future__ import annotations

import io
import os
import socket
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
BOTTLE = SHARED / "data" / "mvtec_ad" / "bottle"
BATTERY = SHARED / "data" / "battery_weld"
BSD = SHARED / "data" / "bsd_pitting"
MOBILENET_WEIGHTS = SHARED / "weights" / "mobilenet_v2_imagenet.pth"

Sent = tuple[list[tuple[float, dict]], int, float]  # ([(seconds, timing)] of the answered, failures, wall s)


# --- timing and reports ------------------------------------------------------------------------------
def sync(device: Any) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def median_time(fn: Callable[[], object], *, runs: int, device: Any, warmup: int = 1) -> float:
    """Median wall time of ``fn`` over ``runs`` calls after ``warmup`` calls (``device``: a torch device)."""
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


def matmul_rate(device: Any, dtype: Any = None, n: int = 2048) -> float:
    """Measured dense matmul FLOP/s: the machine's practical peak for ``dtype`` (default float32)."""
    import torch

    dtype = dtype or torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    t = median_time(lambda: a @ b, runs=5, device=device)
    return 2 * n**3 / t


def describe(device: Any) -> str:
    import torch

    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (torch {torch.__version__})"
    return f"CPU, {torch.get_num_threads()} threads (torch {torch.__version__})"


def table(headers: list[str], rows: list[list[object]]) -> str:
    """A Markdown table; floats to 3 significant digits."""
    cells = [headers] + [[f"{c:.3g}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def with_default_command(argv: list[str], commands: list[str], default: str) -> list[str]:
    """``argv`` with ``default`` in front when it names none of ``commands`` (nor asks for help): a
    script's command lines from before it had subcommands keep working."""
    if argv and (argv[0] in commands or argv[0] in ("-h", "--help")):
        return argv
    return [default, *argv]


# --- CPU from /proc (Linux) ----------------------------------------------------------------------------
_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of ``pid`` (``/proc/<pid>/task/<tid>/stat``: utime + stime)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / _TICK
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return out


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


def descendants(root: int | None = None) -> set[int]:
    """Pids of the descendants of ``root`` (default: this process; the local Ray it started), from /proc."""
    root = os.getpid() if root is None else root
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    mine, grown = {root}, True
    while grown:
        grown = False
        for pid, pp in parent.items():
            if pp in mine and pid not in mine:
                mine.add(pid)
                grown = True
    return mine - {root}


# The processes of a local Ray with the service, by what their command lines name.
GROUPS = (
    ("proxy (HTTP and gRPC)", ("ProxyActor",)),
    ("ingress replica", ("Front", "Ingress")),
    ("model replica", ("Sink", "Detector", "Inspection")),
    ("registry", ("ProductRegistry", "TemplateHost")),
    ("Serve controller", ("ServeController",)),
    ("raylet, GCS, agents, log monitor", ("raylet", "gcs_server", "Agent", "log_monitor", "dashboard")),
)
CLIENT = "client (this process)"


def group_of(cmd: str) -> str:
    for name, tags in GROUPS:
        if any(t in cmd for t in tags):
            return name
    return "other"


def cpu_by_group(before: dict, after: dict, me: int) -> dict[str, float]:
    """CPU seconds between two :func:`process_cpu` snapshots by group, of every process but ``me``."""
    spent: dict[str, float] = {}
    for pid, (cpu, cmd) in after.items():
        if pid in before and pid != me:
            spent[group_of(cmd)] = spent.get(group_of(cmd), 0.0) + cpu - before[pid][0]
    return spent


def session_cpu_by_group() -> dict[str, float]:
    """CPU seconds of this process (:data:`CLIENT`) and its descendants (the local Ray it started) by group."""
    snap = process_cpu()
    mine = descendants() | {os.getpid()}
    spent: dict[str, float] = {}
    for pid, (cpu, cmd) in snap.items():
        if pid in mine:
            group = CLIENT if pid == os.getpid() else group_of(cmd)
            spent[group] = spent.get(group, 0.0) + cpu
    return spent


def idle_cpu(seconds: float) -> dict[str, float]:
    """CPU ms per second (a thousandth of a core) of each process group of the session over ``seconds``."""
    before = session_cpu_by_group()
    time.sleep(seconds)
    after = session_cpu_by_group()
    return {g: 1000 * (after.get(g, 0.0) - before.get(g, 0.0)) / seconds for g in after}


def wait_for_no_descendants(timeout_s: float) -> None:
    """Until every descendant process has exited (at most ``timeout_s``; then say which are left)."""
    deadline = time.monotonic() + timeout_s
    while (left := descendants()) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        print(f"note: {len(left)} descendant processes still running after {timeout_s:.0f} s", file=sys.stderr)


# --- inputs ----------------------------------------------------------------------------------------------
SHEETS = 60  # the served products' templates per pixel (:func:`publish`)


def png_bytes(array: Any) -> bytes:
    """An RGB array as PNG bytes."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def body_png() -> tuple[bytes, str]:
    """The request body of the service benchmarks: a bottle test PNG (900x900) when ../shared is
    there, else a synthetic 256x256 PNG; and what it is."""
    if BOTTLE.is_dir():
        path = sorted((BOTTLE / "test" / "broken_large").glob("*.png"))[0]
        return path.read_bytes(), "bottle test PNG 900x900"
    from hetmm_ray.data.synthetic import SyntheticProduct

    return png_bytes(SyntheticProduct(seed=1, size=256).good(999)), "synthetic PNG 256x256"


def encoded_images(n: int) -> tuple[list[bytes], str]:
    """``n`` PNGs of 900x900: bottle test images when ../shared is there, else synthetic ones."""
    if BOTTLE.is_dir():
        paths = sorted((BOTTLE / "test").rglob("*.png"))[:n]
        return [p.read_bytes() for p in paths], "bottle test PNGs (900x900)"
    from hetmm_ray.data.synthetic import SyntheticProduct

    product = SyntheticProduct(seed=0, size=900)
    return [png_bytes(product.good(i)) for i in range(n)], "synthetic PNGs (900x900)"


def publish(store: str, backbone: str, device: str = "auto") -> str:
    """A product named ``backbone`` with exactly :data:`SHEETS` templates per pixel (ALL of SHEETS
    synthetic good images, random weights: speed does not depend on them), saved to ``store``."""
    from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
    from hetmm_ray.data.synthetic import SyntheticProduct
    from hetmm_ray.detection.detector import HETMM
    from hetmm_ray.store import open_store

    config = DetectorConfig(
        backbone=BackboneConfig(name=backbone, weights="random"),
        templates=TemplateConfig(kind="all"),
        threshold=ThresholdConfig(max_images=10, folds=2),
        device=device,
    )
    gear = SyntheticProduct(seed=0, size=256)
    HETMM(config).fit([gear.good(i) for i in range(SHEETS)]).save(open_store(store), backbone)
    return backbone


def install_bank(det: Any, bank: dict[str, Any], config: Any) -> None:
    """``bank`` (layer -> (K, C, h, w)) installed as ``det``'s templates under ``config``, version 0."""
    from hetmm_ray.core.templates import TemplateSet

    k = next(iter(bank.values())).shape[0]
    ts = TemplateSet(bank=bank, config=config, weights_id="random", image_digests=tuple(map(str, range(k))))
    det.scorer.install(ts, 0, config=det.config)


# --- the service and its clients -----------------------------------------------------------------------
def free_port() -> int:
    """A loopback TCP port that was free a moment ago (bound then closed: nothing listens there)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def served(*, leave: str = "ray", tries: int = 5, **options: Any) -> Iterator[Any]:
    """The service of deploy.yaml for the block: ``hetmm_ray.serve.run.start_service(**options)``'s
    ``RunningService``. Ray's start-up timeout (its raylet has a fixed 30 s to register, which a
    loaded machine can miss: "The current node timed out during startup") is tried again, after
    ``ray.shutdown``, up to ``tries`` times; anything else is raised.

    On the way out the applications and the registry go (``stop_service``), then by ``leave``:
    ``"apps"`` nothing more (Serve keeps its proxies: the next service on the same port reuses them),
    ``"serve"`` Serve stops (Ray stays: a cluster this process started itself), ``"ray"`` this
    process leaves Ray (``leave_ray``: a local Ray it started stops with every Serve process).
    """
    if leave not in ("apps", "serve", "ray"):
        raise ValueError(f"leave must be 'apps', 'serve' or 'ray', got {leave!r}")
    from hetmm_ray.distributed import shutdown_ray
    from hetmm_ray.serve.run import leave_ray, start_service, stop_service

    for attempt in range(1, tries + 1):
        try:
            running = start_service(**options)
            break
        except Exception as exc:  # only Ray's start-up timeout is retried
            if "timed out during startup" not in str(exc) or attempt == tries:
                raise
            print(f"Ray did not start ({exc}); try {attempt + 1} of {tries}", flush=True)
            shutdown_ray()
            time.sleep(10.0)
    try:
        yield running
    finally:
        stop_service(running)
        if leave == "serve":
            from ray import serve

            serve.shutdown()
        elif leave == "ray":
            leave_ray()


def post_images(url: str, product: str, body: bytes, concurrency: int, requests: int) -> Sent:
    """``requests`` PNG predicts over HTTP from ``concurrency`` clients (each ``requests //
    concurrency``, at least 1): ``([(seconds, timing)] of the answered ones, failures, wall s)``."""
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
    call: Callable[[Any], tuple[bool, dict]], open_client: Callable[[], Any], concurrency: int, requests: int
) -> Sent:
    """``requests`` calls from ``concurrency`` threads (each ``requests // concurrency``, at least 1),
    each thread with its own ``open_client()``; ``call(client) -> (ok, timing)``. Returns as
    :func:`post_images`."""
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
            client.close()

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, [max(1, requests // concurrency)] * concurrency))
    return answered, failures, time.perf_counter() - start


def grpc_images(target: str, product: str, bodies: list[bytes], concurrency: int, requests: int) -> Sent:
    """:func:`post_images` over gRPC (hetmm.v1.Inspection ``Predict``), ``bodies`` in each request;
    the timing of the first result, with ``transfer_ms`` = total - decode - queue - score."""
    import grpc

    from hetmm_ray.serve.grpc.client import InspectionClient

    images = [(f"{i}.png", b) for i, b in enumerate(bodies)]

    def call(client: Any) -> tuple[bool, dict]:
        try:
            reply = client.predict(product, images)
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


def post_multipart(url: str, product: str, bodies: list[bytes], concurrency: int, requests: int) -> Sent:
    """:func:`post_images` with ``bodies`` as one multipart request (several images per request).
    The request body is encoded once and sent as it is by every call, as a line PC sends what it holds
    (httpx's ``files=`` encoded it again on every call: about 1 CPU ms per image of the client's,
    on the same cores as the service)."""
    import httpx

    body, content_type = multipart_body([(f"{i}.png", b) for i, b in enumerate(bodies)])
    headers = {"content-type": content_type}

    def call(client: Any) -> tuple[bool, dict]:
        r = client.post(f"/v1/products/{product}/predict", content=body, headers=headers)
        return r.status_code == 200, (r.json()["results"][0]["timing"] if r.status_code == 200 else {})

    return run_clients(call, lambda: httpx.Client(base_url=url, timeout=600), concurrency, requests)


Sender = Callable[[str, bytes, int, int], Sent]  # (product, body, concurrency, requests)


def request_sender(path: str, per_request: int, running: Any) -> Sender:
    """``send(product, body, concurrency, requests)`` of one path, ``"HTTP"`` or ``"gRPC"``, with
    ``per_request`` copies of the body in each request."""
    if path == "gRPC":
        return lambda p, b, c, n: grpc_images(running.grpc_target, p, [b] * per_request, c, n)
    if per_request > 1:
        return lambda p, b, c, n: post_multipart(running.url, p, [b] * per_request, c, n)
    return lambda p, b, c, n: post_images(running.url, p, b, c, n)


SPLIT = ("decode_ms", "transfer_ms", "queue_ms", "score_ms", "batch_images")


def drive(send: Sender, product: str, body: bytes, concurrency: int, requests: int, per_request: int = 1) -> dict:
    """One run of ``send``: ``rps`` counts images per second (``per_request`` per answered request),
    ``cpu_ms`` the session's CPU per image (:func:`session_cpu_by_group`, summed; ``cpu:<group>`` by
    group), p50 and p99 ms, failures and the median :data:`SPLIT` of the responses' timing."""
    import numpy as np

    cpu0 = session_cpu_by_group()
    answered, failures, wall = send(product, body, concurrency, requests)
    cpu1 = session_cpu_by_group()
    cpu = sum(cpu1.values()) - sum(cpu0.values())
    latencies = [s for s, _ in answered]
    images = max(1, per_request * len(latencies))
    return {
        **{f"cpu:{g}": 1000 * (cpu1[g] - cpu0.get(g, 0.0)) / images for g in cpu1},
        "rps": per_request * len(latencies) / wall,
        "cpu_ms": 1000 * cpu / max(1, per_request * len(latencies)),
        "p50": 1000 * float(np.percentile(latencies, 50)),
        "p99": 1000 * float(np.percentile(latencies, 99)),
        "failures": failures,
        **{k: float(np.median([t.get(k, np.nan) for _, t in answered])) for k in SPLIT},
    }


# --- archives for hetmm inspect ------------------------------------------------------------------------
ARCHIVE_PRODUCT = "bottle"


def _archive_sources() -> list[Path]:
    found = sorted(BOTTLE.rglob("*.png")) + sorted(BATTERY.rglob("*.png")) if BOTTLE.is_dir() else []
    return [p for p in found if "ground_truth" not in p.parts]


def is_corrupt(i: int) -> bool:
    """Whether :func:`archive_images`' ``i``-th file is corrupt (every 100th, at offset 50: 1 %)."""
    return i % 100 == 50


def archive_images(n: int) -> Iterator[tuple[str, bytes]]:
    """``(name, bytes)`` of ``n`` JPEG files: bottle and battery_weld of ../shared (train and test)
    re-encoded at a side that varies with the index, so each file is distinct (synthetic gears without
    ../shared); 1 % corrupt (:func:`is_corrupt`: half truncated, half not an image)."""
    from PIL import Image

    sources = _archive_sources()
    gear = None
    if not sources:
        from hetmm_ray.data.synthetic import SyntheticProduct

        gear = SyntheticProduct(seed=0, size=128)
    cache: dict[int, Any] = {}
    for i in range(n):
        if gear is None:
            k = i % len(sources)
            if k not in cache:
                if len(cache) > 64:
                    cache.clear()
                cache[k] = Image.open(sources[k]).convert("RGB")
            side = 160 + 4 * ((i // len(sources)) % 24)
            im = cache[k].resize((side, side), Image.Resampling.BILINEAR)
        else:
            im = Image.fromarray(gear.good(i) if i % 3 else gear.defective(i, "scratch")[0])
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=90)
        data = buf.getvalue()
        if is_corrupt(i):
            data = data[: len(data) // 2] if (i // 100) % 2 else b"not an image\n"
        yield f"{i // 1000:03d}/{i:06d}.jpg", data


def write_images(folder: Path, n: int) -> list[Path]:
    """:func:`archive_images` written under ``folder``."""
    paths = []
    for name, data in archive_images(n):
        p = folder / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        paths.append(p)
    return paths


def fit_archive_product(store: str, image_size: int = 256) -> None:
    """:data:`ARCHIVE_PRODUCT` in ``store``: fitted on 30 bottle train images with mobilenet_v2's real
    weights (a synthetic gear product of random resnet18 weights at 64 px without ../shared)."""
    from hetmm_ray.config import BackboneConfig, DetectorConfig
    from hetmm_ray.detection.detector import HETMM
    from hetmm_ray.store import open_store

    if BOTTLE.is_dir() and MOBILENET_WEIGHTS.is_file():
        from hetmm_ray.data.decode import decode_image

        config = DetectorConfig(
            backbone=BackboneConfig(name="mobilenet_v2", weights=str(MOBILENET_WEIGHTS), image_size=image_size)
        )
        train = [decode_image(p) for p in sorted((BOTTLE / "train" / "good").glob("*.png"))[:30]]
    else:
        from hetmm_ray.data.synthetic import SyntheticProduct

        config = DetectorConfig(backbone=BackboneConfig(name="resnet18", weights="random", image_size=64))
        gear = SyntheticProduct(seed=0, size=128)
        train = [gear.good(1000 + i) for i in range(12)]
    HETMM(config).fit(train).save(open_store(store), ARCHIVE_PRODUCT)


def repo_env() -> dict[str, str]:
    """This environment with the repository first on ``PYTHONPATH`` (for ``python -m hetmm_ray.cli``)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def inspect_argv(source: str, dest: str, store: str, *extra: str) -> list[str]:
    """``hetmm inspect SOURCE --product bottle --out DEST --store STORE EXTRA...`` in a fresh interpreter."""
    return [sys.executable, "-m", "hetmm_ray.cli", "inspect", source, "--product", ARCHIVE_PRODUCT, "--out", dest,
            "--store", store, *extra]  # fmt: skip


def rows_written(dest: str, spec: Any) -> int:
    """Rows in DEST's Parquet parts so far (a part being written counts as none)."""
    import pyarrow.parquet as pq

    from hetmm_ray.archive.listing import part_files

    fs, _ = spec.resolve(dest)
    n = 0
    for p in part_files(dest, spec):
        try:
            n += pq.ParquetFile(fs.open_input_file(p)).metadata.num_rows
        except OSError:
            pass
    return n


def check_output(dest: str, spec: Any, expected: int) -> dict[str, Any]:
    """Every image once? DEST's rows, distinct paths, duplicates, errors, and the ``expected`` paths lost."""
    import pyarrow.parquet as pq

    from hetmm_ray.archive.listing import part_files

    fs, _ = spec.resolve(dest)
    paths: Counter[str] = Counter()
    errors = 0
    for p in part_files(dest, spec):
        t = pq.read_table(p, columns=["path", "error"], filesystem=fs)
        paths.update(t.column("path").to_pylist())
        errors += t.num_rows - t.column("error").null_count
    dup = sum(c - 1 for c in paths.values() if c > 1)
    return {
        "rows": sum(paths.values()),
        "distinct": len(paths),
        "duplicates": dup,
        "errors": errors,
        "lost": expected - len(paths),
    }


def wait_until(cond: Callable[[], Any], timeout: float) -> bool:
    """Whether ``cond()`` came true within ``timeout`` seconds (checked every 0.5 s)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.5)
    return False

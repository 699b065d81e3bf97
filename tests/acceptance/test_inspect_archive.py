"""The acceptance runs of ``hetmm inspect``: every image once, from S3 on a 3-node cluster,
through a killed worker node, and through SIGINT and a restart; were benchmarks/bench_inspect.py's
``cluster`` and ``sigint`` phases (its ``throughput`` and ``memory`` phases are
``benchmarks/bench_archive.py inspect``).

Images: ``benchmarks.common.archive_images``: bottle and battery_weld of ../shared (train and test)
re-encoded as JPEG at a side that varies with the index (every file distinct), 1 % corrupt (truncated
or not an image); synthetic gears without ../shared. The product: fitted on 30 bottle train images with
mobilenet_v2's real weights (a synthetic product without ../shared) at a 64-px canvas (the counts do not
depend on it; docs/performance.md's count run used it).

1. **cluster**: the images in a moto S3 bucket (moto's server in a subprocess), ``inspect_archive`` from
   the bucket to Parquet in the bucket on a ``ray.cluster_utils.Cluster`` of 3 nodes: every image once
   (rows = distinct paths = images, no duplicate, none lost), errors = the corrupt files;
2. **node loss**: the same job into a new DEST; once half the rows are written, a worker node is killed
   (``Cluster.remove_node(allow_graceful=False)``: SIGKILL of its raylet and workers); then the job
   started again with the same DEST: every image once;
3. **SIGINT**: ``hetmm inspect`` of a local folder interrupted with SIGINT once half its rows are
   written (exit status 130), then started again: every image once.

Full size: 20,000 images for 1 and 2, 5,000 for 3. Quick (``HETMM_ACCEPTANCE_QUICK=1``): 60 and 120 (a
quick job can end before the interrupt reaches it: the exit status is then not asserted).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.common import (
    archive_images,
    check_output,
    fit_archive_product,
    free_port,
    inspect_argv,
    is_corrupt,
    repo_env,
    rows_written,
    wait_until,
    write_images,
)
from hetmm_ray.archive import FsSpec, JobOptions, inspect_archive

pytestmark = pytest.mark.acceptance

NODES = 3
CANVAS = 64


@pytest.fixture(scope="module")
def sizes(quick: bool) -> dict[str, int]:
    return {"images": 60, "folder": 120, "block": 8} if quick else {"images": 20_000, "folder": 5_000, "block": 256}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = str(tmp_path_factory.mktemp("inspect") / "store")
    fit_archive_product(uri, CANVAS)
    return uri


def _bucket(client: Any) -> bool:
    try:
        client.create_bucket(Bucket="archive")
        return True
    except Exception:  # noqa: BLE001 - not up yet
        return False


@pytest.fixture
def moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's S3 server in a subprocess (its CPU and memory apart from the job's); the endpoint URL."""
    for k, v in {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait()


def test_every_image_once_from_s3_on_three_nodes_and_through_a_lost_node(
    store: str, sizes: dict[str, int], moto: str, own_ray: None
) -> None:
    import boto3
    from ray.cluster_utils import Cluster

    from hetmm_ray.distributed import shutdown_ray

    n = sizes["images"]
    corrupt = sum(is_corrupt(i) for i in range(n))
    client = boto3.client("s3", endpoint_url=moto)
    assert wait_until(lambda: _bucket(client), 60), "moto did not start"
    t0 = time.perf_counter()
    for name, data in archive_images(n):
        client.put_object(Bucket="archive", Key=f"in/{name}", Body=data)
    print(f"uploaded {n} images in {time.perf_counter() - t0:.0f} s", flush=True)
    node_cpus = max(2, (os.cpu_count() or 6) // 3)
    c = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": node_cpus,
            "include_dashboard": False,
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4},
        },
    )
    try:
        workers = [c.add_node(num_cpus=node_cpus) for _ in range(NODES - 1)]
        c.wait_for_nodes()
        spec = FsSpec(moto)
        opts = JobOptions(
            store=store,
            endpoint_url=moto,
            address=c.address,
            block_size=sizes["block"],
            concurrency=(NODES, NODES),
            # the simulated nodes share this machine's cores: their actors' threads together cover them
            # once (the job's rule would give each actor its node's logical CPUs)
            actor_threads=max(1, len(os.sched_getaffinity(0)) // NODES),
            progress=False,
        )
        report = inspect_archive("s3://archive/in", "bottle", "s3://archive/out", opts)
        cluster = {
            "seconds": round(report.seconds, 1),
            "images_per_s": round(report.written / report.seconds, 2),
            "per_node": report.per_node,
            "errors": report.errors,
            **check_output("s3://archive/out", spec, n),
        }
        print("cluster:", json.dumps(cluster), flush=True)
        assert (cluster["rows"], cluster["distinct"], cluster["duplicates"], cluster["lost"]) == (n, n, 0, 0)
        assert cluster["errors"] == corrupt

        # node loss: a worker node SIGKILLed half-way, then the job again with the same DEST
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["report"] = inspect_archive("s3://archive/in", "bottle", "s3://archive/out-kill", opts)
            except Exception as exc:  # noqa: BLE001 - reported: the restart is what must complete
                box["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

        th = threading.Thread(target=run)
        th.start()
        half = wait_until(lambda: rows_written("s3://archive/out-kill", spec) >= n // 2 or not th.is_alive(), 3600)
        before = rows_written("s3://archive/out-kill", spec)
        c.remove_node(workers[-1], allow_graceful=False)
        th.join()
        c.add_node(num_cpus=node_cpus)
        c.wait_for_nodes()
        again = inspect_archive("s3://archive/in", "bottle", "s3://archive/out-kill", opts)
        loss = {
            "killed_at_rows": before,
            "half_reached": half,
            "first_run": "survived" if "report" in box else f"failed ({box.get('error')})",
            "restart_skipped": again.skipped,
            "restart_written": again.written,
            **check_output("s3://archive/out-kill", spec, n),
        }
        print("node loss:", json.dumps(loss), flush=True)
        assert half
        assert (loss["rows"], loss["distinct"], loss["duplicates"], loss["lost"]) == (n, n, 0, 0)
        assert loss["errors"] == corrupt
    finally:
        shutdown_ray()
        c.shutdown()


def test_sigint_then_a_restart_writes_every_image_once(
    store: str, sizes: dict[str, int], tmp_path: Path, quick: bool, own_ray: None
) -> None:
    n = sizes["folder"]
    folder = tmp_path / "images"
    write_images(folder, n)
    dest = str(tmp_path / "sigint-out")
    argv = inspect_argv(str(folder), dest, store, "--block-size", str(max(1, min(sizes["block"], n // 20))))
    # SIGINT back to its default in the child: a run started in the background by a non-interactive
    # shell (nohup ... &) has SIGINT ignored, and Python keeps an ignored SIGINT ignored, so the job
    # would never see the Ctrl-C sent here
    proc = subprocess.Popen(
        argv,
        env=repo_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_until(lambda: rows_written(dest, FsSpec()) >= n // 2 or proc.poll() is not None, 3600)
    at = rows_written(dest, FsSpec())
    running = proc.poll() is None  # a quick run's job can end before half its rows are seen
    proc.send_signal(signal.SIGINT)
    try:
        rc = proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
    after = rows_written(dest, FsSpec())  # what the interrupted run left: the restart's "already done"
    again = subprocess.run(argv, env=repo_env(), capture_output=True, text=True)
    out = {
        "interrupted_at_rows": at,
        "rows_after_interrupt": after,
        "rc": rc,
        "restart_rc": again.returncode,
        "restart_report": [x for x in again.stdout.splitlines() if "images written" in x][-1:],
        **check_output(dest, FsSpec(), n),
    }
    print("sigint:", json.dumps(out), flush=True)
    if not quick:
        assert running and at < n, "the job ended before the interrupt: more images"
    if running and at < n:
        assert rc == 130, "hetmm inspect did not stop on SIGINT as 'interrupted'"
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out["rows"], out["distinct"], out["duplicates"], out["lost"]) == (n, n, 0, 0)
    assert out["errors"] == sum(is_corrupt(i) for i in range(n))

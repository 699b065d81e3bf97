"""The inspection record under a crash (issue 23, item 3's acceptance): predictions over HTTP, the
ingress killed with SIGKILL mid-stream, Serve restarts it, the stream goes on; then every answered
prediction is looked up in the record.

Reported: answered predictions before the kill, how many of them are in the record, the number
lost against the stated bound (the rows the ingress held: at most ``record_max_pending_rows``, and
while writes keep up the rows of the last ``record_flush_s`` seconds plus the batch in flight), and
that every prediction answered after the restart is there once the stream ends.

    python benchmarks/record_crash_check.py                  # 10,000 predictions (long)
    python benchmarks/record_crash_check.py --tiny           # 300: shows it works
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import free_port, start_service_retrying

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detector import HETMM
from hetmm_ray.record.reader import read_rows
from hetmm_ray.store import open_store

PRODUCT = "crash"


def _png(array) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def ingress_pid() -> int:
    import ray

    names = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == "serve" and "Ingress" in a["name"]
    ]
    assert len(names) == 1, names
    actor = ray.get_actor(names[0], namespace="serve")
    return int(ray.get(actor.__ray_call__.remote(lambda self: os.getpid())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--predictions", type=int, default=10_000)
    parser.add_argument("--kill-at", type=float, default=0.5, help="share of the stream answered before the kill")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--flush-s", type=float, default=30.0, help="record_flush_s (the default)")
    parser.add_argument("--batch-rows", type=int, default=1000, help="record_batch_rows (the default)")
    args = parser.parse_args()
    if args.tiny:
        args.predictions, args.flush_s, args.batch_rows = 300, 2.0, 50

    from ray import serve

    from hetmm_ray.serve.run import stop_service

    store = f"{tempfile.mkdtemp(prefix='record-crash-')}/store"
    gear = SyntheticProduct(seed=3, size=64)
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=64),
        templates=TemplateConfig(kind="all"),
        threshold=ThresholdConfig(max_images=8, folds=4),
    )
    HETMM(config).fit([gear.good(i) for i in range(8)]).save(open_store(store), PRODUCT)
    bodies = [_png(gear.good(100 + i)) for i in range(16)]
    args_ = {"record": True, "record_flush_s": args.flush_s, "record_batch_rows": args.batch_rows}
    running = start_service_retrying(store=store, port=free_port(), args=args_)
    answered: list[tuple[float, str]] = []  # (time answered, recent_id)
    failed = 0
    lock = threading.Lock()
    counter = iter(range(args.predictions))

    def client() -> None:
        nonlocal failed
        with httpx.Client(base_url=running.url, timeout=120) as c:
            for i in counter:
                try:
                    r = c.post(
                        f"/v1/products/{PRODUCT}/predict",
                        content=bodies[i % len(bodies)],
                        headers={"content-type": "image/png"},
                    )
                except httpx.HTTPError:
                    r = None
                with lock:
                    if r is not None and r.status_code == 200:
                        answered.append((time.time(), r.json()["recent_id"]))
                    else:
                        failed += 1  # refused while the ingress restarts

    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    start = time.time()
    for t in threads:
        t.start()
    while len(answered) < args.kill_at * args.predictions:
        time.sleep(0.05)
    pid = ingress_pid()
    with lock:
        os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        before = [rid for t, rid in answered if t <= killed_at]
    print(f"SIGKILL to the ingress (pid {pid}) after {len(before)} answered predictions", flush=True)
    for t in threads:
        t.join()
    after = [rid for t, rid in answered if t > killed_at]
    end = time.time()
    # the restarted ingress writes what it holds within flush_s: wait for it, then read the record
    backend = open_store(store).backend
    deadline = time.monotonic() + args.flush_s + 120
    while time.monotonic() < deadline:
        ids = set(read_rows(backend, PRODUCT, columns=["recent_id"], labels=False).column("recent_id").to_pylist())
        if set(after) <= ids:
            break
        time.sleep(1.0)
    lost = [rid for rid in before if rid not in ids]
    lost_after = [rid for rid in after if rid not in ids]
    in_window = [rid for t, rid in answered if killed_at - args.flush_s <= t <= killed_at]
    print(
        f"{args.predictions} predictions sent in {end - start:.0f} s by {args.clients} clients; "
        f"{len(answered)} answered, {failed} refused or failed (the ingress restarting)\n"
        f"before the kill: {len(before)} answered, {len(before) - len(lost)} in the record, {len(lost)} lost; "
        f"bound: the rows held at the kill, at most record_max_pending_rows (8000) and, while writes keep up, "
        f"those of the last record_flush_s = {args.flush_s:g} s ({len(in_window)} answered then) plus a batch "
        f"in flight ({args.batch_rows} rows)\n"
        f"after the restart: {len(after)} answered, {len(after) - len(lost_after)} in the record"
    )
    stop_service(running)
    serve.shutdown()


if __name__ == "__main__":
    main()

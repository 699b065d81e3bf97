"""The inspection record under a crash.

Predictions over HTTP from 4 clients, the ingress killed with SIGKILL once half of them are answered,
Serve restarts it, the stream goes on; then every answered prediction is looked up in the record.
Asserted: the predictions answered before the kill that are not in the record are within the stated
bound (the rows the ingress held: at most ``record_max_pending_rows``, 8,000, and, writes keeping up,
those of the last ``record_flush_s`` seconds plus a batch in flight), and every prediction answered
after the restart is in the record once the stream ends.

Full size: 10,000 predictions, ``record_flush_s`` 30, ``record_batch_rows`` 1,000 (the defaults).
Quick (``HETMM_ACCEPTANCE_QUICK=1``): 300 predictions, 2 s, 50 rows.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from benchmarks.common import free_port, png_bytes, served
from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.record.reader import read_rows
from hetmm_ray.store import open_store

pytestmark = pytest.mark.acceptance

PRODUCT = "crash"
CLIENTS = 4
KILL_AT = 0.5  # share of the stream answered before the kill
MAX_PENDING_ROWS = 8000  # ServiceConfig.record_max_pending_rows


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


def test_record_keeps_every_answer_but_the_bounded_few_held_at_a_crash(
    tmp_path: Path, quick: bool, own_ray: None
) -> None:
    predictions, flush_s, batch_rows = (300, 2.0, 50) if quick else (10_000, 30.0, 1000)
    store = str(tmp_path / "store")
    gear = SyntheticProduct(seed=3, size=64)
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=64),
        templates=TemplateConfig(kind="all"),
        threshold=ThresholdConfig(max_images=8, folds=4),
    )
    HETMM(config).fit([gear.good(i) for i in range(8)]).save(open_store(store), PRODUCT)
    bodies = [png_bytes(gear.good(100 + i)) for i in range(16)]
    args = {"record": True, "record_flush_s": flush_s, "record_batch_rows": batch_rows}
    answered: list[tuple[float, str]] = []  # (time answered, recent_id)
    failed = 0
    lock = threading.Lock()
    counter = iter(range(predictions))
    with served(store=store, port=free_port(), args=args) as running:

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

        threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
        start = time.time()
        for t in threads:
            t.start()
        while len(answered) < KILL_AT * predictions and any(t.is_alive() for t in threads):
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
        deadline = time.monotonic() + flush_s + 120
        while time.monotonic() < deadline:
            ids = set(read_rows(backend, PRODUCT, columns=["recent_id"], labels=False).column("recent_id").to_pylist())
            if set(after) <= ids:
                break
            time.sleep(1.0)
    lost = [rid for rid in before if rid not in ids]
    lost_after = [rid for rid in after if rid not in ids]
    in_window = [rid for t, rid in answered if killed_at - flush_s <= t <= killed_at]
    bound = min(MAX_PENDING_ROWS, len(in_window) + batch_rows)
    print(
        f"{predictions} predictions sent in {end - start:.0f} s by {CLIENTS} clients; "
        f"{len(answered)} answered, {failed} refused or failed (the ingress restarting)\n"
        f"before the kill: {len(before)} answered, {len(before) - len(lost)} in the record, {len(lost)} lost; "
        f"bound {bound}: the rows held at the kill, at most record_max_pending_rows ({MAX_PENDING_ROWS}) and, "
        f"while writes keep up, those of the last record_flush_s = {flush_s:g} s ({len(in_window)} answered then) "
        f"plus a batch in flight ({batch_rows} rows)\n"
        f"after the restart: {len(after)} answered, {len(after) - len(lost_after)} in the record"
    )
    assert before, "nothing was answered before the kill"
    assert after, "nothing was answered after the restart"
    assert len(lost) <= bound
    assert lost_after == []

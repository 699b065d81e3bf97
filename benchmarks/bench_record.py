"""Predict-path cost of the inspection record: images/s with and without it, in one run.

Three measurements, each without and with the record, alternated run by run (``--runs``, medians):

- **submit**: the predict path's only call (``InspectionRecorder.submit``), microseconds per
  request of one image, with the background writer busy on a local store;
- **in-process**: a loop of one-image ``HETMM.predict`` calls, each followed (record on) by the
  ``submit`` the ingress makes, with the writer thread hashing, encoding Parquet and writing
  images in the same process (its CPU and GIL share is the cost);
- **query**: ``--query-rows`` rows (100,000) over a day in files of 1000, read back by a time range;
- **HTTP**: ``POST /v1/products/{p}/predict`` of one PNG per request at each ``--concurrency``,
  the service of deploy.yaml started with ``record: false`` and then ``record: true`` (same store,
  same port), ``record_pass_sample: 1`` so every image is written too (the worst case).

The record's cost is ``1 - with / without`` of images/s; the bar is at most 5 %.

    python benchmarks/bench_record.py                 # the full run (minutes)
    python benchmarks/bench_record.py --tiny          # seconds: shows it works, measures nothing
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch  # noqa: F401 - before hetmm_ray, as this benchmark has always run: torch's own OpenMP wait policy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import free_port, png_bytes, post_images, served, table

from hetmm_ray.config import BackboneConfig, DetectorConfig, ServiceConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.record.writer import InspectionRecorder, RecordSettings
from hetmm_ray.store import open_store

PRODUCT = "bench-record"


def settings(pass_sample: float) -> RecordSettings:
    """The service's defaults, every passed image kept when ``pass_sample`` is 1 (the worst case)."""
    return RecordSettings.of(ServiceConfig(record=True, record_pass_sample=pass_sample))


def publish(store: str, size: int, images: int, backbone: str) -> HETMM:
    gear = SyntheticProduct(seed=5, size=size)
    config = DetectorConfig(
        backbone=BackboneConfig(name=backbone, weights="random", image_size=size),
        templates=TemplateConfig(kind="all"),
        threshold=ThresholdConfig(max_images=min(images, 20), folds=min(5, images)),
    )
    det = HETMM(config).fit([gear.good(i) for i in range(images)])
    det.save(open_store(store), PRODUCT)
    return det


def in_process(det: HETMM, body: bytes, image: np.ndarray, n: int, recorder: InspectionRecorder | None) -> float:
    """Images/s of ``n`` one-image predicts, each handed to ``recorder`` as the ingress does."""
    det.predict([image])  # warm
    start = time.perf_counter()
    for i in range(n):
        pred = det.predict([image])
        if recorder is not None:
            result: dict[str, Any] = {
                "score": float(pred.scores[0]),
                "threshold": float(pred.threshold),
                "is_anomaly": bool(pred.is_anomaly[0]),
                "version": 1,
                "recent_id": f"b-{i}",
            }
            recorder.submit(PRODUCT, [("<body>", body)], [result], f"r{i}")
    return n / (time.perf_counter() - start)


def submit_us(recorder: InspectionRecorder, body: bytes, n: int) -> float:
    result = {"score": 0.1, "threshold": 1.0, "is_anomaly": False, "version": 1, "recent_id": "x"}
    start = time.perf_counter()
    for i in range(n):
        recorder.submit(PRODUCT, [("<body>", body)], [dict(result)], f"r{i}")
    return 1e6 * (time.perf_counter() - start) / n


def query(backend: Any, rows: int, batch: int) -> list[list[str]]:
    """``rows`` rows over the last 24 hours written in files of ``batch`` rows, then read back by
    time range through ``read_rows`` (pyarrow.dataset): seconds for a tenth of the day and for all."""
    from hetmm_ray.record.reader import read_rows

    now = time.time()
    t = [now - 86400 + 86400 * i / rows for i in range(rows)]
    clock = iter(t)
    recorder = InspectionRecorder(
        backend, RecordSettings(batch, 3600.0, rows + 1, 0.0, 0, 30), clock=lambda: next(clock, now)
    )
    result = {"score": 0.1, "threshold": 1.0, "is_anomaly": False, "version": 1, "recent_id": "q"}
    for i in range(rows):
        recorder.submit("query", [("x", i.to_bytes(8, "little"))], [result], "r")
    assert recorder.flush(600.0)
    recorder.close()
    out = []
    for what, since, until in (("a tenth of the day", t[rows // 2], t[rows // 2 + rows // 10]), ("all", None, None)):
        start = time.perf_counter()
        n = read_rows(backend, "query", since=since, until=until).num_rows
        out.append([f"query {rows} rows: {what}", "-", "-", f"{time.perf_counter() - start:.3f} s", "", f"{n} rows"])
    return out


def http(store: str, port: int, record: bool, body: bytes, concurrency: list[int], requests: int) -> dict[int, float]:
    args = {"record": record, "record_pass_sample": 1.0}
    detector = {"Detector": {"num_replicas": 1, "user_config": {}}}
    with served(leave="apps", store=store, port=port, args=args, deployments=detector) as running:
        post_images(running.url, PRODUCT, body, 1, 4)  # warm-up
        out = {}
        for conc in concurrency:
            post_images(running.url, PRODUCT, body, conc, 2 * conc)
            answered, failures, wall = post_images(running.url, PRODUCT, body, conc, requests)
            assert failures == 0, f"{failures} failed requests"
            out[conc] = len(answered) / wall
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a few requests at 32 px: shows it works")
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--images", type=int, default=40, help="good images of the product")
    parser.add_argument("--inproc", type=int, default=300, help="one-image predicts per in-process run")
    parser.add_argument("--requests", type=int, default=400, help="HTTP requests per run")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-http", action="store_true", help="in-process figures only (no Ray)")
    parser.add_argument("--query-rows", type=int, default=100_000, help="rows of the time-range query check")
    args = parser.parse_args()
    if args.tiny:
        args.size, args.images, args.inproc, args.requests, args.runs, args.query_rows = 32, 4, 20, 8, 1, 2000
        args.backbone, args.concurrency = "resnet18", [1, 2]

    work = tempfile.mkdtemp(prefix="bench-record-")
    store = f"{work}/store"
    det = publish(store, args.size, args.images, args.backbone)
    image = SyntheticProduct(seed=5, size=args.size).good(1000)
    body = png_bytes(image)
    backend = open_store(store).backend
    rows = []

    recorder = InspectionRecorder(backend, settings(1.0))
    us = statistics.median(submit_us(recorder, body, 2000 if not args.tiny else 50) for _ in range(args.runs))
    recorder.close()
    rows.append(["submit (one image)", "-", "-", f"{us:.1f} us", "", ""])

    rows += query(backend, args.query_rows, 1000)

    off, on = [], []
    for _ in range(args.runs):  # alternated: the machine's drift hits both alike
        off.append(in_process(det, body, image, args.inproc, None))
        recorder = InspectionRecorder(backend, settings(1.0))
        on.append(in_process(det, body, image, args.inproc, recorder))
        recorder.close()
    a, b = statistics.median(off), statistics.median(on)
    rows.append(["in-process", "-", f"{a:.2f}", f"{b:.2f}", f"{100 * (1 - b / a):+.1f}%", ""])

    if not args.no_http:
        from ray import serve

        port = free_port()  # Serve keeps its proxy's port: both services use it
        try:
            runs_off, runs_on = [], []
            for _ in range(args.runs):
                runs_off.append(http(store, port, False, body, args.concurrency, args.requests))
                runs_on.append(http(store, port, True, body, args.concurrency, args.requests))
        finally:
            serve.shutdown()
        for conc in args.concurrency:
            a = statistics.median(r[conc] for r in runs_off)
            b = statistics.median(r[conc] for r in runs_on)
            rows.append(["HTTP", conc, f"{a:.2f}", f"{b:.2f}", f"{100 * (1 - b / a):+.1f}%", ""])
    from hetmm_ray.record.reader import read_rows

    rows[-1][-1] = rows[-1][-1] or f"{read_rows(backend, PRODUCT, columns=['time']).num_rows} rows recorded"
    print(table(["path", "concurrency", "images/s without", "images/s with", "cost", "note"], rows))
    print(
        f"\n{args.backbone} at {args.size} px, {args.images} templates (ALL), one image per request, "
        f"record_pass_sample 1 (every image written); median of {args.runs} runs; "
        f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()

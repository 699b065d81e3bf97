"""Calibration over real HTTP (Ray Serve on 127.0.0.1, a local store): a product created with
the default threshold settings reports the same threshold and rule as the CLI, predictions
carry the rule, and labelled validation runs as an admin job.

The module creates ``weld`` over HTTP once (:func:`weld`); a test that changes a product's
threshold works on a copy of its own, so every test runs alone or in any order.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import free_port, png
from PIL import Image

from hetmm_ray.cli import main
from hetmm_ray.core.calibration import TailModel
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("local_ray")

SIZE = 32
TOKEN_ENV = "HETMM_TEST_CAL_TOKEN"
TOKEN = "cal-token-91ab"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
# Everything but the threshold section: the threshold is left at its defaults.
SMALL = {
    "backbone": {"name": "resnet18", "weights": "random", "image_size": SIZE, "layers": ["layer2", "layer3"]},
    "scoring": {"forward_windows": [3, 3], "backward_windows": [3, 3], "alphas": [0.5, 0.5], "layer_weights": [1, 1]},
}


@pytest.fixture(scope="module")
def product() -> SyntheticProduct:
    return SyntheticProduct(seed=7, size=SIZE)


def deploy(store: str, port: int, user_config: dict) -> Any:
    from hetmm_ray.serve.run import start_service

    return start_service(
        store=store,
        port=port,
        args={"admin_token_env": TOKEN_ENV},
        deployments={"Detector": {"num_replicas": 1, "user_config": {"threads": 1, **user_config}}},
    )


@pytest.fixture(scope="module")
def service_info(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from ray import serve

    from hetmm_ray.serve.run import stop_service

    store = str(tmp_path_factory.mktemp("servecal") / "store")
    os.environ[TOKEN_ENV] = TOKEN
    info = {"store": store, "port": free_port()}
    info["running"] = deploy(store, info["port"], {})
    yield info
    stop_service(info["running"])
    serve.shutdown()
    os.environ.pop(TOKEN_ENV, None)


@pytest.fixture(scope="module")
def client(service_info: dict[str, Any]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service_info["running"].url, timeout=180) as c:
        yield c


@pytest.fixture(scope="module")
def weld(client: httpx.Client, product: SyntheticProduct) -> list:
    """The ``weld`` product created over HTTP with the default threshold settings; its training images."""
    train = [product.good(i) for i in range(12)]
    files = [("images", (f"{i}.png", png(a), "image/png")) for i, a in enumerate(train)]
    r = client.post("/v1/products/weld?wait=true", files=files, data={"config": json.dumps(SMALL)}, headers=ADMIN)
    assert r.status_code == 200, r.text
    return train


def _copy_of_weld(store: str, name: str) -> str:
    """``weld``'s head saved as product ``name`` (v1), for a test that changes it."""
    s = open_store(store)
    s.put(name, s.get("weld"))
    return name


def _describe(client: httpx.Client, name: str) -> dict:
    r = client.get("/v1/products")
    assert r.status_code == 200
    return next(p for p in r.json()["products"] if p["product"] == name)


def test_http_create_reports_the_cli_threshold_and_rule(client, product, weld, tmp_path: Path):
    train = weld  # created over HTTP by the fixture
    # the same images and settings through the CLI
    folder = tmp_path / "train"
    folder.mkdir()
    for i, a in enumerate(train):
        Image.fromarray(a).save(folder / f"{i}.png")
    cfg = tmp_path / "small.json"
    cfg.write_text(json.dumps(SMALL))
    store = str(tmp_path / "cli-store")
    assert main(["fit", str(folder), "--product", "weld", "--store", store, "--config", str(cfg)]) == 0
    cli = open_store(store).get("weld")
    from hetmm_ray.core.scoring import operating_point

    cli_op = operating_point(cli.calibration, cli.config)
    got = _describe(client, "weld")
    assert got["threshold_rule"] == cli_op.rule == "far" and got["rule_target"] == 0.01
    assert got["threshold"] == pytest.approx(cli_op.threshold, rel=1e-5)
    assert got["estimated_false_alarm_rate"] == pytest.approx(cli_op.false_alarm_rate, rel=1e-4)
    # a prediction carries the same threshold and rule
    r = client.post("/v1/products/weld/predict", content=png(product.good(500)), headers={"content-type": "image/png"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["threshold"] == pytest.approx(cli_op.threshold, rel=1e-5)
    assert body["threshold_rule"] == "far" and body["rule_target"] == 0.01
    assert body["estimated_false_alarm_rate"] == pytest.approx(cli_op.false_alarm_rate, rel=1e-4)


def test_http_calibrate_with_labelled_uploads(client, product, weld, service_info):
    name = _copy_of_weld(service_info["store"], "weld-labelled")
    good = [png(product.good(600 + i)) for i in range(3)]
    bad = [png(product.defective(700 + i, "hole")[0]) for i in range(3)]
    files = [("good", (f"g{i}.png", g, "image/png")) for i, g in enumerate(good)]
    files += [("defective", (f"d{i}.png", b, "image/png")) for i, b in enumerate(bad)]
    # client mistakes: 4xx with a JSON error, before any job starts
    r = client.post(f"/v1/products/{name}/calibrate", files=files, data={"objective": "precision"}, headers=ADMIN)
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request"
    r = client.post(f"/v1/products/{name}/calibrate", files=files, data={"max_false_alarm_rate": "nan"}, headers=ADMIN)
    assert r.status_code == 400 and "max_false_alarm_rate" in r.json()["error"]["message"]
    r = client.post(f"/v1/products/{name}/calibrate", files=files[:3], headers=ADMIN)
    assert r.status_code == 400
    r = client.post(f"/v1/products/{name}/calibrate", files=files)
    assert r.status_code == 401
    before = _describe(client, name)
    r = client.post(
        f"/v1/products/{name}/calibrate?wait=true", files=files, data={"objective": "recall"}, headers=ADMIN
    )
    assert r.status_code == 200, r.text
    version = r.json()["job"]["version"]
    after = _describe(client, name)
    assert after["version"] == version == before["version"] + 1
    assert after["threshold_rule"] == "validation" and after["rule_target"] is None
    r = client.post(f"/v1/products/{name}/predict", content=good[0], headers={"content-type": "image/png"})
    assert r.json()["threshold_rule"] == "validation" and r.json()["version"] == version
    assert r.json()["threshold"] == pytest.approx(after["threshold"])


def test_live_false_alarm_rate_setting_overrides_every_product(client, service_info, product, weld):
    """The replicas' user_config ``false_alarm_rate`` applies live (reconfigure, no refit)."""
    before = _describe(client, "weld")
    scores = open_store(service_info["store"]).get("weld").calibration.scores
    service_info["running"] = deploy(service_info["store"], service_info["port"], {"false_alarm_rate": 0.2})
    try:
        r = client.post(
            "/v1/products/weld/predict", content=png(product.good(501)), headers={"content-type": "image/png"}
        )
        body = r.json()
        assert body["threshold_rule"] == "far" and body["rule_target"] == 0.2
        assert body["threshold"] == pytest.approx(TailModel(scores).threshold(0.2), rel=1e-6)
    finally:
        service_info["running"] = deploy(service_info["store"], service_info["port"], {})
    r = client.post("/v1/products/weld/predict", content=png(product.good(501)), headers={"content-type": "image/png"})
    own = (before["threshold_rule"], before["rule_target"])
    assert (r.json()["threshold_rule"], r.json()["rule_target"]) == own != ("far", 0.2)  # the product's own rule again


def _job_end(client: httpx.Client, r: httpx.Response) -> dict:
    """The job of an admin answer, polled to its end when ``?wait=true`` answered before it."""
    from helpers import until

    assert r.status_code in (200, 202), r.text
    job_id = r.json()["job"]["id"]
    return until(
        lambda: (j := client.get(f"/v1/jobs/{job_id}", headers=ADMIN).json()["job"])["state"] != "running" and j,
        "the job's end",
    )


@pytest.mark.parametrize("fitted_by", ["cli", "pre-issue-38 cli"])
def test_a_cli_fitted_product_updated_over_http_with_the_same_images(client, service_info, tmp_path, fitted_by):
    """An image's digest is its decoded frame's on every path, so the good images a
    product was fitted with by ``hetmm fit`` are recognised by ``POST .../normals`` (the bank stays,
    the head stays), and the CLI's threshold is the in-process API's on the same files. A product
    stored by the older CLI (canvas digests: frames resized before hashing) is recognised too.
    Frames larger than the canvas, so a frame's digest and its canvas's differ."""
    from hetmm_ray.config import DetectorConfig
    from hetmm_ray.data.decode import resize_to_geometry
    from hetmm_ray.detection.detector import HETMM

    frames = [SyntheticProduct(seed=11, size=2 * SIZE).good(i) for i in range(12)]
    folder = tmp_path / "train"
    folder.mkdir()
    paths = []
    for i, a in enumerate(frames):
        Image.fromarray(a).save(folder / f"{i:02d}.png")
        paths.append(folder / f"{i:02d}.png")
    cfg = tmp_path / "small.json"
    cfg.write_text(json.dumps(SMALL))
    name = f"digests-{fitted_by.replace(' ', '-')}"
    config = DetectorConfig.from_dict(SMALL)
    if fitted_by == "cli":
        argv = ["fit", str(folder), "--product", name, "--store", service_info["store"], "--config", str(cfg)]
        assert main(argv) == 0
        in_process = HETMM(config).fit(paths)
        stored = open_store(service_info["store"]).get(name)
        assert stored.image_digests == in_process.templates.image_digests
        from hetmm_ray.core.scoring import operating_point

        assert operating_point(stored.calibration, stored.config).threshold == pytest.approx(
            in_process.operating_point().threshold, rel=1e-6
        )
    else:  # what hetmm fit did before: canvases (resized first) hashed and fitted
        bb = config.backbone
        canvases = [resize_to_geometry(f, bb.image_size, bb.geometry) for f in frames]
        open_store(service_info["store"]).put(name, HETMM(config).fit(canvases).templates)
    before = open_store(service_info["store"]).get(name)
    files = [("images", (p.name, p.read_bytes(), "image/png")) for p in paths]
    job = _job_end(client, client.post(f"/v1/products/{name}/normals?wait=true", files=files, headers=ADMIN))
    assert job["state"] == "succeeded", job
    assert job.get("skipped_duplicates") == 12 and job.get("added_images") == 0, job
    s = open_store(service_info["store"])
    assert s.head(name) == 1 and s.get(name).n_images == before.n_images == 12
    # and the in-process API's hot update with the same files adds nothing either
    det = load_detector(s, name)
    det.update(paths)
    assert det.templates.n_images == 12 and det.version == 1  # all 12 skipped: nothing added, nothing changed

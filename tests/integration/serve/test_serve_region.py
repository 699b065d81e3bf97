"""Inspection regions over real HTTP (Ray Serve on 127.0.0.1, a local store): the create form's
``region`` field, ``PUT /v1/products/{p}/region`` as an admin job publishing a recalibrated
version, and 4xx JSON errors for bad regions."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import numpy as np
import pytest
from helpers import free_port, png

from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("local_ray")

SIZE = 64
TOKEN_ENV = "HETMM_TEST_REGION_TOKEN"
TOKEN = "region-token-5c1d"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
SMALL = {
    "backbone": {"name": "resnet18", "weights": "random", "image_size": SIZE, "layers": ["layer2", "layer3"]},
    "scoring": {"forward_windows": [3, 3], "backward_windows": [3, 3], "alphas": [0.5, 0.5], "layer_weights": [1, 1]},
    "threshold": {"folds": 3},
}


@pytest.fixture(scope="module")
def coded() -> SyntheticProduct:
    return SyntheticProduct(seed=5, size=SIZE, printed_code=True)


@pytest.fixture(scope="module")
def region(coded) -> dict:
    return {"size": [SIZE, SIZE], "include": [], "exclude": [{"rect": coded.code_region()}]}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from ray import serve

    from hetmm_ray.serve.run import start_service, stop_service

    store = str(tmp_path_factory.mktemp("serveregion") / "store")
    os.environ[TOKEN_ENV] = TOKEN
    running = start_service(
        store=store,
        port=free_port(),
        args={"admin_token_env": TOKEN_ENV},
        deployments={"Detector": {"num_replicas": 1, "user_config": {"threads": 1}}},
    )
    with httpx.Client(base_url=running.url, timeout=180) as client:
        yield {"store": store, "client": client}
    stop_service(running)
    serve.shutdown()
    os.environ.pop(TOKEN_ENV, None)


def create(client: httpx.Client, name: str, coded: SyntheticProduct, **fields: str) -> httpx.Response:
    files = [("images", (f"{i}.png", png(coded.good(i)), "image/png")) for i in range(8)]
    data = {"config": json.dumps(SMALL), **fields}
    return client.post(f"/v1/products/{name}?wait=true", files=files, data=data, headers=ADMIN)


def test_create_with_a_region_and_put_another(service, coded, region) -> None:
    client, store = service["client"], open_store(service["store"])
    r = create(client, "ruled", coded, region=json.dumps(region))
    assert r.status_code == 200, r.text
    ruled = store.get("ruled")
    assert ruled.config.region == region
    # predictions score under the region, as in process
    local = load_detector(store, "ruled", device="cpu")
    image = coded.good(300)
    r = client.post("/v1/products/ruled/predict?map=png", content=png(image), headers={"content-type": "image/png"})
    assert r.status_code == 200, r.text
    assert r.json()["score"] == pytest.approx(float(local.predict([image]).scores[0]), rel=1e-4)

    # a product without a region, then PUT one: a new version, the same templates, recalibrated
    assert create(client, "plain", coded).status_code == 200
    plain = store.get("plain")
    r = client.put("/v1/products/plain/region?wait=true", json={"region": region}, headers=ADMIN)
    assert r.status_code == 200, r.text
    job = r.json()["job"]
    assert job["kind"] == "region" and job["version"] == 2
    put = store.get("plain")
    assert put.config.region == region and put.image_digests == plain.image_digests
    det = load_detector(store, "plain", 1, device="cpu")
    expected = det.calibrated(replace(plain, config=replace(plain.config, region=region))).calibration.scores
    np.testing.assert_allclose(put.calibration.scores, expected, rtol=1e-5)
    assert np.mean(put.calibration.scores) < np.mean(plain.calibration.scores)
    # null removes it: the first calibration again
    r = client.put("/v1/products/plain/region?wait=true", json={"region": None}, headers=ADMIN)
    assert r.status_code == 200, r.text
    again = store.get("plain")
    assert again.config.region is None
    np.testing.assert_allclose(again.calibration.scores, plain.calibration.scores, rtol=1e-5)


def test_bad_regions_are_4xx_json_errors(service, coded, region) -> None:
    client = service["client"]
    if "plain" not in open_store(service["store"]).products():
        assert create(client, "plain", coded).status_code == 200
    url = "/v1/products/plain/region"
    cases = [
        ({"region": {"size": [SIZE, SIZE], "include": [{"rect": [0, 0, 99, 5]}]}}, 400, "outside the 64 x 64 frame"),
        ({"size": [SIZE, SIZE], "exclude": [{"rect": [0, 0, SIZE, SIZE]}]}, 400, "no pixel"),
        ({"size": [SIZE, SIZE], "include": [{"circle": [1, 2, 3]}]}, 400, "a shape is"),
        ({"region": {"size": [4000, 4000], "include": [{"rect": [0, 0, 3, 3]}]}}, 400, "covers no pixel"),
    ]
    for body, status, words in cases:
        r = client.put(url, json=body, headers=ADMIN)
        assert r.status_code == status, r.text
        assert r.json()["error"]["code"] == "bad_config" and words in r.json()["error"]["message"], r.text
    assert client.put(url, json={"region": region}).status_code == 401
    assert client.put("/v1/products/nope/region", json={"region": region}, headers=ADMIN).status_code == 404
    bad = {"size": [SIZE, SIZE], "include": [{"rect": [5, 5, 5, 9]}]}
    r = create(client, "badcreate", coded, region=json.dumps(bad))
    assert r.status_code == 400 and "x0 < x1" in r.json()["error"]["message"], r.text


def _finished(client: httpx.Client, started: httpx.Response) -> dict[str, Any]:
    """The job ``started`` answered, once it ended (``?wait=true`` answers 202 while it still runs)."""
    assert started.status_code in (200, 202), started.text
    job = started.json()["job"]
    for _ in range(1200):
        if job["state"] != "running":
            break
        time.sleep(0.25)
        job = client.get(f"/v1/jobs/{job['id']}", headers=ADMIN).json()["job"]
    assert job["state"] == "succeeded", job
    return job


def test_region_preview_publishes_nothing_and_equals_the_put(service, coded, region) -> None:
    client, store = service["client"], open_store(service["store"])
    assert create(client, "previewed", coded).status_code == 200
    before = store.record("previewed", 1)
    url = "/v1/products/previewed/region"
    job = _finished(client, client.post(f"{url}/preview?wait=true", json={"region": region}, headers=ADMIN))
    assert job["kind"] == "region_preview" and job["version"] == 1 and job["progress"]["stage"] == "previewed"
    preview = job["preview"]
    assert preview["version"] == 1
    current, proposed = preview["current"], preview["proposed"]
    assert current["region"] is None and proposed["region"] == region
    op = before.operating_point()
    assert current["threshold"] == op.threshold and current["threshold_rule"] == "far"
    assert current["estimated_false_alarm_rate"] == op.false_alarm_rate
    assert current["oof_scores"] == list(before.calibration.scores)
    q = proposed["quantiles"]
    assert q["min"] <= q["median"] <= q["p90"] <= q["max"] == max(proposed["oof_scores"])
    assert q["median"] == pytest.approx(float(np.median(proposed["oof_scores"])))
    assert q["median"] < current["quantiles"]["median"]  # the printed code no longer counts
    # nothing published: the store and the service still hold v1
    assert store.versions("previewed") == [1] and store.head("previewed") == 1
    listed = next(p for p in client.get("/v1/products").json()["products"] if p["product"] == "previewed")
    assert listed["version"] == 1 and listed["threshold"] == op.threshold
    # the PUT publishes what the preview showed
    put = _finished(client, client.put(f"{url}?wait=true", json={"region": region}, headers=ADMIN))
    assert put["version"] == 2
    published = store.record("previewed", 2)
    assert published.config.region == region
    assert published.operating_point().threshold == pytest.approx(proposed["threshold"], rel=1e-6)
    np.testing.assert_allclose(published.calibration.scores, proposed["oof_scores"], rtol=1e-6)
    # refusals: like the PUT's, and nothing started
    bad = {"size": [SIZE, SIZE], "exclude": [{"rect": [0, 0, SIZE, SIZE]}]}
    r = client.post(f"{url}/preview", json=bad, headers=ADMIN)
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_config" and "no pixel" in r.text, r.text
    circle = {"size": [SIZE, SIZE], "include": [{"circle": [1]}]}
    r = client.post(f"{url}/preview", json={"region": circle}, headers=ADMIN)
    assert r.status_code == 400 and "a shape is" in r.json()["error"]["message"], r.text
    assert client.post(f"{url}/preview", json={"region": region}).status_code == 401
    assert client.post("/v1/products/nope/region/preview", json={"region": region}, headers=ADMIN).status_code == 404
    assert store.versions("previewed") == [1, 2]

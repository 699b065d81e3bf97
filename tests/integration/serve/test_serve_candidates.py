"""Candidate versions over real HTTP (Ray Serve on 127.0.0.1, on a local store and on S3
through a moto server): a hot update
published as a candidate leaves HEAD, and what the replicas serve, at the previous version; the
compare job lists the flips that scoring each version alone gives; promote moves HEAD and the
replicas serve the candidate within the store-poll bound; discard drops a candidate. Admin routes
answer JSON errors (401 without the token, 404 for no such candidate, 400 for a bad ``publish``).

A candidate is loaded on the template hosts beside HEAD's shards (published over HTTP, or stored by
another writer and noticed by the store poll): discard (over HTTP, or in the store) frees it, the
hosts' held bytes back within 10 % of before; promote makes its loaded shards HEAD's (no shard is
read from the store again) and the replicas serve it within the store-poll bound.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from helpers import free_port, png

from hetmm_ray.data.decode import decode_image, resize_to_geometry
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.store import open_store

SIZE = 32
TOKEN_ENV = "HETMM_TEST_CAND_TOKEN"
TOKEN = "cand-token-5e1f"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
SMALL = {
    "backbone": {"name": "resnet18", "weights": "random", "image_size": SIZE, "layers": ["layer2", "layer3"]},
    "scoring": {"forward_windows": [3, 3], "backward_windows": [3, 3], "alphas": [0.5, 0.5], "layer_weights": [1, 1]},
    "threshold": {"folds": 3},
}
PNG = {"content-type": "image/png"}


@pytest.fixture(scope="module")
def ray_with_aws(own_ray, aws_env) -> Iterator[None]:
    import ray
    from helpers import LOCAL_RAY_ARGS

    ray.init(**LOCAL_RAY_ARGS)  # after aws_env: workers inherit the dummy credentials
    yield


@pytest.fixture(scope="module", params=["local", "s3"])
def service(
    request: pytest.FixtureRequest, ray_with_aws: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    from ray import serve
    from s3_server import new_bucket

    from hetmm_ray.serve.run import start_service, stop_service

    if request.param == "local":
        store = str(tmp_path_factory.mktemp("servecand") / "store")
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        store = f"s3://{new_bucket(endpoint)}/templates?endpoint={endpoint}"
    os.environ[TOKEN_ENV] = TOKEN
    running = start_service(
        store=store,
        port=free_port(),
        args={"admin_token_env": TOKEN_ENV, "store_poll_s": 0.5},
        deployments={"Detector": {"num_replicas": 1, "user_config": {"threads": 1}}},
    )
    with httpx.Client(base_url=running.url, timeout=180) as client:
        yield {"store": store, "client": client}
    stop_service(running)
    serve.shutdown()
    os.environ.pop(TOKEN_ENV, None)


def _predicted_version(client: httpx.Client, image: bytes, product: str = "p") -> int:
    r = client.post(f"/v1/products/{product}/predict", content=image, headers=PNG)
    assert r.status_code == 200, r.text
    return int(r.json()["version"])


def _serves(client: httpx.Client, image: bytes, version: int, within: float = 120.0, product: str = "p") -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if _predicted_version(client, image, product) == version:
            return True
        time.sleep(0.5)
    return False


def test_candidate_compare_promote_discard_over_http(service) -> None:
    client, store = service["client"], service["store"]
    part = SyntheticProduct(seed=3, size=SIZE)
    files = [("images", (f"{i}.png", png(part.good(i)), "image/png")) for i in range(8)]
    r = client.post("/v1/products/p?wait=true", files=files, data={"config": json.dumps(SMALL)}, headers=ADMIN)
    assert r.status_code == 200, r.text
    probe = png(part.good(100))
    assert _predicted_version(client, probe) == 1
    # normals as a candidate: stored (v2), HEAD and the replicas stay at v1
    more = [("images", (f"m{i}.png", png(part.good(i)), "image/png")) for i in range(8, 12)]
    r = client.post("/v1/products/p/normals?wait=true&publish=candidate", files=more, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["job"]["version"] == 2 and r.json()["job"]["candidate"] is True
    r = client.get("/v1/products/p/candidates")
    assert r.status_code == 200 and r.json()["head"] == 1
    assert [c["version"] for c in r.json()["candidates"]] == [2] and r.json()["candidates"][0]["parent"] == 1
    assert open_store(store).head("p") == 1
    assert _predicted_version(client, probe) == 1
    products = {p["product"]: p for p in client.get("/v1/products").json()["products"]}
    assert products["p"]["version"] == 1
    # another writer (the CLI, say) stores a candidate under the sigmas rule, its threshold placed
    # between two of the compare images' scores on the other side of HEAD's threshold: they flip
    images = [png(part.good(i)) for i in range(200, 203)] + [png(part.defective(i, "hole")[0]) for i in range(3)]
    s = open_store(store)
    rec = s.record("p", 1)
    det = load_detector(s, "p", 1)
    scores = sorted(float(x) for x in det.predict([_canvas(d, det.config.backbone.geometry) for d in images]).scores)
    head_t, cal = det.operating_point().threshold, rec.calibration
    mids = [(a + b) / 2 for a, b in itertools.pairwise(scores)]
    target = next(m for m in mids if m >= cal.mean and any(min(m, head_t) < x <= max(m, head_t) for x in scores))
    rule = replace(rec.config.threshold, rule="sigmas", sigmas=(target - cal.mean) / cal.std)
    config = replace(rec.config, threshold=rule).stored_dict()
    assert s.republish("p", config=config, expect_head=1, candidate=True) == 3
    # compare v3 against HEAD on uploaded images: the flips are those of scoring each version alone
    upload = [("images", (f"c{i}.png", data, "image/png")) for i, data in enumerate(images)]
    r = client.post("/v1/products/p/versions/3/compare?wait=true", files=upload, headers=ADMIN)
    assert r.status_code == 200, r.text
    result = r.json()["job"]["compare"]
    verdicts = []
    for v in (1, 3):
        det = load_detector(open_store(store), "p", v)
        pred = det.predict([_canvas(data, det.config.backbone.geometry) for data in images])
        verdicts.append([bool(x) for x in pred.is_anomaly])
    expected = [f"c{i}.png" for i in range(len(images)) if verdicts[0][i] != verdicts[1][i]]
    assert expected, verdicts
    assert [f["image"] for f in result["flips"]] == expected
    for flip in result["flips"]:
        assert flip["base"]["is_anomaly"] != flip["candidate"]["is_anomaly"]
        assert all(u.startswith("data:image/png;base64,") for u in flip["heatmaps"].values())
    assert result["base"] == 1 and result["candidate"] == 3 and result["images"] == len(images)
    assert len(result["score_shift"]["base"]) == len(result["score_shift"]["quantiles"])
    # admin mistakes: JSON errors, 4xx
    assert client.post("/v1/products/p/versions/2/promote").status_code == 401
    r = client.post("/v1/products/p/versions/9/promote", headers=ADMIN)
    assert r.status_code == 404 and "no candidate v9" in r.json()["error"]["message"]
    r = client.post("/v1/products/p/normals?publish=later", files=more, headers=ADMIN)
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request"
    r = client.post("/v1/products/p/versions/2/promote", json={"expect_head": 7}, headers=ADMIN)
    assert r.status_code == 409
    # promote v2: HEAD moves (a recorded move) and the replica serves v2
    r = client.post("/v1/products/p/versions/2/promote", json={"expect_head": 1}, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json() == {"product": "p", "version": 2, "previous": 1}
    assert _serves(client, probe, 2)
    assert [(m["kind"], m["to"]) for m in open_store(store).moves("p")] == [("promote", 2)]
    # discard v3: nothing else moves
    r = client.post("/v1/products/p/versions/3/discard", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert client.get("/v1/products/p/candidates").json()["candidates"] == []
    assert open_store(store).head("p") == 2 and _predicted_version(client, probe) == 2


def _holdings(store: str) -> list[dict[str, Any]]:
    import ray

    from hetmm_ray.distributed.registry import registry_name
    from hetmm_ray.distributed.runtime import NAMESPACE

    hosts = ray.get(ray.get_actor(registry_name(store), namespace=NAMESPACE).host_holdings.remote())
    assert all("error" not in h for h in hosts), hosts
    return hosts


def _sets(store: str, product: str) -> dict[tuple[int, bool], dict[str, Any]]:
    """(version, candidate) -> {"bytes", "layers"} of ``product``'s shard sets over every host."""
    out: dict[tuple[int, bool], dict[str, Any]] = {}
    for host in _holdings(store):
        for row in host["sets"]:
            if row["product"] == product:
                got = out.setdefault((row["version"], row["candidate"]), {"bytes": 0, "layers": []})
                got["bytes"] += row["bytes"]
                got["layers"] = sorted(got["layers"] + row["layers"])
    return out


def _until(check: Any, within: float = 120.0) -> Any:
    """``check()``'s first truthy answer within ``within`` seconds (else its last answer)."""
    deadline = time.monotonic() + within
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def test_candidate_shards_on_hosts_discard_frees_promote_adopts(service) -> None:
    client, store = service["client"], service["store"]
    part = SyntheticProduct(seed=5, size=SIZE)
    files = [("images", (f"{i}.png", png(part.good(i)), "image/png")) for i in range(8)]
    r = client.post("/v1/products/q?wait=true", files=files, data={"config": json.dumps(SMALL)}, headers=ADMIN)
    assert r.status_code == 200, r.text
    probe = png(part.good(100))
    assert _predicted_version(client, probe, "q") == 1
    head = _sets(store, "q")
    assert list(head) == [(1, False)] and head[1, False]["bytes"] > 0
    layers = head[1, False]["layers"]
    before = sum(row["bytes"] for h in _holdings(store) for row in h["sets"])
    rss = [sum(h["rss_bytes"] or 0 for h in _holdings(store))]
    # a hot update published as a candidate: stored as v2, loaded on the hosts beside v1, not served
    more = [("images", (f"m{i}.png", png(part.good(i)), "image/png")) for i in range(8, 14)]
    r = client.post("/v1/products/q/normals?wait=true&publish=candidate", files=more, headers=ADMIN)
    assert r.status_code == 200 and r.json()["job"]["version"] == 2, r.text
    held = _until(lambda: (2, True) in (got := _sets(store, "q")) and got)
    assert held[2, True]["bytes"] > head[1, False]["bytes"] and held[2, True]["layers"] == layers, held
    assert held[1, False] == head[1, False]
    assert _predicted_version(client, probe, "q") == 1
    rss.append(sum(h["rss_bytes"] or 0 for h in _holdings(store)))
    # discard: its shards are freed, the hosts hold what they held before (within 10 %)
    r = client.post("/v1/products/q/versions/2/discard", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert _until(lambda: list(_sets(store, "q")) == [(1, False)]), _sets(store, "q")
    after = sum(row["bytes"] for h in _holdings(store) for row in h["sets"])
    assert abs(after - before) <= 0.1 * before, (before, after)
    rss.append(sum(h["rss_bytes"] or 0 for h in _holdings(store)))
    print(f"hosts: held {before} -> {after} bytes; RSS before / with candidate / after discard: {rss}")
    # another writer (the CLI) stores a candidate: the store poll loads it; discarded there, it is unloaded
    s = open_store(store)
    rec = s.record("q", 1)
    rule = replace(rec.config.threshold, rule="far", false_alarm_rate=0.05)
    config = replace(rec.config, threshold=rule).stored_dict()
    assert s.republish("q", config=config, expect_head=1, candidate=True) == 3
    assert _until(lambda: (3, True) in _sets(store, "q")), _sets(store, "q")
    s.discard("q", 3)
    assert _until(lambda: list(_sets(store, "q")) == [(1, False)]), _sets(store, "q")
    # a candidate promoted: its loaded shards become HEAD's (no shard read again), served within the bound
    r = client.post("/v1/products/q/normals?wait=true&publish=candidate", files=more, headers=ADMIN)
    assert r.status_code == 200 and r.json()["job"]["version"] == 4, r.text
    held = _until(lambda: (4, True) in (got := _sets(store, "q")) and got)
    loads = sum(h["loads"] for h in _holdings(store))
    r = client.post("/v1/products/q/versions/4/promote", json={"expect_head": 1}, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert _serves(client, probe, 4, product="q")
    assert _sets(store, "q") == {(4, False): held[4, True]}
    assert sum(h["loads"] for h in _holdings(store)) == loads


def _canvas(data: bytes, geometry: str) -> Any:
    """An image as ``hetmm predict`` gives it to an untiled product: resized to the canvas."""
    return resize_to_geometry(decode_image(data), SIZE, geometry)

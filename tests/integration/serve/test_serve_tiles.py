"""Tiled products over real HTTP (Ray Serve on 127.0.0.1, a local store, two template hosts): a
product created with ``tiles`` scores as the in-process :class:`~hetmm_ray.detection.tiled.TiledHETMM` on the
same frames and templates, its shards are its (tile position, layer) objects spread over the hosts,
heat-maps come at the frame's resolution (or ``?map_size``), and ``GET /v1/products/{p}`` answers
the stored settings (region, tiles). Tiny frames and a 2 x 2 grid: CI is a loaded 2-core machine."""

from __future__ import annotations

import base64
import io
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import ray
from helpers import finished_job, free_port, png
from PIL import Image

from hetmm_ray.config import DetectorConfig
from hetmm_ray.data.synthetic import DEFECT_KINDS, SyntheticProduct
from hetmm_ray.detection.detector_choice import load_detector
from hetmm_ray.detection.geometry_rule import choose_geometry
from hetmm_ray.distributed import get_registry
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("local_ray")

FRAME = 128
CANVAS = 64
TOKEN_ENV = "HETMM_TEST_TILES_TOKEN"
TOKEN = "tiles-token-91ab"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
SMALL = {
    "backbone": {"name": "resnet18", "weights": "random", "image_size": CANVAS, "layers": ["layer2", "layer3"]},
    "scoring": {"forward_windows": [3, 3], "backward_windows": [3, 3], "alphas": [0.5, 0.5], "layer_weights": [1, 1]},
    "templates": {"kind": "pts_k", "sheets": 4},
    "threshold": {"folds": 3},
    "geometry": {"tile_overlap": 8},
}
# (position, layer) shards: the 4 tiles and the whole view (geometry.tile_whole_view, the default)
KEYS = {f"{pos}/{layer}" for pos in ("tile0", "tile1", "tile2", "tile3", "whole") for layer in ("layer2", "layer3")}


@pytest.fixture(scope="module")
def product() -> SyntheticProduct:
    return SyntheticProduct(seed=3, size=FRAME)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from ray import serve

    from hetmm_ray.serve.run import start_service, stop_service

    store = str(tmp_path_factory.mktemp("servetiles") / "store")
    os.environ[TOKEN_ENV] = TOKEN
    running = start_service(
        store=store,
        port=free_port(),
        args={"admin_token_env": TOKEN_ENV, "template_hosts": 2},
        deployments={"Detector": {"num_replicas": 1, "user_config": {"threads": 1}}},
    )
    with httpx.Client(base_url=running.url, timeout=300) as client:
        yield {"store": store, "client": client}
    stop_service(running)
    serve.shutdown()
    os.environ.pop(TOKEN_ENV, None)


def create(client: httpx.Client, name: str, product: SyntheticProduct, **fields: str) -> httpx.Response:
    files = [("images", (f"{i}.png", png(product.good(i)), "image/png")) for i in range(6)]
    data = {"config": json.dumps(SMALL), **fields}
    return client.post(f"/v1/products/{name}?wait=true", files=files, data=data, headers=ADMIN)


@pytest.fixture(scope="module")
def tiled(service, product) -> str:
    r = create(service["client"], "tiled", product, tiles="2x2")
    assert r.status_code == 200, r.text
    job = r.json()["job"]
    # the cost was reported before the fit: grid, tile size, sheets per tile, estimated ms per frame
    assert job["tiles"] == [2, 2] and job["sheets"] == 4 and job["estimated_ms_per_frame"] > 0, job
    assert job["tile_px"] == [68, 68], job  # ceil((128 + 8) / 2)
    return "tiled"


def _frames(product: SyntheticProduct) -> list[np.ndarray]:
    return [product.good(100), *(product.defective(200 + i, k)[0] for i, k in enumerate(DEFECT_KINDS[:2]))]


def test_tiled_product_scores_as_in_process(service, product, tiled) -> None:
    client, store = service["client"], open_store(service["store"])
    rec = store.record(tiled)
    assert set(rec.layers) == KEYS and rec.config.geometry.tiles == (2, 2)
    local = load_detector(store, tiled, device="cpu")
    frames = _frames(product)
    expected = local.predict(frames)
    files = [("images", (f"{i}.png", png(f), "image/png")) for i, f in enumerate(frames)]
    r = client.post(f"/v1/products/{tiled}/predict?map=png", files=files)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["version"] == 1
    got = [x["score"] for x in body["results"]]
    np.testing.assert_allclose(got, expected.scores, rtol=1e-4)
    assert [x["is_anomaly"] for x in body["results"]] == [bool(v) for v in expected.is_anomaly]
    assert body["results"][0]["threshold"] == pytest.approx(expected.threshold, rel=1e-6)
    heat = Image.open(io.BytesIO(base64.b64decode(body["results"][0]["heatmap_png"])))
    assert heat.size == (FRAME, FRAME)  # stitched at the frame's resolution
    one = {"content": png(frames[0]), "headers": {"content-type": "image/png"}}
    r = client.post(f"/v1/products/{tiled}/predict?map=png&map_size=48", **one)
    assert r.status_code == 200, r.text
    assert r.json()["score"] == pytest.approx(got[0], rel=1e-4)  # alone, not in a batch of 3: float32 rounding
    assert Image.open(io.BytesIO(base64.b64decode(r.json()["heatmap_png"]))).size == (48, 48)
    r = client.post(f"/v1/products/{tiled}/predict?map=png&map_size=500", **one)  # at most: never enlarged
    assert Image.open(io.BytesIO(base64.b64decode(r.json()["heatmap_png"]))).size == (FRAME, FRAME)
    assert client.post(f"/v1/products/{tiled}/predict?map_size=0", **one).status_code == 400
    # a frame larger than a replica's gRPC message limit (4 MiB decoded) goes by reference, scored alike
    big = np.asarray(Image.fromarray(frames[1]).resize((1200, 1200), Image.BILINEAR))
    r = client.post(f"/v1/products/{tiled}/predict?map=png&map_size=256", content=png(big), headers=one["headers"])
    assert r.status_code == 200, r.text
    assert r.json()["score"] == pytest.approx(float(local.predict([big]).scores[0]), rel=1e-4)
    assert Image.open(io.BytesIO(base64.b64decode(r.json()["heatmap_png"]))).size == (256, 256)


def test_shards_are_tile_layers_and_a_host_holds_only_its_own(service, tiled) -> None:
    # the store keeps one object per (tile, layer): a shard's load (get_layer) fetches its own only
    chunks = open_store(service["store"]).manifest(tiled, 1)["chunks"]
    assert sorted(ref["layer"] for ref in chunks) == sorted(KEYS)
    registry = get_registry(service["store"], detached=True)
    where = ray.get(registry.placement_of.remote(tiled))
    assert set(where) == KEYS
    assert len(set(where.values())) == 2  # 10 shards over 2 hosts: both hold some
    handles = ray.get(registry.shard_handles.remote(tiled))
    for key, handle in handles.items():
        info = ray.get(handle.info.remote())
        assert info["layer"] == key and info["images"] == 6 and info["sheets"] == 4, info
        held = {layer for product, layer in ray.get(handle.host.held.remote()) if product == tiled}
        assert held == {k for k, slot in where.items() if slot == handle.slot}  # its tiles, no other


def test_settings_route_and_product_list(service, product, tiled) -> None:
    client = service["client"]
    r = client.get(f"/v1/products/{tiled}")
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["version"] == 1 and got["tiles"] == [2, 2] and got["tile_overlap"] == 8 and got["region"] is None
    assert got["config"]["geometry"]["tiles"] == [2, 2] and got["config"]["backbone"]["image_size"] == CANVAS
    listed = {p["product"]: p for p in client.get("/v1/products").json()["products"]}
    assert listed[tiled]["tiles"] == [2, 2] and listed[tiled]["region"] is False
    # an untiled product with a region: GET answers it as stored
    region = {"size": [FRAME, FRAME], "include": [], "exclude": [{"rect": [0, 0, 20, 20]}]}
    plain = dict(SMALL, templates={"kind": "all"})
    files = [("images", (f"{i}.png", png(product.good(i)), "image/png")) for i in range(4)]
    r = client.post(
        "/v1/products/ruled?wait=true",
        files=files,
        data={"config": json.dumps(plain), "region": json.dumps(region)},
        headers=ADMIN,
    )
    assert r.status_code == 200, r.text
    got = client.get("/v1/products/ruled").json()
    assert got["region"] == region and got["tiles"] == [1, 1] and got["config"]["region"] == region
    listed = {p["product"]: p for p in client.get("/v1/products").json()["products"]}
    assert listed["ruled"]["region"] is True and listed["ruled"]["tiles"] == [1, 1]
    assert client.get("/v1/products/nope").status_code == 404
    assert client.get("/v1/products/bad%20name").json()["error"]["code"] == "bad_product_name"


def test_hot_update_and_labelled_calibration_of_a_tiled_product(service, product) -> None:
    client, store = service["client"], open_store(service["store"])
    assert create(client, "grown", product, tiles="2x2").status_code == 200
    new = [product.good(i) for i in (40, 41)]
    files = [("images", (f"n{i}.png", png(f), "image/png")) for i, f in enumerate(new)]
    r = client.post("/v1/products/grown/normals?wait=true", files=files, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["job"]["version"] == 2 and r.json()["job"]["added_images"] == 2
    expected = load_detector(store, "grown", 1, device="cpu").update(new)
    stored = load_detector(store, "grown", 2, device="cpu")
    np.testing.assert_allclose(stored.calibration.scores, expected.calibration.scores, rtol=1e-5)
    assert store.record("grown", 2).images == 8
    # the (tile, layer) shards grew in place (LayerShard.adopt) and hold exactly what v2 stores
    registry = get_registry(service["store"], detached=True)
    v2 = store.get("grown", 2)
    for key, handle in ray.get(registry.shard_handles.remote("grown")).items():
        info = ray.get(handle.info.remote())
        assert info["images"] == 8 and info["version"] == 2, info
        assert np.array_equal(ray.get(handle.tiny.remote()), v2.templates(key).numpy()), key
    frames = _frames(product)
    one = {"content": png(frames[1]), "headers": {"content-type": "image/png"}}
    r = client.post("/v1/products/grown/predict", **one)
    assert r.status_code == 200 and r.json()["version"] == 2, r.text
    assert r.json()["score"] == pytest.approx(float(expected.predict(frames[1:2]).scores[0]), rel=1e-4)
    # a retried update adds nothing: the head stays
    r = client.post("/v1/products/grown/normals?wait=true", files=files, headers=ADMIN)
    assert r.status_code == 200 and r.json()["job"]["version"] == 2 and r.json()["job"]["skipped_duplicates"] == 2
    # labelled calibration at the frame level
    labelled = [("good", (f"g{i}.png", png(f), "image/png")) for i, f in enumerate([product.good(60), frames[0]])]
    labelled += [("defective", (f"d{i}.png", png(f), "image/png")) for i, f in enumerate(frames[1:])]
    r = client.post("/v1/products/grown/calibrate?wait=true", files=labelled, headers=ADMIN)
    assert r.status_code == 200 and r.json()["job"]["version"] == 3, r.text
    rec = store.record("grown", 3)
    assert rec.config.threshold.rule == "validation"
    r = client.post("/v1/products/grown/predict", **one)
    assert r.json()["version"] == 3 and r.json()["threshold"] == pytest.approx(rec.operating_point().threshold)


def test_region_with_tiles_and_refusals(service, product) -> None:
    client, store = service["client"], open_store(service["store"])
    region = {"size": [FRAME, FRAME], "include": [], "exclude": [{"rect": [0, 0, 40, 40]}]}
    r = create(client, "tiledregion", product, tiles="2x2", region=json.dumps(region))
    assert r.status_code == 200, r.text
    got = client.get("/v1/products/tiledregion").json()
    assert got["region"] == region and got["tiles"] == [2, 2]
    local = load_detector(store, "tiledregion", device="cpu")
    frame = _frames(product)[2]
    r = client.post("/v1/products/tiledregion/predict", content=png(frame), headers={"content-type": "image/png"})
    assert r.status_code == 200, r.text
    assert r.json()["score"] == pytest.approx(float(local.predict([frame]).scores[0]), rel=1e-4)
    # another region (here: none) for a tiled product: every position recalibrated, as in process
    other = {"size": [FRAME, FRAME], "include": [], "exclude": [{"rect": [60, 0, 128, 30]}]}
    r = client.put("/v1/products/tiledregion/region?wait=true", json={"region": other}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["job"]["version"] == 2, r.text
    expected = local.with_region(other)
    stored = load_detector(store, "tiledregion", 2, device="cpu")
    assert stored.config.region == other
    np.testing.assert_allclose(stored.calibration.scores, expected.calibration.scores, rtol=1e-5)
    assert client.get("/v1/products/tiledregion").json()["region"] == other
    r = client.post("/v1/products/tiledregion/predict", content=png(frame), headers={"content-type": "image/png"})
    assert r.json()["version"] == 2
    assert r.json()["score"] == pytest.approx(float(expected.predict([frame]).scores[0]), rel=1e-4)
    r = create(client, "badtiles", product, tiles="2y2")
    assert r.status_code == 400 and "RxC" in r.json()["error"]["message"], r.text
    r = create(client, "badtiles", product, tiles="[0, 2]")
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_config", r.text


def test_the_far_rule_at_another_rate_of_a_tiled_product(service, product) -> None:
    """``{"rule": "far"}`` on a tiled product: a new version whose frame threshold is the far rule at
    that rate on the frame calibration, the threshold the console's preview showed, and whose frame
    scores are unchanged (the stored tile scales are kept: hetmm_ray/detection/tiled.py)."""
    from hetmm_ray.core.calibration import TailModel

    client, store = service["client"], open_store(service["store"])
    r = create(client, "tiledfar", product, tiles="2x2")
    assert r.status_code == 200, r.text
    files = [("images", (f"{i}.png", png(f), "image/png")) for i, f in enumerate(_frames(product))]
    before = client.post("/v1/products/tiledfar/predict", files=files)
    assert before.status_code == 200, before.text
    rate = 0.2
    r = client.get("/v1/products/tiledfar/calibration", params={"false_alarm_rate": rate})
    assert r.status_code == 200, r.text
    previewed = r.json()["preview"]["far"]["threshold"]
    body = {"rule": "far", "false_alarm_rate": rate}
    r = client.post("/v1/products/tiledfar/calibrate?wait=true", json=body, headers=ADMIN)
    assert r.status_code == 200 and r.json()["job"]["version"] == 2, r.text
    rec = store.record("tiledfar", 2)
    assert rec.config.threshold.rule == "far" and rec.config.threshold.false_alarm_rate == rate
    expected = TailModel(rec.calibration.scores).threshold(rate)
    assert previewed == pytest.approx(expected) and expected != pytest.approx(before.json()["results"][0]["threshold"])
    after = client.post("/v1/products/tiledfar/predict", files=files)
    assert after.status_code == 200 and after.json()["version"] == 2, after.text
    results = after.json()["results"]
    np.testing.assert_allclose([x["score"] for x in results], [x["score"] for x in before.json()["results"]], rtol=1e-5)
    for x in results:
        assert x["threshold"] == pytest.approx(expected) and x["rule_target"] == rate, x
        assert x["is_anomaly"] == (x["score"] > x["threshold"])


def test_auto_tiles_are_resolved_from_the_uploaded_frames(service) -> None:
    """``tiles: auto`` from the frames' largest side: 160 px on a 64-px canvas needs 2 x 2 (tiles of at
    most 2 frame px per canvas px); 128 px fits at that scale: one tile, an ordinary untiled product."""
    client, store = service["client"], open_store(service["store"])
    big = SyntheticProduct(seed=4, size=160)
    r = create(client, "autotiled", big, tiles="auto")
    assert r.status_code == 200 and r.json()["job"]["tiles"] == [2, 2], r.text
    assert store.record("autotiled").config.geometry.tiles == (2, 2)
    r = create(client, "autoone", SyntheticProduct(seed=4, size=FRAME), tiles="auto")
    job = r.json()["job"]
    assert r.status_code == 200 and "tiles" not in job, r.text
    # an untiled create reports its cost too, measured in the first feature task with its backbone
    assert job["sheets"] == 4 and job["estimated_ms_per_frame"] > 0, job
    rec = store.record("autoone")
    assert rec.config.geometry.tiles == (1, 1) and not any(k.startswith("tile") for k in rec.layers)


def test_min_defect_px_alone_is_the_fits_one_rule_over_http(service, product) -> None:
    """``min_defect_px`` in an HTTP create means what it means in ``hetmm fit --set``, a config file and
    the API (tests/unit/test_geometry_choice.py): the stored product is ``geometry_rule.choose_geometry`` of the
    same settings on the same frames, tiled where the defect size asks for it and stored as given where
    it does not; a grid it contradicts is refused (400) and creates nothing."""
    client, store = service["client"], open_store(service["store"])
    frames = [product.good(i) for i in range(6)]  # what create() uploads
    for name, px in (("defect8", 8), ("defect16", 16)):
        r = create(client, name, product, min_defect_px=str(px))
        assert r.status_code == 200, r.text
        want = choose_geometry(DetectorConfig.from_dict(SMALL).replace(**{"geometry.min_defect_px": px}), frames)
        got = store.record(name).config
        assert got.stored_dict() == want.config.stored_dict()
        assert got.geometry.min_defect_px == px
    assert store.record("defect8").config.geometry.tiles != (1, 1)  # alone, it tiles
    assert store.record("defect16").config.geometry.tiles == (1, 1)
    r = create(client, "defectgrid", product, tiles="2x2", min_defect_px="16")
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_config", r.text
    assert "ask for different grids" in r.json()["error"]["message"], r.text
    assert "defectgrid" not in store.products()


def test_tiled_candidate_and_compare(service, product) -> None:
    """A tiled product's hot update published as a candidate leaves the head serving, its
    (tile, layer) shards loaded on the template hosts beside the head's (on the same hosts); the
    compare job scores whole frames with both versions as the in-process detectors do; promote makes
    the loaded shards the head's (none read again) and the replica serves it."""
    client, store = service["client"], open_store(service["store"])
    assert create(client, "cand", product, tiles="2x2").status_code == 200
    files = [("images", (f"n{i}.png", png(product.good(i)), "image/png")) for i in (50, 51)]
    r = client.post("/v1/products/cand/normals?wait=true&publish=candidate", files=files, headers=ADMIN)
    assert r.status_code == 200 and r.json()["job"]["version"] == 2 and r.json()["job"]["candidate"], r.text
    assert store.head("cand") == 1 and store.candidates("cand") == [2]
    registry = get_registry(service["store"], detached=True)
    head_where = ray.get(registry.placement_of.remote("cand"))
    assert set(head_where) == KEYS
    assert _held_where(registry, "cand", 2, candidate=True) == head_where  # same rule, same hosts
    frames = _frames(product)
    r = client.post("/v1/products/cand/predict", content=png(frames[0]), headers={"content-type": "image/png"})
    assert r.status_code == 200 and r.json()["version"] == 1, r.text
    upload = [("images", (f"f{i}.png", png(f), "image/png")) for i, f in enumerate(frames)]
    r = client.post("/v1/products/cand/versions/2/compare?wait=true", files=upload, headers=ADMIN)
    assert r.status_code == 200, r.text
    result = r.json()["job"]["compare"]
    preds = [load_detector(store, "cand", v, device="cpu").predict(frames) for v in (1, 2)]
    assert result["threshold"]["base"] == pytest.approx(preds[0].threshold, rel=1e-5)
    assert result["threshold"]["candidate"] == pytest.approx(preds[1].threshold, rel=1e-5)
    flips = [f"f{i}.png" for i in range(len(frames)) if preds[0].is_anomaly[i] != preds[1].is_anomaly[i]]
    assert [f["image"] for f in result["flips"]] == flips
    assert result["score_shift"]["base"][0] == pytest.approx(float(min(preds[0].scores)), rel=1e-4)
    assert result["score_shift"]["candidate"][-1] == pytest.approx(float(max(preds[1].scores)), rel=1e-4)
    loads = sum(h["loads"] for h in ray.get(registry.host_holdings.remote()))
    r = client.post("/v1/products/cand/versions/2/promote", headers=ADMIN)
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 120  # the replica swaps within the store-poll bound: generous here
    while (version := _served(client, frames[0])) != 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert version == 2
    assert ray.get(registry.placement_of.remote("cand")) == head_where
    assert _held_where(registry, "cand", 2, candidate=False) == head_where
    assert _held_where(registry, "cand", 2, candidate=True) == {}
    assert sum(h["loads"] for h in ray.get(registry.host_holdings.remote())) == loads


def _served(client: httpx.Client, frame: np.ndarray) -> int:
    r = client.post("/v1/products/cand/predict", content=png(frame), headers={"content-type": "image/png"})
    assert r.status_code == 200, r.text
    return int(r.json()["version"])


def _held_where(registry: Any, product: str, version: int, *, candidate: bool) -> dict[str, int]:
    """layer -> host slot of ``product``'s shards of ``version`` held (as a candidate or as HEAD's)."""
    return {
        layer: host["slot"]
        for host in ray.get(registry.host_holdings.remote())
        for row in host["sets"]
        if (row["product"], row["version"], row["candidate"]) == (product, version, candidate)
        for layer in row["layers"]
    }


@pytest.mark.parametrize("tiles", [None, [2, 2]], ids=["canvas", "tiled"])
def test_the_cli_and_http_give_the_same_heads_at_every_step(service, product, tmp_path, tiles) -> None:
    """The same images and settings through ``hetmm`` on one store and through HTTP on the service's:
    create, a hot update of 4 images, a region, the far rule at 5 %; after each step both heads hold
    the same images and threshold and score the same probe frames (one operation, one path)."""
    from hetmm_ray.cli import main

    client, name = service["client"], f"same-{'tiled' if tiles else 'canvas'}"
    config = {**SMALL, "geometry": {**SMALL["geometry"], **({"tiles": tiles} if tiles else {})}}
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(config))
    cli_store = str(tmp_path / "cli-store")

    def written(folder: str, frames: list[np.ndarray]) -> list[tuple[str, bytes]]:
        (tmp_path / folder).mkdir()
        out = [(f"{folder}{i}.png", png(f)) for i, f in enumerate(frames)]
        for file, data in out:
            (tmp_path / folder / file).write_bytes(data)
        return out

    def uploads(files: list[tuple[str, bytes]]) -> list[tuple[str, tuple[str, bytes, str]]]:
        return [("images", (file, data, "image/png")) for file, data in files]

    probes = _frames(product)

    def same_heads(version: int) -> None:
        stores = open_store(cli_store), open_store(service["store"])
        assert [s.head(name) for s in stores] == [version, version]
        records = [s.record(name, version) for s in stores]
        assert records[0].images == records[1].images
        points = [r.operating_point() for r in records]
        assert points[0].rule == points[1].rule
        assert points[0].threshold == pytest.approx(points[1].threshold, rel=1e-6)
        cli_det, http_det = (load_detector(s, name, device="cpu") for s in stores)
        assert cli_det.config.geometry.tiles == http_det.config.geometry.tiles == tuple(tiles or (1, 1))
        np.testing.assert_allclose(cli_det.predict(probes).scores, http_det.predict(probes).scores, atol=1e-5)

    good = written("good", [product.good(i) for i in range(6)])
    assert (
        main(["fit", str(tmp_path / "good"), "--product", name, "--store", cli_store, "--config", str(config_file)])
        == 0
    )
    r = client.post(
        f"/v1/products/{name}?wait=true", files=uploads(good), data={"config": json.dumps(config)}, headers=ADMIN
    )
    finished_job(client, r, ADMIN)
    same_heads(1)

    new = written("new", [product.good(i) for i in range(50, 54)])
    assert main(["update", str(tmp_path / "new"), "--product", name, "--store", cli_store]) == 0
    r = client.post(f"/v1/products/{name}/normals?wait=true", files=uploads(new), headers=ADMIN)
    assert finished_job(client, r, ADMIN)["added_images"] == 4
    same_heads(2)

    region = {"size": [FRAME, FRAME], "include": [], "exclude": [{"rect": [0, 0, 48, 40]}]}
    (tmp_path / "region.json").write_text(json.dumps(region))
    assert main(["region", "--product", name, "--region", str(tmp_path / "region.json"), "--store", cli_store]) == 0
    finished_job(
        client, client.put(f"/v1/products/{name}/region?wait=true", json={"region": region}, headers=ADMIN), ADMIN
    )
    same_heads(3)

    assert main(["calibrate", "--product", name, "--far", "0.05", "--store", cli_store]) == 0
    body = {"rule": "far", "false_alarm_rate": 0.05}
    finished_job(client, client.post(f"/v1/products/{name}/calibrate?wait=true", json=body, headers=ADMIN), ADMIN)
    same_heads(4)
    assert open_store(cli_store).record(name, 4).config.threshold.false_alarm_rate == 0.05

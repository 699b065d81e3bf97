"""The service follows the store when someone else writes it.

A running service (real Serve over HTTP on 127.0.0.1) and a second writer, the
``hetmm`` CLI, on the same store: a local folder and a bucket on the moto S3
server. A new version, a rollback and a delete made by the CLI each become what
the service answers within the stated bound (ServiceConfig.store_poll_s: about
2 x store_poll_s plus the time to load the version), a deleted product answers
404, and a hot update over HTTP after the CLI moved the head works (no
``StoreConflict``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers import free_port, png
from s3_server import new_bucket

from hetmm_ray.cli import main
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.store import open_store

SIZE = 64
POLL_S = 1.0
# The stated bound for a served product: 2 x store_poll_s + loading the version into its shards
# (about 1 s here), with room for 2 shared, busy cores. A product created again after a delete is
# loaded cold on its first request, like any product the service has not served yet.
BOUND_S = 2 * POLL_S + 5.0
COLD_BOUND_S = 30.0
FLAGS = ["--backbone", "resnet18", "--weights", "random", "--set", f"backbone.image_size={SIZE}"]
FLAGS += ["--set", "threshold.max_images=4", "--set", "threshold.folds=2", "--templates", "pts", "--sheets", "3"]


GEAR = SyntheticProduct(seed=500, size=SIZE)


def folder_of(root: Path, name: str, indices: range) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    for i in indices:
        (folder / f"{i:03d}.png").write_bytes(png(GEAR.good(i)))
    return folder


@pytest.fixture(scope="module")
def ray_with_aws(own_ray, aws_env) -> Iterator[None]:
    import ray
    from helpers import LOCAL_RAY_ARGS

    ray.init(**LOCAL_RAY_ARGS)  # after aws_env: workers inherit the dummy credentials
    yield


@pytest.fixture(scope="module", params=["local", "s3"])
def shared_store(request, tmp_path_factory) -> dict:
    """The store as the service names it, and as the CLI (the second writer) does."""
    if request.param == "local":
        uri = str(tmp_path_factory.mktemp("follow") / "store")
        return {"kind": "local", "uri": uri, "cli": ["--store", uri]}
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = new_bucket(endpoint)
    return {
        "kind": "s3",
        "uri": f"s3://{bucket}/line?endpoint={endpoint}",
        "cli": ["--store", f"s3://{bucket}/line", "--endpoint-url", endpoint],
    }


@pytest.fixture(scope="module")
def service(ray_with_aws, shared_store: dict, tmp_path_factory) -> Iterator[str]:
    from ray import serve

    from hetmm_ray.serve.run import start_service, stop_service

    root = tmp_path_factory.mktemp("images")
    assert (
        main(["fit", str(folder_of(root, "train", range(5))), "--product", "line", *shared_store["cli"], *FLAGS]) == 0
    )
    running = start_service(
        store=shared_store["uri"],
        port=free_port(),
        args={"admin_token_env": "HETMM_TEST_UNSET_TOKEN_11", "store_poll_s": POLL_S},
        deployments={"Detector": {"num_replicas": 1, "user_config": {"batch_wait_timeout_s": 0.002, "threads": 1}}},
    )
    yield running.url
    stop_service(running)
    serve.shutdown()


def predict(c: httpx.Client, product: str = "line") -> httpx.Response:
    return c.post(f"/v1/products/{product}/predict", content=png(GEAR.good(900)), headers={"content-type": "image/png"})


def served_within(c: httpx.Client, expect, what: str, bound: float = BOUND_S) -> float:
    """Seconds until ``expect(response)`` holds for a predict, failing beyond ``bound``."""
    start = time.monotonic()
    while True:
        r = predict(c)
        if expect(r):
            took = time.monotonic() - start
            print(f"\n{what}: served after {took:.1f} s (bound {bound:.0f} s)")
            return took
        assert time.monotonic() - start < bound, f"{what}: still {r.status_code} {r.text[:200]} after {bound} s"
        time.sleep(0.2)


def test_new_version_rollback_and_delete_by_the_cli_are_served(
    service: str, shared_store: dict, tmp_path: Path
) -> None:
    cli = shared_store["cli"]
    store = open_store(shared_store["uri"])
    with httpx.Client(base_url=service, timeout=120) as c:
        assert predict(c).json()["version"] == 1
        # A new version by the second writer.
        assert main(["update", str(folder_of(tmp_path, "more", range(20, 22))), "--product", "line", *cli]) == 0
        assert store.head("line") == 2
        served_within(c, lambda r: r.status_code == 200 and r.json()["version"] == 2, "CLI update (v2)")
        # A rollback by the second writer.
        assert main(["rollback", "--product", "line", "--version", "1", *cli]) == 0
        served_within(c, lambda r: r.status_code == 200 and r.json()["version"] == 1, "CLI rollback (v1)")
        listed = {p["product"]: p for p in c.get("/v1/products").json()["products"]}
        assert listed["line"]["version"] == 1
        # A hot update over HTTP now builds on the head the CLI set (v1), as v3: no StoreConflict.
        files = [("images", ("h.png", png(GEAR.good(40)), "image/png"))]
        r = c.post("/v1/products/line/normals?wait=true", files=files)
        assert r.status_code == 200, r.text
        assert r.json()["job"]["version"] == 3 and store.get("line").meta["parent"] == 1
        assert predict(c).json()["version"] == 3
        # A delete by the second writer: the product is gone from the service too.
        assert main(["delete", "--product", "line", "--yes", *cli]) == 0
        served_within(c, lambda r: r.status_code == 404 and r.json()["error"]["code"] == "unknown_product", "delete")
        assert "line" not in {p["product"] for p in c.get("/v1/products").json()["products"]}
        # Created again under the same name: served as the new product's v1.
        train = folder_of(tmp_path, "again", range(60, 64))
        assert main(["fit", str(train), "--product", "line", *cli, *FLAGS]) == 0
        served_within(c, lambda r: r.status_code == 200 and r.json()["version"] == 1, "re-created (v1)", COLD_BOUND_S)


def test_a_store_that_cannot_be_read_keeps_the_last_version_serving(service: str, shared_store: dict) -> None:
    """The poll failing (here: a garbage HEAD) is logged and retried; the service keeps its version."""
    store = open_store(shared_store["uri"])
    with httpx.Client(base_url=service, timeout=120) as c:
        version = predict(c).json()["version"]
        good, _ = store.backend.read("line/HEAD")
        store.backend.write("line/HEAD", b"{garbage")
        time.sleep(3 * POLL_S)
        r = predict(c)
        assert r.status_code == 200 and r.json()["version"] == version
        store.backend.write("line/HEAD", good)
        assert os.environ.get("HETMM_TEST_UNSET_TOKEN_11") is None

"""gRPC: hetmm.v1.Inspection on Serve's real gRPC proxy (127.0.0.1), beside HTTP.

The service runs with an admin token (an env variable of this module's own) on loopback, small
limits (1 MiB of images, 3 images per request) and a tiny synthetic product. ``Predict`` must give
the HTTP answer for the same image (heat-map included); every bad input gets the gRPC code of its
HTTP status (``errors.GRPC_CODES``, the gRPC reference's table) and the stable code in its details, and the
service keeps serving after each.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import zlib
from collections.abc import Iterator

import grpc
import httpx
import pytest
from helpers import free_port, png

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.errors import GRPC_CODES
from hetmm_ray.store import open_store

SIZE = 64
TOKEN_ENV = "HETMM_TEST_GRPC_TOKEN_25"
TOKEN = "grpc-test-token"


def config() -> DetectorConfig:
    return DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        templates=TemplateConfig(kind="pts_o", sheets=3),
        threshold=ThresholdConfig(max_images=4, folds=2),
        batch_size=8,
    )


GEAR = SyntheticProduct(seed=2501, size=SIZE)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    uri = str(tmp_path_factory.mktemp("grpc") / "store")
    HETMM(config()).fit([GEAR.good(j) for j in range(5)]).save(open_store(uri), "gear")
    return uri


@pytest.fixture(scope="module")
def service(own_ray, store: str) -> Iterator[tuple[str, str]]:
    import ray
    from helpers import LOCAL_RAY_ARGS
    from ray import serve

    from hetmm_ray.serve.run import start_service, stop_service

    ray.init(**LOCAL_RAY_ARGS)
    os.environ[TOKEN_ENV] = TOKEN
    running = start_service(
        store=store,
        port=free_port(),
        grpc_port=free_port(),
        args={"admin_token_env": TOKEN_ENV, "max_body_mib": 1, "max_images_per_request": 3, "store_poll_s": 0.5},
        deployments={
            "Detector": {
                "num_replicas": 1,
                "user_config": {"max_batch_size": 8, "batch_wait_timeout_s": 0.0, "threads": 1},
            }
        },
    )
    assert running.grpc_target is not None
    yield running.url, running.grpc_target
    stop_service(running)
    serve.shutdown()
    os.environ.pop(TOKEN_ENV, None)


@pytest.fixture(scope="module")
def client(service: tuple[str, str]) -> Iterator[object]:
    from hetmm_ray.serve.grpc.client import InspectionClient

    with InspectionClient(service[1], timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def admin(service: tuple[str, str]) -> Iterator[object]:
    from hetmm_ray.serve.grpc.client import InspectionClient

    with InspectionClient(service[1], token=TOKEN, timeout=120) as c:
        yield c


def _comparable(result: dict) -> dict:
    """The fields that must agree between the two surfaces (timing is per request)."""
    keys = ("score", "threshold", "is_anomaly", "threshold_rule", "rule_target", "estimated_false_alarm_rate")
    return {k: result.get(k) for k in (*keys, "version")}


def _as_dict(r) -> dict:
    out = {"score": r.score, "threshold": r.threshold, "is_anomaly": r.is_anomaly, "version": r.version}
    for k in ("threshold_rule", "rule_target", "estimated_false_alarm_rate"):
        out[k] = getattr(r, k) if r.HasField(k) else None
    return out


def test_predict_equals_the_http_answer(service, client) -> None:
    url, _ = service
    image = png(GEAR.defective(0, "scratch")[0])
    http = httpx.post(
        f"{url}/v1/products/gear/predict?map=png", content=image, headers={"content-type": "image/png"}, timeout=120
    )
    assert http.status_code == 200, http.text
    expected = http.json()
    reply = client.predict("gear", [("part.png", image)], heatmap=True)
    assert reply.product == "gear" and reply.version == expected["version"] and len(reply.results) == 1
    got = reply.results[0]
    assert _as_dict(got) == _comparable(expected)
    assert got.name == "part.png"
    assert got.heatmap_png == base64.b64decode(expected["heatmap_png"])
    assert (got.heatmap_scale.vmin, got.heatmap_scale.vmax) == (
        expected["heatmap_scale"]["vmin"],
        expected["heatmap_scale"]["vmax"],
    )
    assert got.timing.score_ms > 0 and got.timing.batch_images >= 1 and got.timing.replica


def test_several_images_in_one_request(client) -> None:
    images = [(f"g{i}.png", png(GEAR.good(10 + i))) for i in range(3)]
    reply = client.predict("gear", images)
    assert [r.name for r in reply.results] == [n for n, _ in images]
    assert not reply.results[0].heatmap_png


def test_list_products_and_health(service, client) -> None:
    url, _ = service
    listed = client.list_products()
    http = httpx.get(f"{url}/v1/products", timeout=60).json()["products"]
    assert [json.loads(p.json) for p in listed.products] == http
    assert [p.product for p in listed.products] == ["gear"]
    assert client.health().status == "ok"


def test_threshold_override_with_the_token(client, admin) -> None:
    image = [("g.png", png(GEAR.good(20)))]
    plain = client.predict("gear", image).results[0]
    for threshold in (plain.score - 1e-3, plain.score + 1e-3):
        r = admin.predict("gear", image, threshold=threshold).results[0]
        assert r.score == pytest.approx(plain.score, rel=1e-6)
        assert r.threshold == threshold and r.is_anomaly == (r.score > threshold)
        assert r.threshold_rule == "override" and not r.HasField("estimated_false_alarm_rate")


def _png_declaring(side: int) -> bytes:
    """A tiny valid PNG whose header declares ``side x side`` pixels (a decompression bomb)."""
    data = bytearray(png(GEAR.good(3)[:16, :16]))
    data[16:24] = struct.pack(">II", side, side)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def _bad_cases() -> list[tuple[str, dict, int, str]]:
    good = png(GEAR.good(1))
    return [
        ("decompression_bomb", {"images": [("bomb.png", _png_declaring(100_000))]}, 400, "bad_image"),
        ("truncated_png", {"images": [("cut.png", good[: len(good) // 2])]}, 400, "bad_image"),
        ("one_bad_of_several", {"images": [("g.png", good), ("x.png", b"GIF89a....")]}, 400, "bad_image"),
        ("oversized", {"images": [("big.png", b"\x89PNG" + b"\0" * (1536 * 1024))]}, 413, "too_large"),
        ("not_an_image", {"images": [("x.png", b"this is not an image at all")]}, 400, "bad_image"),
        ("unknown_product", {"product": "nosuch", "images": [("g.png", good)]}, 404, "unknown_product"),
        ("bad_product_name", {"product": "../etc", "images": [("g.png", good)]}, 400, "bad_product_name"),
        ("too_many_images", {"images": [(f"{i}.png", good) for i in range(4)]}, 413, "too_many_images"),
        ("no_images", {"images": []}, 400, "empty_body"),
        ("override_without_token", {"images": [("g.png", good)], "threshold": 0.5}, 401, "unauthorized"),
        ("override_wrong_token", {"images": [("g.png", good)], "threshold": 0.5, "token": "nope"}, 403, "forbidden"),
        ("version_moved", {"images": [("g.png", good)], "version": 999}, 409, "version_moved"),
    ]


@pytest.mark.parametrize(("name", "call", "status", "code"), _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_bad_input_gets_its_mapped_status(service, client, name, call, status, code) -> None:
    from hetmm_ray.serve.grpc.client import InspectionClient, error_code

    call = dict(call)
    token = call.pop("token", None)
    product = call.pop("product", "gear")
    with InspectionClient(service[1], token=token, timeout=120) as c:
        with pytest.raises(grpc.RpcError) as caught:
            c.predict(product, call.pop("images"), **call)
    assert caught.value.code() == getattr(grpc.StatusCode, GRPC_CODES[status]), caught.value.details()
    assert error_code(caught.value) == code, caught.value.details()
    # and the service keeps serving
    assert client.predict("gear", [("g.png", png(GEAR.good(2)))]).results[0].version >= 1


def test_cli_predict_over_grpc(service, client, tmp_path, capsys) -> None:
    """``hetmm predict --grpc HOST:PORT`` prints the in-process command's lines from the service's answers."""
    from hetmm_ray import cli

    paths = []
    for i in range(5):  # more than the service's 3 images per request: the client splits its requests
        paths.append(tmp_path / f"part{i}.png")
        paths[-1].write_bytes(png(GEAR.good(30 + i)))
    out = tmp_path / "r.json"
    assert cli.main(["predict", "--grpc", service[1], "--product", "gear", *map(str, paths), "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    records = json.loads(out.read_text())
    assert [r["image"] for r in records] == [str(p) for p in paths]
    expected = [client.predict("gear", [(str(p), p.read_bytes())]).results[0] for p in paths]
    assert [r["score"] for r in records] == pytest.approx([e.score for e in expected], abs=1e-5)
    assert lines[-1].startswith("5 images, product gear v")
    assert cli.main(["predict", "--grpc", service[1], "--product", "nosuch", str(paths[0])]) == 2
    assert "NOT_FOUND: unknown_product:" in capsys.readouterr().err


def test_cli_predict_over_grpc_writes_what_in_process_writes(service, store, tmp_path, capsys) -> None:
    """A folder with same-named files in sub-folders and an unreadable file: ``--grpc`` skips the bad
    file and goes on (exit 1), and writes its heat-maps and JSON records under the names the
    in-process command uses (``a/x_heatmap.png``, ``b/x_heatmap.png``: before, both went to
    ``x.png_heatmap.png``, the second over the first), with the same fields."""
    from hetmm_ray import cli

    folder = tmp_path / "parts"
    for sub, i in (("a", 0), ("b", 1), ("b", 2)):
        (folder / sub).mkdir(parents=True, exist_ok=True)
        (folder / sub / ("x.png" if i < 2 else "z.png")).write_bytes(png(GEAR.good(50 + i)))
    (folder / "a" / "y.png").write_bytes(b"not an image")
    runs = {}
    for how, extra in (("grpc", ["--grpc", service[1]]), ("in_process", ["--store", store])):
        out, js = tmp_path / f"maps_{how}", tmp_path / f"{how}.json"
        argv = ["predict", str(folder), "--product", "gear", "--out", str(out), "--json", str(js), *extra]
        assert cli.main(argv) == 1  # one file skipped
        assert "hetmm: skipped: " in capsys.readouterr().err
        runs[how] = (sorted(p.relative_to(out).as_posix() for p in out.rglob("*.png")), json.loads(js.read_text()))
    maps, records = runs["grpc"]
    assert maps == runs["in_process"][0] == ["a/x_heatmap.png", "b/x_heatmap.png", "b/z_heatmap.png"]
    expected = runs["in_process"][1]
    assert [r["image"] for r in records] == [r["image"] for r in expected]
    assert [sorted(r) for r in records] == [sorted(r) for r in expected]
    assert [r["score"] for r in records] == pytest.approx([r["score"] for r in expected], abs=1e-4)


def _noise_png(seed: int, side: int = 420) -> bytes:
    """A PNG of random pixels: about 0.5 MB, so that three exceed the service's 1 MiB of images."""
    import numpy as np

    return png(np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8))


@pytest.mark.parametrize("limit", ["too_many_images", "too_large"])
def test_predict_all_fits_its_requests_to_the_service(client, limit) -> None:
    """``predict_all`` with requests larger than this service takes (3 images, 1 MiB of images): every
    image scored once, in order, as it scores alone; a lone image over the limit stays refused."""
    from hetmm_ray.serve.grpc.client import error_code

    if limit == "too_many_images":
        images = [(f"g{i}.png", png(GEAR.good(40 + i))) for i in range(7)]
    else:
        images = [(f"n{i}.png", _noise_png(i)) for i in range(4)]
        assert sum(len(d) for _, d in images) > 2**20 > max(len(d) for _, d in images)
    sent = iter(images)
    results = list(client.predict_all("gear", sent, per_request=8, max_bytes=64 * 2**20))
    assert next(sent, None) is None  # all read
    assert [r.name for r in results] == [n for n, _ in images]
    alone = [client.predict("gear", [im]).results[0].score for im in images]
    assert [r.score for r in results] == pytest.approx(alone, abs=1e-5)
    if limit == "too_large":
        with pytest.raises(grpc.RpcError) as caught:
            list(client.predict_all("gear", [("big.png", _noise_png(9, side=700))]))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and error_code(caught.value) == "too_large"

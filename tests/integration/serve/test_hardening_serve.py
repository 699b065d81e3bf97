"""Hardening, against the running service: real Serve over HTTP on 127.0.0.1, real stores.

A hostile client (cross-origin pages, deep JSON, NaN settings, slow bodies, sources
outside what the operator allowed, endpoints of its choosing) and a careless one
(retries, too many images). The service runs without an admin token (the loopback
default) so the cross-origin rule is tested where it matters most. Ray is started
here with dummy AWS credentials in its environment, so its workers reach the moto
S3 server (tests/integration/store/test_store.py's fixtures) for S3 sources.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from helpers import free_port, png
from s3_server import new_bucket, s3_admin

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.errors import Refused
from hetmm_ray.serve.security import resolve_source
from hetmm_ray.store import open_store

SIZE = 64
BODY_TIMEOUT_S = 3.0
NO_TOKEN_ENV = "HETMM_TEST_UNSET_TOKEN_11"


def config() -> DetectorConfig:
    return DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        templates=TemplateConfig(kind="pts_o", sheets=3),
        threshold=ThresholdConfig(max_images=4, folds=2),
        batch_size=8,
    )


def gear(i: int) -> SyntheticProduct:
    return SyntheticProduct(seed=300 + i, size=SIZE)


def strict_json(text: str) -> object:
    """JSON as a browser parses it: NaN/Infinity are errors."""
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in a JSON response"))


@pytest.fixture(scope="module")
def ray_with_aws(own_ray, aws_env) -> Iterator[None]:
    import ray
    from helpers import LOCAL_RAY_ARGS

    ray.init(**LOCAL_RAY_ARGS)  # after aws_env: workers inherit the dummy credentials
    yield


@pytest.fixture(scope="module")
def roots(tmp_path_factory, s3_endpoint) -> dict[str, str]:
    local = tmp_path_factory.mktemp("allowed")
    bucket = new_bucket(s3_endpoint)
    for i in range(3):
        s3_admin(s3_endpoint).put_object(Bucket=bucket, Key=f"allowed/good/{i}.png", Body=png(gear(5).good(i)))
        s3_admin(s3_endpoint).put_object(Bucket=bucket, Key=f"private/{i}.png", Body=png(gear(5).good(i)))
    return {
        "local": str(local),
        "s3": f"s3://{bucket}/allowed?endpoint={s3_endpoint}",
        "bucket": bucket,
    }


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    uri = str(tmp_path_factory.mktemp("hardening") / "store")
    s = open_store(uri)
    for i, product in enumerate(("p0", "idem")):
        HETMM(config()).fit([gear(i).good(j) for j in range(5)]).save(s, product)
    return uri


@pytest.fixture(scope="module")
def service(ray_with_aws, store: str, roots: dict[str, str]) -> Iterator[str]:
    from ray import serve

    from hetmm_ray.serve.run import start_service, stop_service

    os.environ.pop(NO_TOKEN_ENV, None)
    running = start_service(
        store=store,
        port=free_port(),
        args={
            "admin_token_env": NO_TOKEN_ENV,  # unset: no token, the loopback default
            "max_body_mib": 4,
            "body_timeout_s": BODY_TIMEOUT_S,
            "store_poll_s": 0.5,
            "source_roots": [roots["local"], roots["s3"]],
        },
        deployments={
            "Detector": {
                "num_replicas": 1,
                "user_config": {"max_batch_size": 8, "batch_wait_timeout_s": 0.002, "threads": 1},
            }
        },
    )
    yield running.url
    stop_service(running)
    serve.shutdown()


@pytest.fixture(scope="module")
def client(service: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service, timeout=120) as c:
        yield c


def predict(c: httpx.Client, product: str, image: np.ndarray, **headers: str) -> httpx.Response:
    headers = {"content-type": "image/png", **headers}
    return c.post(f"/v1/products/{product}/predict", content=png(image), headers=headers)


def job_of(c: httpx.Client, r: httpx.Response) -> dict:
    assert r.status_code in (200, 202), r.text
    job = r.json()["job"]
    deadline = time.monotonic() + 300
    while job["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.3)
        job = c.get(f"/v1/jobs/{job['id']}").json()["job"]
    return job


def error_code(r: httpx.Response) -> str:
    assert r.headers["content-type"].startswith("application/json"), (r.status_code, r.text)
    return strict_json(r.text)["error"]["code"]


# --- 9 ------------------------------------------------------------------------------------------
def test_more_images_than_the_limit_is_413_too_many_images(client: httpx.Client) -> None:
    files = [("images", (f"{i}.png", png(gear(0).good(i)), "image/png")) for i in range(17)]
    r = client.post("/v1/products/p0/predict", files=files)
    assert r.status_code == 413 and error_code(r) == "too_many_images", r.text
    files = files[:16]  # the limit itself is fine
    assert client.post("/v1/products/p0/predict", files=files).status_code == 200


def test_admin_delete_removes_a_product(client: httpx.Client, store: str) -> None:
    HETMM(config()).fit([gear(7).good(j) for j in range(3)]).save(open_store(store), "doomed")
    assert predict(client, "doomed", gear(7).good(50)).status_code == 200
    r = client.delete("/v1/products/doomed")
    assert r.status_code == 200 and r.json() == {"product": "doomed", "deleted": True}
    assert "doomed" not in open_store(store).products()
    assert list(open_store(store).backend.list("doomed/")) == []
    r = predict(client, "doomed", gear(7).good(50))
    assert r.status_code == 404 and error_code(r) == "unknown_product"
    assert "doomed" not in {p["product"] for p in client.get("/v1/products").json()["products"]}
    r = client.delete("/v1/products/doomed")
    assert r.status_code == 404 and error_code(r) == "unknown_product"
    assert client.delete("/v1/products/bad*name").status_code == 400


# --- 3 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body, code",
    [
        ('{"source": "/x", "config": {"threshold": {"sigmas": Infinity}}}', "bad_json"),
        ('{"source": "/x", "config": {"threshold": {"sigmas": NaN}}}', "bad_json"),
        ('{"source": "/x", "config": {"threshold": {"sigmas": 1e999}}}', "bad_config"),
        ('{"source": "/x", "config": {"scoring": {"score_sigma": 1e9}}}', "bad_config"),
        ('{"source": "/x", "config": {"scoring": {"output_size": -5}}}', "bad_config"),
        ('{"source": "/x", "config": {"scoring": {"forward_windows": [100001, 7, 5]}}}', "bad_config"),
    ],
)
def test_non_finite_or_out_of_range_settings_are_400_over_http(
    client: httpx.Client, roots: dict[str, str], body: str, code: str
) -> None:
    folder = Path(roots["local"]) / "cfg"
    for i in range(2):
        save = folder / f"{i}.png"
        if not save.exists():
            folder.mkdir(exist_ok=True)
            save.write_bytes(png(gear(8).good(i)))
    json_body = body.replace('"/x"', json.dumps(str(folder)))  # a real source: only the config is wrong
    r = client.post("/v1/products/newp", content=json_body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and error_code(r) == code, r.text
    files = [("images", (f"{i}.png", png(gear(8).good(i)), "image/png")) for i in range(2)]
    text = body[body.index('"config": ') + 10 : -1]  # the same config as a multipart field
    r = client.post("/v1/products/newp", files=files, data={"config": text})
    assert r.status_code == 400 and error_code(r) == code, r.text
    assert client.get("/v1/products").status_code == 200


def test_a_bad_stored_product_breaks_neither_the_list_nor_json(client: httpx.Client, store: str) -> None:
    """A product stored before validation, with sigmas=Infinity: listed with its error, never a 500."""
    from hetmm_ray.store.versioned import _canonical, _sha256

    s = open_store(store)
    HETMM(config()).fit([gear(9).good(j) for j in range(3)]).save(s, "legacy")
    manifest = json.loads(s.backend.read("legacy/versions/000001.json")[0])
    manifest.pop("sha256")
    manifest["config"]["threshold"]["sigmas"] = math.inf
    manifest["sha256"] = _sha256(_canonical(manifest))
    s.backend.delete(["legacy/versions/000001.json"])
    s.backend.write("legacy/versions/000001.json", json.dumps(manifest).encode())
    r = client.get("/v1/products")
    assert r.status_code == 200
    listed = {p["product"]: p for p in strict_json(r.text)["products"]}
    assert "error" in listed["legacy"] and listed["p0"]["threshold"] > 0
    r = predict(client, "legacy", gear(9).good(40))
    assert r.status_code != 500 and r.status_code >= 400 and error_code(r), r.text
    assert client.delete("/v1/products/legacy").status_code == 200  # and the operator can remove it


def test_json_responses_never_hold_non_finite_numbers() -> None:
    from hetmm_ray.serve.security import JSONResponse

    body = JSONResponse({"threshold": math.inf, "scores": [1.0, math.nan], "ok": 0.5}).body
    assert strict_json(body.decode()) == {"threshold": None, "scores": [1.0, None], "ok": 0.5}


# --- 4 ------------------------------------------------------------------------------------------
def test_deeply_nested_json_is_400_not_500(client: httpx.Client) -> None:
    deep = "[" * 200_000 + "]" * 200_000
    nested40 = json.dumps({"source": "/x", "config": json.loads("{" + '"a": {' * 39 + "}" * 40)})
    json_headers = {"content-type": "application/json"}
    for path, body in (
        ("/v1/products/newp", deep),
        ("/v1/products/newp", '{"source": "/x", "config": ' + deep + "}"),
        ("/v1/products/newp", nested40),
        ("/v1/products/p0/rollback", '{"version": ' + deep + "}"),
    ):
        r = client.post(path, content=body, headers=json_headers)
        assert r.status_code == 400 and error_code(r) == "bad_json", (path, r.status_code, r.text[:200])
    files = [("images", (f"{i}.png", png(gear(8).good(i)), "image/png")) for i in range(2)]
    r = client.post("/v1/products/newp", files=files, data={"config": "{" + '"a":' * 5000 + "1" + "}" * 5000})
    assert r.status_code == 400 and error_code(r) == "bad_json", r.text[:300]
    assert client.get("/healthz").status_code == 200


def test_a_source_with_a_300_character_component_is_400(client: httpx.Client, roots: dict[str, str]) -> None:
    r = client.post("/v1/products/newp", json={"source": os.path.join(roots["local"], "a" * 300, "b")})
    assert r.status_code == 400 and error_code(r) == "bad_source", r.text


def raw_exchange(url: str, data: bytes, *, then: bytes = b"", wait_s: float = 15.0) -> tuple[float, bytes]:
    """Send ``data`` on a raw connection (and ``then`` nothing more); the answer and when it came."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait_s) as s:
        start = time.monotonic()
        s.sendall(data)
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
                if b"\r\n\r\n" in answer:
                    head, _, body = answer.partition(b"\r\n\r\n")
                    length = [h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")]
                    if length and len(body) >= int(length[0].split(b":")[1]):
                        break
        except TimeoutError:
            pass
        return time.monotonic() - start, answer


def test_a_slow_body_is_a_json_408_within_the_body_timeout(service: str) -> None:
    head = (
        b"POST /v1/products/p0/predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
        b"Content-Length: 5000\r\n\r\n" + png(gear(0).good(1))[:100]
    )
    took, answer = raw_exchange(service, head)
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b"application/json" in rest.split(b"\r\n\r\n")[0].lower()
    assert strict_json(rest.split(b"\r\n\r\n", 1)[1].decode())["error"]["code"] == "body_timeout"
    assert BODY_TIMEOUT_S <= took < BODY_TIMEOUT_S + 3, took


def test_a_non_numeric_content_length_is_a_400(service: str, client: httpx.Client) -> None:
    """Answered by Serve's uvicorn before the application runs (plain text; see docs/service.md)."""
    _, answer = raw_exchange(
        service, b"POST /v1/products/p0/predict HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", wait_s=5
    )
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert predict(client, "p0", gear(0).good(3)).status_code == 200


# --- 7 ------------------------------------------------------------------------------------------
def test_cross_origin_writes_are_refused_without_a_token(client: httpx.Client, service: str, store: str) -> None:
    files = [("images", ("n.png", png(gear(0).good(90)), "image/png"))]
    head = open_store(store).head("p0")
    for headers in (
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": service.replace("127.0.0.1", "localhost")},  # another origin, even if the same machine
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "http://evil.example", "Sec-Fetch-Site": "same-origin"},  # Origin decides
    ):
        r = client.post("/v1/products/p0/normals?wait=true", files=files, headers=headers)
        assert r.status_code == 403 and error_code(r) == "cross_origin", (headers, r.text)
        r = client.post("/v1/products/p0/rollback", json={"version": 1}, headers=headers)
        assert r.status_code == 403, headers
        assert client.delete("/v1/products/p0", headers=headers).status_code == 403
        assert predict(client, "p0", gear(0).good(3), **headers).status_code == 403
    assert open_store(store).head("p0") == head and "p0" in open_store(store).products()
    # Reads stay open to any page; the service's own origin and non-browser clients may write.
    assert client.get("/v1/products", headers={"Origin": "http://evil.example"}).status_code == 200
    own = {"Origin": service, "Sec-Fetch-Site": "same-origin"}
    assert predict(client, "p0", gear(0).good(3), **own).status_code == 200
    assert predict(client, "p0", gear(0).good(3)).status_code == 200


def test_allowed_origins_are_a_configured_exception() -> None:
    from hetmm_ray.serve.security import origin_allowed

    host = {"host": "127.0.0.1:8000"}
    assert origin_allowed({**host, "origin": "http://127.0.0.1:8000"}, "http", ())
    assert not origin_allowed({**host, "origin": "https://console.example"}, "http", ())
    assert origin_allowed({**host, "origin": "https://console.example"}, "http", ("https://console.example",))
    assert origin_allowed({**host, "origin": "https://console.example:443"}, "http", ("https://console.example",))
    assert origin_allowed({**host, "sec-fetch-site": "none"}, "http", ())  # typed into the address bar


# --- 6 ------------------------------------------------------------------------------------------
def test_sources_are_refused_without_configured_roots() -> None:
    for source in ("/data", "s3://b/p", ""):
        with pytest.raises(Refused, match="server-side sources are disabled"):
            resolve_source(source, ())


def test_sources_outside_the_roots_are_refused_quickly_and_silently(
    client: httpx.Client, roots: dict[str, str], tmp_path: Path
) -> None:
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "passwd.png").write_bytes(png(gear(0).good(0)))
    link = Path(roots["local"]) / "escape"
    link.symlink_to(outside)
    for source in ("/", "/root", str(Path.home()), "", ".", "relative/dir", str(outside), str(link),
                   f"{roots['local']}/../{outside.name}", f"s3://{roots['bucket']}/private",
                   f"s3://{roots['bucket']}/allowed/../private", "s3://other-bucket/allowed/good",
                   f"file://{outside}"):  # fmt: skip
        start = time.monotonic()
        r = client.post("/v1/products/newp?wait=true", json={"source": source})
        assert r.status_code == 400 and error_code(r) == "bad_source", (source, r.text)
        assert time.monotonic() - start < 2.0, source
        assert "passwd" not in r.text and "secret" not in r.text.replace(str(outside), "")


def test_s3_sources_never_take_an_endpoint_from_the_client(client: httpx.Client, roots: dict[str, str]) -> None:
    trap = socket.socket()
    trap.bind(("127.0.0.1", 0))
    trap.listen(8)
    trap.settimeout(0.2)
    port = trap.getsockname()[1]
    try:
        for source in (
            f"s3://{roots['bucket']}/allowed/good?endpoint=http://127.0.0.1:{port}",
            f"s3://{roots['bucket']}/allowed/good?region=x&endpoint=http://127.0.0.1:{port}",
            f"s3://{roots['bucket']}/allowed/good#?endpoint=http://127.0.0.1:{port}",
        ):
            r = client.post("/v1/products/newp?wait=true", json={"source": source})
            assert r.status_code == 400 and error_code(r) == "bad_source", (source, r.text)
        time.sleep(0.5)
        with pytest.raises(TimeoutError):
            trap.accept()  # nobody called the client's address
    finally:
        trap.close()


def test_sources_under_the_roots_work(client: httpx.Client, roots: dict[str, str], store: str) -> None:
    cfg = config().to_dict()
    r = client.post("/v1/products/from-s3?wait=true", json={"source": f"s3://{roots['bucket']}/allowed/good",
                                                             "config": cfg})  # fmt: skip
    assert job_of(client, r)["state"] == "succeeded"
    assert open_store(store).get("from-s3").n_images == 3
    folder = Path(roots["local"]) / "line1" / "good"
    folder.mkdir(parents=True)
    for i in range(2):
        (folder / f"{i}.png").write_bytes(png(gear(6).good(i)))
    r = client.post("/v1/products/from-folder?wait=true", json={"source": str(folder), "config": cfg})
    assert job_of(client, r)["state"] == "succeeded"
    assert predict(client, "from-folder", gear(6).good(9)).json()["version"] == 1


# --- 5 ------------------------------------------------------------------------------------------
def test_normals_are_idempotent_by_content(client: httpx.Client, store: str) -> None:
    def threshold() -> float:
        return {p["product"]: p for p in client.get("/v1/products").json()["products"]}["idem"]["threshold"]

    files = [("images", (f"n{i}.png", png(gear(1).good(60 + i)), "image/png")) for i in range(2)]
    job = job_of(client, client.post("/v1/products/idem/normals?wait=true", files=files))
    assert job["state"] == "succeeded" and job["version"] == 2
    assert job["skipped_duplicates"] == 0 and job["added_images"] == 2
    before = threshold()
    again = files + [("images", ("old.png", png(gear(1).good(0)), "image/png"))]  # a training image too
    for _ in range(2):  # client retries
        job = job_of(client, client.post("/v1/products/idem/normals?wait=true", files=again))
        assert job["state"] == "succeeded" and job["version"] == 2, job
        assert job["skipped_duplicates"] == 3 and job["added_images"] == 0
    s = open_store(store)
    assert s.versions("idem") == [1, 2] and s.get("idem").n_images == 7
    assert threshold() == before
    assert predict(client, "idem", gear(1).good(99)).json()["version"] == 2


# --- 2 ------------------------------------------------------------------------------------------
SLOW = 300
DISCONNECTING = 30


ARRIVAL_S = 2.0  # the slow clients connect spread over this long, not all at once


async def _slow_client(
    port: int, product: str, disconnect_after_s: float | None, delay_s: float = 0.0, trickle: bool = True
) -> tuple[str, float]:
    """Predict headers, then one byte a second (``trickle``) or 100 bytes and silence: the outcome
    ('408', 'dropped', 'closed', other) and when."""
    await asyncio.sleep(delay_s)
    loop = asyncio.get_running_loop()
    start = loop.time()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST /v1/products/{product}/predict HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: image/png\r\nContent-Length: 100000\r\n\r\n".encode()
    )
    answer = b""
    if not trickle:
        writer.write(b"\x89" * 100)
    try:
        while loop.time() - start < BODY_TIMEOUT_S + 20:
            if disconnect_after_s is not None and loop.time() - start > disconnect_after_s:
                return "closed", loop.time() - start
            if trickle:
                writer.write(b"\x89")
            await writer.drain()
            try:
                chunk = await asyncio.wait_for(reader.read(65536), 1.0)
            except TimeoutError:
                continue
            if not chunk:
                return ("dropped" if not answer else answer.split(b" ")[1].decode()), loop.time() - start
            answer += chunk
            if b"\r\n\r\n" in answer:
                head, _, body = answer.partition(b"\r\n\r\n")
                with_length = [h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")]
                if with_length and len(body) >= int(with_length[0].split(b":")[1]):
                    status = head.split(b" ")[1].decode()
                    if status == "408":
                        assert b"application/json" in head.lower()
                        assert strict_json(body.decode())["error"]["code"] == "body_timeout"
                    return status, loop.time() - start
        return "still open", loop.time() - start
    except (ConnectionError, OSError):
        return "dropped", loop.time() - start
    finally:
        writer.close()


def _ingress_errors() -> list[str]:
    """ERROR lines (and what follows them) in the ingress replicas' logs."""
    from hetmm_ray.compat.ray import driver_node

    logs = Path(driver_node().get_session_dir_path()) / "logs" / "serve"
    found = []
    for f in sorted(logs.glob("replica_hetmm_Ingress_*.log")):
        lines = f.read_text().splitlines()
        found += ["\n".join(lines[i : i + 30]) for i, line in enumerate(lines) if line.startswith("ERROR")]
    return found


def test_slow_clients_do_not_stall_others(client: httpx.Client, service: str) -> None:
    """300 slow bodies (and 30 that hang up mid-body) while a normal client keeps being answered promptly."""
    port = int(service.rsplit(":", 1)[1])
    assert predict(client, "p0", gear(0).good(6)).status_code == 200  # p0 loaded: slow clients are the test
    baseline = []  # the same client without slow ones, for the record (the machine may be shared)
    for _ in range(20):
        t0 = time.monotonic()
        assert predict(client, "p0", gear(0).good(7)).status_code == 200
        baseline.append(time.monotonic() - t0)
    errors_before = _ingress_errors()
    metrics_before = client.get("/metrics").text
    outcomes: list[tuple[str, float]] = []

    async def crowd() -> None:
        n = SLOW + DISCONNECTING
        # Of 330: every 11th hangs up mid-body (30), every 10th of the others trickles a byte a second
        # (30; each byte costs Serve's proxy and the ingress an actor call), the rest stall (270).
        tasks = [
            _slow_client(port, "p0", 1.5 if i % 11 == 0 else None, ARRIVAL_S * i / n, trickle=i % 10 == 0)
            for i in range(n)
        ]
        outcomes.extend(await asyncio.gather(*tasks))

    crowd_thread = threading.Thread(target=lambda: asyncio.run(crowd()))
    crowd_thread.start()
    time.sleep(0.5)  # slow connections are arriving and holding their requests
    latencies = []
    image = png(gear(0).good(7))
    with httpx.Client(base_url=service, timeout=60) as normal:
        deadline = time.monotonic() + ARRIVAL_S + BODY_TIMEOUT_S + 2
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            r = normal.post("/v1/products/p0/predict", content=image, headers={"content-type": "image/png"})
            latencies.append(time.monotonic() - t0)
            assert r.status_code == 200, r.text
    crowd_thread.join(timeout=120)
    assert not crowd_thread.is_alive()
    p99 = float(np.percentile(latencies, 99))
    kinds = {k: sum(1 for o, _ in outcomes if o == k) for k in {o for o, _ in outcomes}}
    print(
        f"\nslow clients: {SLOW} slow + {DISCONNECTING} hanging up; normal client {len(latencies)} predicts, "
        f"p50 {1000 * float(np.median(latencies)):.0f} ms, p99 {1000 * p99:.0f} ms, max {1000 * max(latencies):.0f} ms;"
        f" outcomes {kinds}; slowest end {max(t for _, t in outcomes):.1f} s; without slow clients:"
        f" p50 {1000 * float(np.median(baseline)):.0f} ms, max {1000 * max(baseline):.0f} ms"
    )
    # Stalled means waiting for the slow clients' body timeout (3 s) or longer, request after request.
    # A loaded 2-core machine may hold one request back (CI: one of 12 took 2.6 s, p50 122 ms), so
    # the bar is the typical request and how rare a slow one is; p99 itself is for benchmarks.
    assert float(np.median(latencies)) < 1.0
    assert sum(t >= 2.0 for t in latencies) <= max(1, len(latencies) // 20), latencies
    assert max(latencies) < BODY_TIMEOUT_S + 2
    assert len(outcomes) == SLOW + DISCONNECTING
    assert set(kinds) <= {"408", "dropped", "closed"}, kinds
    assert kinds.get("closed") == DISCONNECTING
    assert all(t < BODY_TIMEOUT_S + 5 for o, t in outcomes if o != "closed")  # bounded in time
    time.sleep(1.0)
    metrics = client.get("/metrics").text
    fivehundreds = [x for x in metrics.splitlines() if 'status="500"' in x and not x.startswith("#")]
    new_errors = _ingress_errors()[len(errors_before) :]
    assert fivehundreds == [x for x in metrics_before.splitlines() if 'status="500"' in x and "#" not in x], (
        fivehundreds,
        new_errors[:2],
    )
    assert not new_errors, "an ERROR was logged for a slow or vanished client:\n" + new_errors[0]
    assert predict(client, "p0", gear(0).good(8)).status_code == 200

"""gRPC predictions feed what HTTP ones feed: the record, metrics and drift.

A real service with both applications (``start_service(grpc_port=...)``: real Ray Serve, Serve's
gRPC proxy on 127.0.0.1, a local store) and ``record: true``. Predictions sent over gRPC only must
land in the store's Parquet record with the scores and verdicts the replies gave, move the
``/metrics`` counters (images scored, verdicts) and fill the drift monitor's windows, exactly as an
HTTP predict does (``Ingress.observe``, fed by the gRPC replicas through
``Ingress.observe_predictions``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from helpers import free_port, png, until

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.record.reader import read_rows
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("local_ray")

SIZE = 64
PRODUCT = "gear"
GEAR = SyntheticProduct(seed=2511, size=SIZE)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from ray import serve

    from hetmm_ray.serve.run import start_service, stop_service

    store = str(tmp_path_factory.mktemp("grpc-record") / "store")
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        templates=TemplateConfig(kind="all"),
        threshold=ThresholdConfig(max_images=6, folds=3),
        batch_size=8,
    )
    HETMM(config).fit([GEAR.good(j) for j in range(6)]).save(open_store(store), PRODUCT)
    running = start_service(
        store=store,
        port=free_port(),
        grpc_port=free_port(),
        args={"record": True, "record_flush_s": 0.2, "record_pass_sample": 1.0},
        deployments={"Detector": {"num_replicas": 1, "user_config": {"threads": 1}}},
    )
    assert running.grpc_target is not None
    yield running
    stop_service(running)
    serve.shutdown()


def _counter(text: str, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def test_grpc_predictions_land_in_the_record_and_the_metrics(service: Any) -> None:
    from hetmm_ray.serve.grpc.client import InspectionClient

    images = [GEAR.good(100 + j) for j in range(3)] + [GEAR.defective(j, "hole")[0] for j in range(2)]
    with httpx.Client(base_url=service.url, timeout=120) as http:
        before = http.get("/metrics").text
        assert _counter(before, f'hetmm_images_scored_total{{product="{PRODUCT}"}}') == 0
        with InspectionClient(service.grpc_target, timeout=120) as client:
            replies = [client.predict(PRODUCT, [(f"part{i}.png", png(im))]) for i, im in enumerate(images[:3])]
            replies.append(client.predict(PRODUCT, [(f"part{i}.png", png(im)) for i, im in enumerate(images[3:], 3)]))
        answers = [r for reply in replies for r in reply.results]
        assert len(answers) == len(images)

        rows = until(
            lambda: (
                (t := read_rows(open_store(service.store).backend, PRODUCT)).num_rows == len(answers) and t.to_pylist()
            ),
            "every gRPC prediction in the record",
        )
        by_name = {r["name"]: r for r in rows}
        assert sorted(by_name) == sorted(a.name for a in answers)
        for a in answers:
            row = by_name[a.name]
            assert row["score"] == a.score and row["is_anomaly"] == a.is_anomaly and row["version"] == a.version
        assert all(r["image_key"] for r in rows)  # record_pass_sample 1: every image kept

        def fed() -> str | None:
            text = http.get("/metrics").text
            scored = _counter(text, f'hetmm_images_scored_total{{product="{PRODUCT}"}}')
            return text if scored == len(answers) and f'hetmm_drift_parts{{product="{PRODUCT}"' in text else None

        text = until(fed, "gRPC predictions counted in /metrics and the drift windows")
        assert _counter(text, f'hetmm_verdicts_total{{product="{PRODUCT}"') == len(answers)
        flagged = sum(a.is_anomaly for a in answers)
        assert _counter(text, f'hetmm_anomalies_total{{product="{PRODUCT}"}}') == flagged
        chart = http.get(f"/v1/products/{PRODUCT}/drift", params={"hours": 1, "buckets": 4}).json()
        assert chart["live"]["windows"]["200"]["parts"] == len(answers)


def test_grpc_calls_are_counted_by_route_and_status(service: Any) -> None:
    """Every gRPC call, answered or refused, in ``hetmm_requests_total`` and ``hetmm_request_seconds``
    (routes ``grpc_*``, the error table's HTTP status), as HTTP requests are counted."""
    import grpc

    from hetmm_ray.serve.grpc.client import InspectionClient

    def count(text: str, route: str, status: int) -> float:
        return _counter(text, f'hetmm_requests_total{{route="{route}",status="{status}"}}')

    calls = [("grpc_predict", 200), ("grpc_predict", 404), ("grpc_predict", 400), ("grpc_health", 200)]
    calls.append(("grpc_list_products", 200))
    with httpx.Client(base_url=service.url, timeout=120) as http:
        before = http.get("/metrics").text
        with InspectionClient(service.grpc_target, timeout=120, wait_s=0) as client:
            client.predict(PRODUCT, [("a.png", png(GEAR.good(200)))])
            for product, image in (("no-such-product", png(GEAR.good(201))), (PRODUCT, b"not an image")):
                with pytest.raises(grpc.RpcError):
                    client.predict(product, [("b.png", image)])
            client.health()
            client.list_products()

        def counted() -> str | None:
            text = http.get("/metrics").text
            grown = all(count(text, r, s) >= count(before, r, s) + calls.count((r, s)) for r, s in set(calls))
            return text if grown else None

        text = until(counted, "every gRPC call counted in /metrics")
    for route, status in set(calls):
        assert count(text, route, status) == count(before, route, status) + calls.count((route, status))
    assert _counter(text, 'hetmm_request_seconds_count{route="grpc_predict"}') >= 3


def test_raw_frames_score_as_their_png_and_are_kept_as_png(service: Any) -> None:
    """A camera's frame sent as pixels (Mono8, Mono16, RGB8) scores exactly as the
    same pixels sent as a lossless PNG; what the service keeps of it (recent ring, record) is a PNG of
    those pixels; a frame that is not what it says is refused INVALID_ARGUMENT bad_image."""
    import grpc

    from hetmm_ray.data.decode import decode_image
    from hetmm_ray.data.raw_frame import RawFrame, raw_frame_of
    from hetmm_ray.serve.grpc.client import InspectionClient, error_code

    rgb = GEAR.defective(7, "scratch")[0]
    gray = rgb[..., 1].copy()
    frames = {
        "raw-mono8": raw_frame_of(gray),
        "raw-mono16": raw_frame_of(gray.astype(np.uint16) * 256 + 77),  # a low byte that must not matter
        "raw-rgb8": raw_frame_of(rgb),
    }
    same_pixels = {"raw-mono8": png(np.repeat(gray[..., None], 3, 2)), "raw-rgb8": png(rgb)}
    same_pixels["raw-mono16"] = same_pixels["raw-mono8"]
    with InspectionClient(service.grpc_target, timeout=120) as client:
        # one image a request on both paths: a batch of another size may round the last bit otherwise
        raw = {name: client.predict(PRODUCT, [(name, frame)]).results[0] for name, frame in frames.items()}
        for name, data in same_pixels.items():
            encoded = client.predict(PRODUCT, [(name, data)]).results[0]
            assert (raw[name].score, raw[name].is_anomaly) == (encoded.score, encoded.is_anomaly), name
        with pytest.raises(grpc.RpcError) as err:
            client.predict(PRODUCT, [("short.raw", RawFrame(SIZE, SIZE, "Mono8", bytes(SIZE * SIZE - 1)))])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error_code(err.value) == "bad_image"
        assert "short.raw: 4095 bytes of pixels" in err.value.details()
    with httpx.Client(base_url=service.url, timeout=120) as http:

        def kept() -> dict | None:
            items = http.get(f"/v1/products/{PRODUCT}/recent").json()["items"]
            named = {i["name"]: i for i in items if i["name"] in frames}
            return named if len(named) == len(frames) else None

        for name, item in until(kept, "the raw frames in the recent ring").items():
            r = http.get(f"/v1/products/{PRODUCT}/recent/{item['id']}/image")
            assert r.status_code == 200 and r.content.startswith(b"\x89PNG"), name
            assert np.array_equal(decode_image(r.content), frames[name].to_rgb()), name


class CameraFrames:
    """A line's own source through the documented ``Source`` interface: frames as pixels, as a
    camera hands them over (the station sends them so, never encoded)."""

    def __init__(self, frames: list[Any]) -> None:
        from hetmm_ray.station.sources import Frame

        self.pending = [Frame(f"camera:test#{i}", f"cam-{i}", f"cam-{i}", data) for i, data in enumerate(frames)]
        self.released: list[str] = []

    def poll(self) -> list[Any]:
        out, self.pending = self.pending, []
        return out

    def read(self, frame: Any) -> Any:
        return frame.data

    def done(self, frame: Any) -> None:
        self.released.append(frame.ref)

    def refused(self, frame: Any) -> None:
        raise AssertionError(f"{frame.ref} refused: the queue is empty")

    def close(self) -> None:
        pass


def test_a_station_scores_raw_camera_frames_over_grpc(service: Any, tmp_path: Any) -> None:
    """A station whose service is gRPC sends its source's raw frames as
    pixels; each part's result is what the service answers for that frame, in order."""
    import csv

    import yaml

    from hetmm_ray.data.raw_frame import raw_frame_of
    from hetmm_ray.serve.grpc.client import InspectionClient
    from hetmm_ray.station import load_line
    from hetmm_ray.station.runner import build_station

    line = {
        "service": {"grpc": service.grpc_target, "timeout_ms": 120_000},
        "stations": [
            {
                "name": "cam-station",
                "product": PRODUCT,
                "source": {"kind": "folder", "path": "unused"},  # replaced by the camera below
                "sinks": [{"kind": "log", "path": "results.csv"}],
                "deadline_ms": 600_000,
            }
        ],
    }
    (tmp_path / "unused").mkdir()
    (tmp_path / "line.yaml").write_text(yaml.safe_dump(line))
    runner = build_station(load_line(tmp_path / "line.yaml").stations[0], tmp_path)
    runner.source.close()
    frames = [raw_frame_of(GEAR.good(200 + i)[..., 0].copy()) for i in range(3)]
    frames.append(raw_frame_of(GEAR.defective(9, "hole")[0]))
    runner.source = camera = CameraFrames(frames)
    until(lambda: (runner.step(), sum(runner.counts.values()) == len(frames))[1], "every camera part scored")
    runner.close()
    with (tmp_path / "results.csv").open(newline="") as f:
        logged = list(csv.DictReader(f))
    with InspectionClient(service.grpc_target, timeout=120) as client:
        direct = [client.predict(PRODUCT, [(f"direct-{i}", fr)]).results[0] for i, fr in enumerate(frames)]
    assert [r["part_id"] for r in logged] == [f"cam-{i}" for i in range(len(frames))]
    for row, answer in zip(logged, direct, strict=True):
        assert float(row["score"]) == pytest.approx(answer.score, rel=1e-9)
        assert row["verdict"] == answer.verdict == ("reject" if answer.is_anomaly else "ok") and row["late"] == "False"
        assert int(row["version"]) == answer.version
    assert camera.released == [f"camera:test#{i}" for i in range(len(frames))]


def test_a_hot_update_is_seen_by_every_stations_next_part(service: Any, tmp_path: Any) -> None:
    """Two stations (two lines' PCs) score on one service over gRPC; a hot update
    published on the service is what each station's very next part is scored with, and its result
    says so (the version), with no station restarted."""
    import csv

    import yaml

    from hetmm_ray.data.raw_frame import raw_frame_of
    from hetmm_ray.station import load_line
    from hetmm_ray.station.runner import build_station

    stations = [
        {
            "name": name,
            "product": PRODUCT,
            "source": {"kind": "folder", "path": "unused"},  # replaced by a camera below
            "sinks": [{"kind": "log", "path": f"{name}.csv"}],
            "deadline_ms": 600_000,
        }
        for name in ("line1", "line2")
    ]
    (tmp_path / "unused").mkdir()
    line = {"service": {"grpc": service.grpc_target, "timeout_ms": 120_000}, "stations": stations}
    (tmp_path / "line.yaml").write_text(yaml.safe_dump(line))
    runners = [build_station(st, tmp_path) for st in load_line(tmp_path / "line.yaml").stations]

    def one_part_each(seed: int) -> list[int]:
        for i, runner in enumerate(runners):
            runner.source.close()
            runner.source = CameraFrames([raw_frame_of(GEAR.good(seed + i)[..., 1].copy())])
            before = sum(runner.counts.values())
            until(lambda r=runner, b=before: (r.step(), sum(r.counts.values()) > b)[1], "a part scored")
        versions = []
        for runner in runners:
            with (tmp_path / f"{runner.station.head.name}.csv").open(newline="") as f:
                versions.append(int(list(csv.DictReader(f))[-1]["version"]))
        return versions

    head = open_store(service.store).head(PRODUCT)
    assert one_part_each(300) == [head, head]
    files = [("images", (f"n{j}.png", png(GEAR.good(400 + j)), "image/png")) for j in range(2)]
    with httpx.Client(base_url=service.url, timeout=300) as http:
        r = http.post(f"/v1/products/{PRODUCT}/normals?wait=true", files=files)
        job = r.json()["job"]
        while job["state"] == "running":
            time.sleep(0.3)
            job = http.get(f"/v1/jobs/{job['id']}").json()["job"]
    assert job["state"] == "succeeded" and job["version"] == head + 1, job
    assert one_part_each(310) == [head + 1, head + 1]  # the very next part of each station
    for runner in runners:
        runner.close()

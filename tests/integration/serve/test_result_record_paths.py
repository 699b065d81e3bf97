"""One result record on every path (hetmm_ray/result.py, docs/result-record.md).

The same images through ``hetmm predict --json``, HTTP predict, gRPC ``Predict``, a station's payload
(a station scoring in process and one scoring over HTTP) and ``hetmm inspect``'s Parquet row must
give the same record: the same fields, the same values (scores to 1e-5 relative: several processes,
one float32 backbone), the same verdict word. The product sets a review band, so the band has to
reach every path for the verdicts to agree. One small product and one service (HTTP and gRPC)
for all paths.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from helpers import free_port, png

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.result import RECORD_FIELDS, RECORD_VERSION, VERDICTS
from hetmm_ray.store import open_store

pytestmark = pytest.mark.usefixtures("local_ray")

SIZE = 64
PRODUCT = "gear"
GEAR = SyntheticProduct(seed=2511, size=SIZE)
REVIEW_RATE = 0.4  # a wide band: some good parts fall in it
FLOATS = ("score", "threshold", "review_threshold", "rule_target", "estimated_false_alarm_rate")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from ray import serve

    from hetmm_ray.serve.run import start_service, stop_service

    root = tmp_path_factory.mktemp("result-record")
    store = str(root / "store")
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        templates=TemplateConfig(kind="all"),
        threshold=ThresholdConfig(max_images=8, folds=4, false_alarm_rate=0.1, review_false_alarm_rate=REVIEW_RATE),
        batch_size=8,
    )
    HETMM(config).fit([GEAR.good(j) for j in range(8)]).save(open_store(store), PRODUCT)
    images = root / "in"
    images.mkdir()
    for i in range(4):
        (images / f"good-{i}.png").write_bytes(png(GEAR.good(300 + i)))
    (images / "hole.png").write_bytes(png(GEAR.defective(7, "hole")[0]))
    parquet = _parquet_records(root, store)
    running = start_service(
        store=store,
        port=free_port(),
        grpc_port=free_port(),
        deployments={"Detector": {"num_replicas": 1, "user_config": {"threads": 1}}},
    )
    assert running.grpc_target is not None
    yield {"root": root, "store": store, "images": sorted(images.iterdir()), "service": running, "parquet": parquet}
    stop_service(running)
    serve.shutdown()


def _cli_records(setup: dict[str, Any]) -> dict[str, dict[str, Any]]:
    from hetmm_ray.cli import main

    out = setup["root"] / "predict.json"
    args = ["predict", *map(str, setup["images"]), "--product", PRODUCT, "--store", setup["store"]]
    assert main([*args, "--json", str(out)]) == 0
    return {Path(r.pop("image")).name: r for r in json.loads(out.read_text())}


def _http_records(setup: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    with httpx.Client(base_url=setup["service"].url, timeout=120) as http:
        for path in setup["images"]:
            r = http.post(
                f"/v1/products/{PRODUCT}/predict",
                content=path.read_bytes(),
                headers={"content-type": "image/png"},
            )
            assert r.status_code == 200, r.text
            out[path.name] = r.json()
    return out


def _grpc_records(setup: dict[str, Any]) -> dict[str, dict[str, Any]]:
    from hetmm_ray.serve.grpc.client import InspectionClient
    from hetmm_ray.serve.grpc.messages import record_of

    with InspectionClient(setup["service"].grpc_target, timeout=120) as client:
        reply = client.predict(PRODUCT, [(p.name, p.read_bytes()) for p in setup["images"]])
    return {r.name: record_of(r) for r in reply.results}


def _station_records(setup: dict[str, Any], service: dict[str, Any], name: str) -> dict[str, dict[str, Any]]:
    """Each image's payload of a folder station scoring on ``service`` (``to_dict``: what its sinks send)."""
    import shutil
    import time

    from hetmm_ray.station import load_line
    from hetmm_ray.station.runner import build_station

    base = setup["root"] / name
    (base / "in").mkdir(parents=True)
    line = {
        "service": service,
        "stations": [
            {
                "name": name,
                "product": PRODUCT,
                "source": {"kind": "folder", "path": "in", "after": "keep", "settle_ms": 0},
                "sinks": [{"kind": "log", "path": "results.csv"}],
                "deadline_ms": 600_000,
            }
        ],
    }
    (base / "line.yaml").write_text(yaml.safe_dump(line))
    runner = build_station(load_line(base / "line.yaml").stations[0], base)
    try:
        for path in setup["images"]:
            shutil.copy(path, base / "in" / path.name)
        end = time.monotonic() + 300
        while sum(runner.counts.values()) < len(setup["images"]):
            runner.step()
            assert time.monotonic() < end, "the station did not score its parts"
            time.sleep(0.02)
        payloads = [r.to_dict() for r in runner.recent]
    finally:
        runner.close()
    assert all(p["status"] == "scored" and p["error"] is None for p in payloads), payloads
    return {p["part_id"] + ".png": p for p in payloads}


def _parquet_records(root: Path, store: str) -> dict[str, dict[str, Any]]:
    """``hetmm inspect``'s rows by file name (run before the service takes the CPUs of this Ray)."""
    import pyarrow.parquet as pq

    from hetmm_ray.archive import JobOptions, inspect_archive
    from hetmm_ray.archive.listing import part_files
    from hetmm_ray.archive.locations import FsSpec

    dest = str(root / "inspected")
    inspect_archive(str(root / "in"), PRODUCT, dest, JobOptions(store=store, actor_threads=1, batch_size=8))
    rows = [row for part in part_files(dest, FsSpec()) for row in pq.read_table(part).to_pylist()]
    return {Path(r["path"]).name: r for r in rows}


def test_every_path_gives_the_same_record_and_verdict(setup: dict[str, Any]) -> None:
    paths = {
        "predict --json": _cli_records(setup),
        "HTTP": _http_records(setup),
        "gRPC": _grpc_records(setup),
        "station in process": _station_records(setup, {"in_process": setup["store"]}, "local"),
        "station over HTTP": _station_records(setup, {"http": setup["service"].url, "timeout_ms": 120_000}, "http"),
        "inspect Parquet": setup["parquet"],
    }
    names = [p.name for p in setup["images"]]
    reference = paths["predict --json"]
    assert sorted(reference) == sorted(names)
    for name in names:
        want = reference[name]
        assert set(RECORD_FIELDS) <= set(want), want
        assert want["record_version"] == RECORD_VERSION and want["verdict"] in VERDICTS
        assert want["review_threshold"] is not None and want["review_threshold"] < want["threshold"]
        assert want["is_anomaly"] == (want["verdict"] == "reject") == (want["score"] > want["threshold"])
        for where, records in paths.items():
            got = records[name]
            for field in RECORD_FIELDS:
                if field in FLOATS and want[field] is not None:
                    rel = 1e-5 if field == "score" else 1e-6
                    assert got[field] == pytest.approx(want[field], rel=rel), (where, name, field, got)
                else:
                    assert got[field] == want[field], (where, name, field, got)
    verdicts = {reference[n]["verdict"] for n in names}
    # every word of the vocabulary is seen: the defect rejected, the band acting on some good parts
    assert reference["hole.png"]["verdict"] == "reject" and verdicts == set(VERDICTS), verdicts

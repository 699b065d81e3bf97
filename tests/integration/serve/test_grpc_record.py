"""gRPC predictions feed what HTTP ones feed (issue 25 with issue 23): the record, metrics and drift.

A real service with both applications (``start_service(grpc_port=...)``: real Ray Serve, Serve's
gRPC proxy on 127.0.0.1, a local store) and ``record: true``. Predictions sent over gRPC only must
land in the store's Parquet record with the scores and verdicts the replies gave, move the
``/metrics`` counters (images scored, verdicts) and fill the drift monitor's windows, exactly as an
HTTP predict does (``Ingress.observe``, fed by the gRPC replicas through
``Ingress.observe_predictions``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers import free_port, png, until

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detector import HETMM
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

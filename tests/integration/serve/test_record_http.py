"""The inspection record, the review band and the drift alarms over real HTTP.

A real service (deploy.yaml's application through ``start_service``, real Ray Serve, a local store)
with ``record: true``: predictions land in the store's Parquet record with the verdict the response
gave; ``/metrics`` exports the verdict counter and the drift gauges; ``/drift`` reads the record;
after the service is stopped and started again on the same store, the console's Recent view (and
an image route) still show the predictions, read from the record.
"""

from __future__ import annotations

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
GEAR = SyntheticProduct(seed=11, size=SIZE)
ARGS = {"record": True, "record_flush_s": 0.2, "record_pass_sample": 1.0}
DEPLOYMENTS = {
    "Detector": {
        "num_replicas": 1,
        "ray_actor_options": {"num_cpus": 0.5},
        "user_config": {"max_batch_size": 8, "batch_wait_timeout_s": 0.002, "threads": 1},
    }
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = str(tmp_path_factory.mktemp("record-http") / "store")
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        templates=TemplateConfig(kind="all"),
        # a wide review band: the far rule at 40 % of good parts (the threshold stays at 1 %)
        threshold=ThresholdConfig(max_images=8, folds=4, review_false_alarm_rate=0.4),
        batch_size=8,
    )
    HETMM(config).fit([GEAR.good(j) for j in range(8)]).save(open_store(uri), PRODUCT)
    return uri


def start(store: str, port: int) -> Any:
    from hetmm_ray.serve.run import start_service

    return start_service(store=store, port=port, args=ARGS, deployments=DEPLOYMENTS)


def images() -> list[np.ndarray]:
    return [GEAR.good(100 + j) for j in range(6)] + [GEAR.defective(j, "hole")[0] for j in range(3)]


def test_predictions_land_in_the_record_and_survive_a_restart(store: str) -> None:
    from ray import serve

    from hetmm_ray.serve.run import stop_service

    port = free_port()  # Serve's proxy keeps its port while Serve runs: the restart reuses it
    running = start(store, port)
    try:
        with httpx.Client(base_url=running.url, timeout=120) as c:
            answers = []
            for im in images():
                r = c.post(f"/v1/products/{PRODUCT}/predict", content=png(im), headers={"content-type": "image/png"})
                assert r.status_code == 200, r.text
                answers.append(r.json())
            # the review band: three-way verdict beside is_anomaly, by the rule of core/review.py
            for a in answers:
                assert a["review_threshold"] < a["threshold"]
                expected = (
                    "reject"
                    if a["score"] > a["threshold"]
                    else "review"
                    if a["score"] > a["review_threshold"]
                    else "ok"
                )
                assert a["verdict"] == expected and a["is_anomaly"] == (a["verdict"] == "reject")
            backend = open_store(store).backend
            rows = until(
                lambda: (t := read_rows(backend, PRODUCT)).num_rows == len(answers) and t.to_pylist(),
                "every prediction in the record",
            )
            assert [r["recent_id"] for r in rows] == [a["recent_id"] for a in answers]
            assert [r["score"] for r in rows] == [a["score"] for a in answers]
            assert [r["verdict"] for r in rows] == [a["verdict"] for a in answers]
            assert all(r["image_key"] for r in rows)  # record_pass_sample 1: every image kept

            # the verdicts counted in /metrics, and the drift windows exported with product and version labels
            def drift_metrics() -> str | None:
                text = c.get("/metrics").text
                return text if 'hetmm_drift_parts{product="gear"' in text else None

            text = until(drift_metrics, "drift gauges in /metrics")
            counted = sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith('hetmm_verdicts_total{product="gear"')
            )
            assert counted == len(answers)
            assert f'hetmm_drift_expected_rate{{product="gear",version="{answers[0]["version"]}"}}' in text
            chart = c.get(f"/v1/products/{PRODUCT}/drift", params={"hours": 1, "buckets": 4}).json()
            assert chart["source"] == "record" and sum(p["parts"] for p in chart["points"]) == len(answers)
            assert chart["live"]["windows"]["200"]["parts"] == len(answers)
    finally:
        stop_service(running)

    running = start(store, port)  # a new ingress: its in-memory ring is empty
    try:
        with httpx.Client(base_url=running.url, timeout=120) as c:
            items = c.get(f"/v1/products/{PRODUCT}/recent").json()["items"]
            assert [i["id"] for i in items] == [a["recent_id"] for a in reversed(answers)]  # newest first
            assert all(i["recorded"] for i in items)
            assert [i["verdict"] for i in items] == [a["verdict"] for a in reversed(answers)]
            flagged = c.get(f"/v1/products/{PRODUCT}/recent", params={"flagged": "true"}).json()["items"]
            assert {i["id"] for i in flagged} == {a["recent_id"] for a in answers if a["is_anomaly"]}
            r = c.get(f"/v1/products/{PRODUCT}/recent/{items[0]['id']}/image")
            assert r.status_code == 200 and r.content == png(images()[-1])
    finally:
        stop_service(running)
        serve.shutdown()

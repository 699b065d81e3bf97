"""Autoscaling shown working: detector replicas 1 -> >= 3 -> 1 under load over real HTTP.

A local Ray with 8 logical CPUs on however many cores there are (the Detector asks 0.5 CPU, so
four replicas fit whatever the machine). The Detector runs deploy.yaml's options, autoscaling
included (min 1, max 4, target_ongoing_requests 8, the images-in-flight policy of
serve/autoscaling.py), with shortened delays, stated here: upscale_delay_s 2, downscale_delay_s 10,
look_back_period_s 12, and the replicas and handles pushing their metrics every second
(``RAY_SERVE_*_AUTOSCALING_METRIC_PUSH_INTERVAL_S``; 10 s by default). The look-back stays above
``AutoscalingConfig.metrics_interval_s`` (10 s, deprecated and left at its default: setting it warns
too), which Ray 2.60 warns about below it and will refuse; the fixture checks that these settings
raise no warning.

Load profile: 12 clients in closed loop, each sending 4-image multipart predicts (48 images in
flight: the policy wants 6 replicas, capped at 4; Serve's request-count default would see 12
requests, 1.5 replicas' target; and more than ``hot_product_inflight`` = 8 predicts in flight, so the
warm set spreads the product over model-id aliases) until at least 3 replicas run and 8 s longer; then one client
sending one-image predicts one after another until one replica is left. Every request of both
moves must answer 200, and none may take longer than ``STALL_BOUND_S`` (a product loading cold on
a new replica, a drained replica's requests served elsewhere). Bounds are generous: replicas
start slowly on a loaded 2-core machine.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Iterator

import httpx
import pytest
import yaml
from helpers import REPO, free_port, png

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.store import open_store

SIZE = 224  # scoring, not the HTTP path, must be what requests wait for
GEAR = SyntheticProduct(seed=2525, size=SIZE)
PUSH_ENV = (
    "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S",
    "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S",
)
SHORTENED = {"upscale_delay_s": 2.0, "downscale_delay_s": 10.0, "look_back_period_s": 12.0}
UP_WITHIN_S = 360.0
DOWN_WITHIN_S = 360.0
STALL_BOUND_S = 60.0


def config() -> DetectorConfig:
    return DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        templates=TemplateConfig(kind="pts_o", sheets=3),
        threshold=ThresholdConfig(max_images=4, folds=2),
        batch_size=8,
    )


def stated_autoscaling() -> dict:
    app = yaml.safe_load((REPO / "deploy.yaml").read_text())["applications"][0]
    return next(d for d in app["deployments"] if d["name"] == "Detector")["autoscaling_config"]


def running_replicas() -> int:
    from ray import serve

    app = serve.status().applications.get("hetmm")
    if app is None or "Detector" not in app.deployments:
        return 0
    return int(app.deployments["Detector"].replica_states.get("RUNNING", 0))


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    uri = str(tmp_path_factory.mktemp("autoscale") / "store")
    HETMM(config()).fit([GEAR.good(j) for j in range(5)]).save(open_store(uri), "gear")
    return uri


@pytest.fixture(scope="module")
def service(own_ray, store: str) -> Iterator[str]:
    import ray
    from helpers import LOCAL_RAY_ARGS
    from ray import serve

    from hetmm_ray.serve.run import start_service, stop_service

    saved = {k: os.environ.get(k) for k in PUSH_ENV}
    for k in PUSH_ENV:
        os.environ[k] = "1"
    ray.init(**{**LOCAL_RAY_ARGS, "num_cpus": 8})
    autoscaling = {**stated_autoscaling(), **SHORTENED}
    from ray.serve.config import AutoscalingConfig

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. look_back_period_s <= metrics_interval_s (a FutureWarning)
        AutoscalingConfig(**autoscaling)
    running = start_service(
        store=store,
        port=free_port(),
        args={"store_poll_s": 1.0},
        deployments={"Detector": {"autoscaling_config": autoscaling, "user_config": {"threads": 1}}},
    )
    yield running.url
    stop_service(running)
    serve.shutdown()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


class Load:
    """Closed-loop clients; every answer recorded as (start, seconds, status, replicas named)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.records: list[tuple[float, float, int, set[str]]] = []
        self.lock = threading.Lock()
        self.images = [png(GEAR.good(10 + i)) for i in range(8)]

    def run(self, clients: int, images: int, stop: threading.Event) -> list[threading.Thread]:
        def client() -> None:
            files = [("images", (f"{i}.png", self.images[i], "image/png")) for i in range(images)]
            with httpx.Client(timeout=300) as http:
                while not stop.is_set():
                    start = time.monotonic()
                    r = http.post(f"{self.url}/v1/products/gear/predict", files=files)
                    replicas = {x["timing"]["replica"] for x in r.json().get("results", [])} if r.is_success else set()
                    with self.lock:
                        self.records.append((start, time.monotonic() - start, r.status_code, replicas))

        threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
        for t in threads:
            t.start()
        return threads


def wait_for(condition, within: float, what: str) -> float:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(1.0)
    pytest.fail(f"{what} not within {within:.0f} s (replicas now {running_replicas()})")


def test_replicas_grow_under_load_and_shrink_after_it(service: str) -> None:
    assert stated_autoscaling()["min_replicas"] == 1 and stated_autoscaling()["max_replicas"] >= 3
    wait_for(lambda: running_replicas() == 1, 120, "one replica at rest")
    load = Load(service)
    heavy = threading.Event()
    threads = load.run(clients=12, images=4, stop=heavy)
    up = wait_for(lambda: running_replicas() >= 3, UP_WITHIN_S, ">= 3 replicas under load")

    def spread() -> set[str]:  # replicas that scored requests sent after the scale-up
        with load.lock:
            return set().union(*(r for start, _, _, r in load.records if start >= up))

    # the warm set's aliases, renamed every hot_product_rotate_s (10 s), reach the new replicas
    wait_for(lambda: len(spread()) >= 2, 120, "the hot product on >= 2 replicas")
    heavy.set()
    for t in threads:
        t.join(timeout=STALL_BOUND_S * 2)
    peak = running_replicas()
    light = threading.Event()
    threads = load.run(clients=1, images=1, stop=light)
    wait_for(lambda: running_replicas() == 1, DOWN_WITHIN_S, "back to one replica after the load")
    time.sleep(3.0)  # requests right after the last replica left
    light.set()
    for t in threads:
        t.join(timeout=STALL_BOUND_S * 2)

    statuses = [s for _, _, s, _ in load.records]
    assert len(statuses) > 20 and all(s == 200 for s in statuses), sorted(set(statuses))
    slowest = max(seconds for _, seconds, _, _ in load.records)
    assert slowest < STALL_BOUND_S, f"a request took {slowest:.1f} s"
    assert len(spread()) >= 2 and peak >= 3


def test_policy_counts_images_not_requests() -> None:
    """The policy on Serve's own context: 64 images in 8 requests want 8 replicas, not 1; requests
    stand in before any replica reported."""
    from ray.serve.config import AutoscalingConfig, AutoscalingContext

    from hetmm_ray.serve.autoscaling import IMAGES_IN_FLIGHT, images_in_flight_policy

    dep = "hetmm#Detector"  # Serve's ids are opaque to the policy: plain strings stand in for them
    replicas = ["r0", "r1"]

    def ctx(images: dict | None, requests: float, queued: float = 0.0) -> AutoscalingContext:
        return AutoscalingContext(
            deployment_id=dep,
            deployment_name="Detector",
            app_name="hetmm",
            current_num_replicas=2,
            target_num_replicas=2,
            running_replicas=replicas,
            total_num_requests=requests,
            total_queued_requests=queued,
            aggregated_metrics={IMAGES_IN_FLIGHT: images} if images is not None else {},
            raw_metrics={},
            capacity_adjusted_min_replicas=1,
            capacity_adjusted_max_replicas=4,
            policy_state={},
            last_scale_up_time=None,
            last_scale_down_time=None,
            current_time=time.time(),
            config=AutoscalingConfig(**stated_autoscaling()),
        )

    assert images_in_flight_policy(ctx({replicas[0]: 40.0, replicas[1]: 24.0}, requests=8))[0] == 8.0
    assert images_in_flight_policy(ctx({replicas[0]: 40.0, replicas[1]: 24.0}, requests=9, queued=1))[0] == 65 / 8
    assert images_in_flight_policy(ctx(None, requests=4))[0] == 0.5

"""A gRPC Predict carrying more than 4 MiB of images.

Serve's gRPC proxy hands the request to the replica over the replica's own gRPC server, whose
message limit is 4 MiB unless ``RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH`` says otherwise
(``config.SERVE_ENVIRONMENT``). Eight 900 x 900 PNGs are more than that; without the setting the
request failed inside Serve although it was within ``max_body_mib``.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from helpers import free_port, png

from hetmm_ray.config import BackboneConfig, DetectorConfig, TemplateConfig, ThresholdConfig
from hetmm_ray.data.synthetic import SyntheticProduct
from hetmm_ray.detection.detector import HETMM
from hetmm_ray.store import open_store

SIZE = 64
GEAR = SyntheticProduct(seed=2502, size=SIZE)


@pytest.fixture(scope="module")
def client(own_ray, tmp_path_factory) -> Iterator[object]:
    import ray
    from helpers import LOCAL_RAY_ARGS
    from ray import serve

    from hetmm_ray.serve.grpc.client import InspectionClient
    from hetmm_ray.serve.run import start_service, stop_service

    store = str(tmp_path_factory.mktemp("grpc_large") / "store")
    config = DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=SIZE),
        templates=TemplateConfig(kind="pts_o", sheets=3),
        threshold=ThresholdConfig(max_images=4, folds=2),
        batch_size=8,
    )
    HETMM(config).fit([GEAR.good(j) for j in range(5)]).save(open_store(store), "gear")
    ray.init(**LOCAL_RAY_ARGS)
    running = start_service(
        store=store,
        port=free_port(),
        grpc_port=free_port(),
        args={"max_body_mib": 16, "max_images_per_request": 4, "store_poll_s": 0.5},
        deployments={"Detector": {"num_replicas": 1, "user_config": {"threads": 1}}},
    )
    assert running.grpc_target is not None
    c = InspectionClient(running.grpc_target, timeout=300)
    yield c
    c.close()
    stop_service(running)
    serve.shutdown()


def test_a_request_over_4_mib_is_scored(client) -> None:
    rng = np.random.default_rng(25)
    noise = [png(rng.integers(0, 256, (800, 800, 3), dtype=np.uint8)) for _ in range(3)]  # ~1.9 MB each
    assert sum(len(b) for b in noise) > 4 * 2**20
    reply = client.predict("gear", [(f"n{i}.png", b) for i, b in enumerate(noise)])
    assert len(reply.results) == len(noise)
    alone = client.predict("gear", [("n0.png", noise[0])])
    assert abs(reply.results[0].score - alone.results[0].score) <= 1e-5 * max(1.0, abs(alone.results[0].score))

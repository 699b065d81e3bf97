"""connect(): one clear error, quickly, when a cluster cannot be reached; reuse of a joined Ray."""

from __future__ import annotations

import time

import pytest
import ray
from helpers import free_port

from hetmm_ray.distributed.runtime import ClusterUnavailable, connect


@pytest.fixture
def no_ray(own_ray, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Ray joined in this process (connect() would reuse it) and no RAY_ADDRESS."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray.shutdown()


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_an_unreachable_address_fails_fast_with_one_line(no_ray, scheme: str) -> None:
    address = f"{scheme}127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(ClusterUnavailable, match=r"^ray cluster at .* is unreachable \(") as info:
        connect(address)
    assert time.monotonic() - start < 10  # Ray alone would retry for minutes
    assert "\n" not in str(info.value) and not ray.is_initialized()


def test_ray_address_env_is_used(no_ray, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free_port()}")
    with pytest.raises(ClusterUnavailable, match="unreachable"):
        connect()


@pytest.mark.parametrize("address", ["nohost", "host:port"])
def test_a_malformed_address_is_refused(no_ray, address: str) -> None:
    with pytest.raises(ClusterUnavailable, match="ray address"):
        connect(address)


def test_num_cpus_is_for_a_local_ray_only(no_ray) -> None:
    with pytest.raises(ValueError, match="local Ray only"):
        connect("127.0.0.1:6379", num_cpus=2)


def test_starts_a_local_ray_once_then_reuses_it(no_ray) -> None:
    connect(num_cpus=1)
    assert ray.get_runtime_context().namespace == "hetmm"  # where named actors (the registry) live
    node = ray.get_runtime_context().get_node_id()
    connect("127.0.0.1:1")  # already joined: a no-op, not a second Ray
    assert ray.get_runtime_context().get_node_id() == node and ray.cluster_resources()["CPU"] == 1

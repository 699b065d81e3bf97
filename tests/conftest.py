"""Shared test fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Small tensors on a shared 2-core machine: one intra-op thread is fastest and steadiest."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def local_ray() -> Iterator[None]:
    """A real local Ray (2 CPUs), started once for the tests that ask for it."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()

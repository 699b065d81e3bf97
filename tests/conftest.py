"""Shared test fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from helpers import LOCAL_RAY_ARGS


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

    from hetmm_ray.distributed.runtime import serve_environment

    serve_environment()  # the Serve settings the service's own local Ray runs with
    if not ray.is_initialized():
        ray.init(**LOCAL_RAY_ARGS)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def own_ray() -> Iterator[None]:
    """For a module that connects Ray its own way (a multi-node ``Cluster``, ``connect()``).

    A process joins one Ray at a time: the shared local Ray is shut down for the
    module and started again afterwards if it was running, so ``local_ray`` still
    holds for the modules after this one.
    """
    import ray

    was_running = ray.is_initialized()
    ray.shutdown()
    yield
    ray.shutdown()
    if was_running:
        ray.init(**LOCAL_RAY_ARGS)

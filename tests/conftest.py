"""Shared test fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import crash_watch
import pytest
import torch
from helpers import LOCAL_RAY_ARGS


def pytest_configure(config: pytest.Config) -> None:
    # A test process that dies without pytest's summary says which test it died in (crash_watch.py).
    config.pluginmanager.register(crash_watch, "hetmm-crash-watch")


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

    from hetmm_ray.distributed.runtime import serve_environment, shutdown_ray

    serve_environment()  # the Serve settings the service's own local Ray runs with
    if not ray.is_initialized():
        ray.init(**LOCAL_RAY_ARGS)
    yield
    shutdown_ray(wait_for_processes=True)


@pytest.fixture(scope="module")
def own_ray() -> Iterator[None]:
    """For a module that connects Ray its own way (a multi-node ``Cluster``, ``connect()``).

    A process joins one Ray at a time: the shared local Ray is shut down for the
    module and started again afterwards if it was running, so ``local_ray`` still
    holds for the modules after this one.
    """
    import ray

    from hetmm_ray.distributed.runtime import serve_environment, shutdown_ray

    serve_environment()  # the Ray this module starts runs Serve with the service's settings too
    was_running = ray.is_initialized()
    # Waited: the next Ray starts only once this one's processes have exited, so two Rays never
    # wind down and start up together on a 2-core machine.
    shutdown_ray(wait_for_processes=True)
    yield
    shutdown_ray(wait_for_processes=True)
    if was_running:
        ray.init(**LOCAL_RAY_ARGS)

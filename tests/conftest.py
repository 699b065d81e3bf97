"""Shared test fixtures."""

from __future__ import annotations

import sys
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


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules that start a Ray of their own (``own_ray``: a multi-node ``Cluster``, ``connect()``,
    ``hetmm serve``) run after every module that shares the local one, in their own order: the shared
    local Ray then starts once and is never started again after such a module (each restart costs a
    2-core machine tens of seconds). Tests never depend on their order; this only saves the restarts."""
    own = {item.module for item in items if "own_ray" in getattr(item, "fixturenames", ())}
    if own:
        items[:] = [i for i in items if i.module not in own] + [i for i in items if i.module in own]


@pytest.fixture(scope="session", autouse=True)
def _ray_down_at_the_end() -> Iterator[None]:
    """Whatever Ray the session left running is shut down at its end, waited for."""
    yield
    if "ray" in sys.modules:
        import ray

        from hetmm_ray.distributed.runtime import shutdown_ray

        if ray.is_initialized():
            shutdown_ray(wait_for_processes=True)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A real local Ray (2 CPUs) for the module: started on first use and left running for the next
    module that asks (a module with ``own_ray`` shuts it down; the session's end does too)."""
    import ray

    from hetmm_ray.distributed.runtime import serve_environment

    serve_environment()  # the Serve settings the service's own local Ray runs with
    if not ray.is_initialized():
        ray.init(**LOCAL_RAY_ARGS)
    yield


@pytest.fixture(scope="module")
def own_ray() -> Iterator[None]:
    """For a module that connects Ray its own way (a multi-node ``Cluster``, ``connect()``).

    A process joins one Ray at a time: the shared local Ray is shut down for the module (and
    started again by ``local_ray`` if a later module asks for it; these modules run last).
    """
    import ray

    from hetmm_ray.distributed.runtime import serve_environment, shutdown_ray

    serve_environment()  # the Ray this module starts runs Serve with the service's settings too
    # Waited: the next Ray starts only once this one's processes have exited, so two Rays never
    # wind down and start up together on a 2-core machine.
    if ray.is_initialized():
        shutdown_ray(wait_for_processes=True)
    yield
    shutdown_ray(wait_for_processes=True)

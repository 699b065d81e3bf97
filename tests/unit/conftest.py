"""The unit tests: no Ray, no network server, seconds each (tests/integration/ has the rest).

A guard checks the first promise: a unit test module that starts a Ray runtime fails (a Ray
that an integration module started earlier in the same pytest run is not the unit module's doing).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


def _ray_running() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


@pytest.fixture(scope="module", autouse=True)
def no_ray_runtime() -> Iterator[None]:
    before = _ray_running()
    yield
    assert before or not _ray_running(), "a unit test started Ray: move it to tests/integration/"

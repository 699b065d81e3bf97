"""The unit tests: no Ray, no network server, seconds each (tests/integration/ has the rest).

A guard checks the first promise: a unit test module that leaves a Ray runtime connected fails.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module", autouse=True)
def no_ray_runtime() -> Iterator[None]:
    yield
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized(), "a unit test started Ray: move it to tests/integration/"

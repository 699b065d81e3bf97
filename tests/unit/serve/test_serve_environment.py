"""config.SERVE_ENVIRONMENT: every setting is one the installed Ray Serve reads, with a value it accepts.

A misspelt name would be ignored by Serve without a word (the setting silently at its default), so
each name must appear as an environment variable read in ``ray/serve/_private/constants.py``. The
file is read as text: unit tests do not import Ray.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from hetmm_ray.config import SERVE_ENVIRONMENT


def _serve_constants() -> str:
    spec = importlib.util.find_spec("ray")  # finds the package without importing it
    assert spec is not None and spec.submodule_search_locations
    return (Path(next(iter(spec.submodule_search_locations))) / "serve" / "_private" / "constants.py").read_text()


def test_every_setting_is_read_by_ray_serve() -> None:
    constants = _serve_constants()
    for name in SERVE_ENVIRONMENT:
        assert re.search(rf'["\']{name}["\']', constants), f"{name}: not an environment variable Ray Serve reads"


def test_the_lean_settings_issue_25() -> None:
    # Serve's CPU per request and while idle: logs to Serve's files only, a slower
    # control loop, router and user code on the replica's own loop. Values Serve parses as such.
    assert SERVE_ENVIRONMENT["RAY_SERVE_LOG_TO_STDERR"] == "0"
    assert SERVE_ENVIRONMENT["RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP"] == "0"
    assert SERVE_ENVIRONMENT["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "0"
    assert 0.1 < float(SERVE_ENVIRONMENT["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"]) <= 1.0
    # a starting proxy is given 30 s, not 5, before Serve kills it (a loaded 2-core machine)
    assert float(SERVE_ENVIRONMENT["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"]) >= 30
    assert all(isinstance(v, str) for v in SERVE_ENVIRONMENT.values())  # an environment holds strings

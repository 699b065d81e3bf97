"""The one way the tests drive a real browser: Debian's ``chromium`` through Playwright's
``executable_path`` (Playwright's own browser download cannot reach its host here).

``missing_browser()`` says what is missing, or None. A test module calls ``skip_without_browser()``
at import: without a browser it skips, saying why, except under ``CI=true``, where ``.ci/run`` has
installed one and its absence must fail the run instead. ``launch(playwright)`` starts the browser
with the flags every test uses.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("HETMM_CHROMIUM", "/usr/bin/chromium")
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu"]


def missing_browser() -> str | None:
    """What is missing to drive a browser, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -c constraints.txt playwright)"
    if not Path(CHROMIUM).exists():
        return f"no chromium at {CHROMIUM} (apt-get install chromium)"
    return None


def skip_without_browser() -> str | None:
    """Skip the calling module (at import, so no service starts) when no browser can run, unless CI;
    returns what is missing (only ever not None under CI, where the module's tests must fail)."""
    missing = missing_browser()
    if missing is not None and os.environ.get("CI") != "true":
        pytest.skip(missing, allow_module_level=True)
    return missing


def launch(playwright: Any) -> Any:
    """A headless Chromium from ``sync_playwright()``'s handle."""
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)

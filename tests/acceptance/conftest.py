"""Acceptance runs: whole features checked at the size their issues state, moved
here from benchmarks/ with the conditions those scripts printed turned into asserts.

Long, so not in ``make test`` (tests/unit and tests/integration), and skipped unless selected with
``-m acceptance``: ``make acceptance`` runs them at full size, ``make acceptance-quick`` at toy sizes
(``HETMM_ACCEPTANCE_QUICK=1``: each shows its path works; a bar that only a full-size run can meet is
asserted at full size only). A run that needs ``../shared`` skips, saying why, without it. Charts and
raw figures go to ``HETMM_ACCEPTANCE_OUT`` when it is set (else to the test's temporary folder).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # benchmarks.common: served() and the archive inputs, one copy for both
    sys.path.insert(0, str(REPO))

HERE = Path(__file__).resolve().parent
QUICK = os.environ.get("HETMM_ACCEPTANCE_QUICK") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skipped unless ``-m`` names them (a skip mark: no fixture of theirs is set up)."""
    if "acceptance" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="an acceptance run (long): make acceptance (pytest -m acceptance tests/acceptance)")
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def quick() -> bool:
    """Toy sizes (``HETMM_ACCEPTANCE_QUICK=1``)."""
    return QUICK


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    """Where a run leaves its chart and raw figures (``HETMM_ACCEPTANCE_OUT``, else a temporary folder)."""
    out = Path(os.environ.get("HETMM_ACCEPTANCE_OUT") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out

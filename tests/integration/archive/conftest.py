"""Fixtures of the archive tests (``hetmm inspect``); helpers in archive_helpers.py."""

from __future__ import annotations

import pytest
from archive_helpers import fit_store


@pytest.fixture(scope="module")
def gear_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny product, fitted once per module, in a local store."""
    return fit_store(str(tmp_path_factory.mktemp("archive") / "store"))

"""The store suites' backends: every test taking ``location`` runs on a local folder and on S3."""

from __future__ import annotations

import pytest
from s3_server import new_bucket


@pytest.fixture(params=["local", "s3"])
def location(request, tmp_path):
    """Where a fresh, empty store lives: a local folder, or a fresh bucket on the moto server."""
    if request.param == "local":
        return str(tmp_path / "store")
    endpoint = request.getfixturevalue("s3_endpoint")
    return f"s3://{new_bucket(endpoint)}/templates?endpoint={endpoint}"

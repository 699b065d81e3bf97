"""Fixtures of the integration tests (real Ray, Serve over HTTP, a real S3 endpoint, a browser).

``local_ray`` and ``own_ray`` live in tests/conftest.py; the S3 endpoint's fixtures here are
built on tests/s3_server.py (moto's server on 127.0.0.1, started once per module).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from s3_server import aws_environment, start_moto


@pytest.fixture(scope="module")
def aws_env() -> Iterator[None]:
    """Dummy credentials for boto3 (and the subprocesses), restored afterwards; no proxy for 127.0.0.1."""
    yield from aws_environment()


@pytest.fixture(scope="module")
def s3_endpoint(aws_env) -> Iterator[str]:
    """A fresh moto S3 server's endpoint URL for the module."""
    server, endpoint = start_moto()
    yield endpoint
    server.stop()

"""Template persistence: versioned, verified template sets in a local directory or S3.

``open_store(uri)`` takes a local path (the embedded default) or
``s3://bucket/prefix``; an S3-compatible server's address can be given as
``endpoint_url=`` or in the URI (``s3://bucket/prefix?endpoint=http://host:9000``),
otherwise boto3's standard chain decides (``AWS_ENDPOINT_URL`` included).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from .base import (
    Backend,
    ProductNotFound,
    StoreConflict,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
    check_product_name,
)
from .local import LocalBackend
from .manifest import VersionRecord
from .protocol import Store
from .versioned import VersionedStore

__all__ = [
    "Backend",
    "ProductNotFound",
    "Store",
    "StoreConflict",
    "StoreCorrupt",
    "StoreError",
    "StoreUnavailable",
    "VersionRecord",
    "VersionedStore",
    "check_product_name",
    "open_backend",
    "open_store",
]


def open_backend(uri: str | Path, *, endpoint_url: str | None = None, region: str | None = None) -> Backend:
    """The flat object backend at ``uri``: a local directory or ``s3://bucket/prefix[?endpoint=...]``."""
    text = str(uri)
    if text.startswith("s3://"):
        parts = urlsplit(text)
        if not parts.netloc:
            raise StoreError(f"store URI {text!r}: give a bucket, e.g. s3://my-bucket/templates")
        query = parse_qs(parts.query)
        endpoint = endpoint_url or next(iter(query.get("endpoint", [])), None)
        region = region or next(iter(query.get("region", [])), None)
        from .s3 import S3Backend

        return S3Backend(parts.netloc, parts.path, endpoint_url=endpoint, region=region)
    if "://" in text and not text.startswith("file://"):
        raise StoreError(f"store URI {text!r}: use a local path or s3://bucket/prefix")
    return LocalBackend(Path(text.removeprefix("file://")))


def open_store(uri: str | Path, *, endpoint_url: str | None = None, region: str | None = None) -> VersionedStore:
    """The store at ``uri``: a local directory (created on first write) or ``s3://bucket/prefix``."""
    return VersionedStore(open_backend(uri, endpoint_url=endpoint_url, region=region))

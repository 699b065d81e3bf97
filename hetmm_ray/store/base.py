"""Store errors, product names, and the object backend interface.

A backend is a flat key -> bytes namespace with the two conditional writes
that make publishing safe on any object store: create-only (``If-None-Match:
*``) and compare-and-swap on a previous ETag (``If-Match``). The local
directory and S3 backends both provide them, so one versioning protocol
(``versioned.py``) serves both.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import BinaryIO, Protocol

from ..errors import HetmmError

__all__ = [
    "Backend",
    "ProductNotFound",
    "StoreConflict",
    "StoreCorrupt",
    "StoreError",
    "StoreUnavailable",
    "check_product_name",
]

# Matched with fullmatch: a "$" anchor would also accept a trailing newline ("nl\n").
_PRODUCT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class StoreError(HetmmError, RuntimeError):
    """The store cannot be read or written, or holds inconsistent data."""


class ProductNotFound(StoreError, KeyError):
    """No such product (or version) in the store."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "product not found"


class StoreConflict(StoreError):
    """Another writer published first; reload and retry."""


class StoreUnavailable(StoreError):
    """The store could not be reached (after bounded retries)."""


class StoreCorrupt(StoreError):
    """A stored object does not match its recorded checksum."""


def check_product_name(product: str) -> str:
    if not isinstance(product, str) or not _PRODUCT.fullmatch(product) or product.endswith("."):
        raise StoreError(
            f"invalid product name {product!r}: use 1-64 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit"
        )
    return product


class Backend(Protocol):
    """Flat object namespace. Keys use '/' separators; ETags are opaque strings."""

    def describe(self) -> str: ...

    def read(self, key: str) -> tuple[bytes, str]:
        """Contents and ETag; ``KeyError`` if absent."""
        ...

    def read_into(self, key: str, buffer: memoryview) -> None:
        """Stream an object of known size into ``buffer`` (no intermediate copy)."""
        ...

    def write(self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None) -> str:
        """Write a small object; conditional writes raise StoreConflict. Returns the new ETag."""
        ...

    def upload(self, key: str, stream: BinaryIO, size: int) -> None:
        """Write a large object from a stream, in parts where the backend supports it."""
        ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str) -> Iterator[str]: ...

    def delete(self, keys: Sequence[str]) -> None: ...

"""Template persistence. ``open_store(uri)``: a local directory (default) or, later, S3."""

from __future__ import annotations

from pathlib import Path

from .base import ProductNotFound, StoreError, TemplateStore, check_product_name
from .local import LocalStore

__all__ = ["LocalStore", "ProductNotFound", "StoreError", "TemplateStore", "check_product_name", "open_store"]


def open_store(uri: str | Path) -> TemplateStore:
    """A store for ``uri``: a local directory path (created on first write)."""
    text = str(uri)
    if "://" in text and not text.startswith("file://"):
        scheme = text.split("://", 1)[0]
        raise StoreError(f"store URI {text!r}: scheme {scheme}:// is not supported yet; use a local directory")
    return LocalStore(Path(text.removeprefix("file://")))

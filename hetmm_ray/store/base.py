"""The store interface (DESIGN.md contracts) and its errors."""

from __future__ import annotations

import re
from typing import Protocol

from ..core.templates import TemplateSet

__all__ = ["ProductNotFound", "StoreError", "TemplateStore", "check_product_name"]

_PRODUCT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class StoreError(RuntimeError):
    """The store cannot be read or written, or holds inconsistent data."""


class ProductNotFound(StoreError, KeyError):
    """No such product (or version) in the store."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "product not found"


def check_product_name(product: str) -> str:
    if not isinstance(product, str) or not _PRODUCT.match(product) or product.endswith("."):
        raise StoreError(
            f"invalid product name {product!r}: use 1-64 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit"
        )
    return product


class TemplateStore(Protocol):
    def put(self, product: str, template_set: TemplateSet) -> int: ...

    def get(self, product: str, version: int | None = None) -> TemplateSet: ...

    def versions(self, product: str) -> list[int]: ...

    def head(self, product: str) -> int: ...

    def products(self) -> list[str]: ...
